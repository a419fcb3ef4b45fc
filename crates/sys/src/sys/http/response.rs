//! Reading an HTTP/1.x answer from the bytes received: pure, so a fuzz target can call it.
//!
//! The status line and headers must be complete (and under [`MAX_HEADER`]); the body ends at
//! `Content-Length` when given, is de-chunked when the server chunked it anyway, and is cut at
//! the cap (`TooLarge`, the first `cap` bytes kept).

use crate::model::FetchOutcome;

/// Largest header block accepted.
pub const MAX_HEADER: usize = 64 * 1024;

/// What the bytes of one answer say. Never an error: the outcome says what went wrong.
#[derive(Debug, Clone, PartialEq)]
pub struct Parsed {
    pub outcome: FetchOutcome,
    pub status: Option<u16>,
    /// The body (at most `cap` bytes), without headers.
    pub body: Vec<u8>,
    /// Human-readable detail for anything but `Ok`.
    pub detail: Option<String>,
}

impl Parsed {
    fn failed(detail: String) -> Self {
        Parsed {
            outcome: FetchOutcome::Error,
            status: None,
            body: Vec::new(),
            detail: Some(detail),
        }
    }
}

/// Interprets `raw` (status line, headers, body as received; the stream may have ended
/// early). `cap`: maximum body bytes kept. Never panics.
pub fn parse_response(raw: &[u8], cap: usize) -> Parsed {
    let Some(h) = header_end(raw) else {
        return Parsed::failed(if raw.len() > MAX_HEADER {
            format!("response header block larger than {MAX_HEADER} bytes")
        } else {
            format!(
                "connection closed before a complete header ({} bytes)",
                raw.len()
            )
        });
    };
    if h > MAX_HEADER {
        return Parsed::failed(format!(
            "response header block larger than {MAX_HEADER} bytes"
        ));
    }
    let Some(status) = parse_status(raw) else {
        return Parsed::failed("malformed status line".into());
    };
    let head = &raw[..h];
    let mut body = &raw[h..];
    if let Some(cl) = content_length(head) {
        body = &body[..body.len().min(cl)];
    }
    let (mut outcome, mut detail) = if (200..300).contains(&status) {
        (FetchOutcome::Ok, None)
    } else {
        (
            FetchOutcome::HttpError,
            Some(format!("HTTP status {status}")),
        )
    };
    let mut body = body.to_vec();
    if body.len() > cap {
        body.truncate(cap);
        if outcome == FetchOutcome::Ok {
            outcome = FetchOutcome::TooLarge;
            detail = Some(format!("body larger than the {cap} byte cap"));
        }
    } else if is_chunked(head) {
        // We ask for HTTP/1.0, but a non-compliant server may still chunk its answer.
        match dechunk(&body) {
            Some(b) => body = b,
            None if outcome == FetchOutcome::Ok => {
                outcome = FetchOutcome::Error;
                detail = Some("malformed chunked body".into());
            }
            None => {}
        }
    }
    Parsed {
        outcome,
        status: Some(status),
        body,
        detail,
    }
}

/// Offset of the first body byte, if the header block is complete.
pub(crate) fn header_end(raw: &[u8]) -> Option<usize> {
    raw.windows(4).position(|w| w == b"\r\n\r\n").map(|i| i + 4)
}

/// `Content-Length` of a header block, if present and a number.
pub(crate) fn content_length(head: &[u8]) -> Option<usize> {
    header_value(head, "content-length").and_then(|v| v.trim().parse::<usize>().ok())
}

/// Whether the response headers say `Transfer-Encoding: chunked`.
fn is_chunked(head: &[u8]) -> bool {
    header_value(head, "transfer-encoding")
        .is_some_and(|v| v.to_ascii_lowercase().contains("chunked"))
}

/// The value of header `name` (case-insensitive) in a header block.
fn header_value(head: &[u8], name: &str) -> Option<String> {
    String::from_utf8_lossy(head).lines().skip(1).find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.trim()
            .eq_ignore_ascii_case(name)
            .then(|| v.trim().to_string())
    })
}

/// Decodes a complete chunked body; None when it is malformed or incomplete.
fn dechunk(mut b: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(b.len());
    loop {
        let line_end = b.windows(2).position(|w| w == b"\r\n")?;
        let size_str = std::str::from_utf8(&b[..line_end]).ok()?;
        let size_hex = size_str.split(';').next()?.trim();
        let size = usize::from_str_radix(size_hex, 16).ok()?;
        b = &b[line_end + 2..];
        if size == 0 {
            return Some(out);
        }
        if b.len() < size.checked_add(2)? {
            return None;
        }
        out.extend_from_slice(&b[..size]);
        b = &b[size + 2..];
    }
}

fn parse_status(raw: &[u8]) -> Option<u16> {
    let line_end = raw.iter().position(|&b| b == b'\n')?;
    let line = std::str::from_utf8(&raw[..line_end]).ok()?;
    let mut parts = line.split_whitespace();
    let proto = parts.next()?;
    if !proto.starts_with("HTTP/") {
        return None;
    }
    parts.next()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dechunks() {
        let raw = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n";
        assert!(is_chunked(raw));
        assert!(!is_chunked(
            b"HTTP/1.0 200 OK\r\nContent-Length: 3\r\n\r\nabc"
        ));
        assert_eq!(
            dechunk(b"3\r\nabc\r\n2;x=y\r\nde\r\n0\r\n\r\n").as_deref(),
            Some(&b"abcde"[..])
        );
        assert_eq!(dechunk(b"5\r\nab"), None);
        assert_eq!(dechunk(b"zz\r\n"), None);
        assert_eq!(dechunk(b"ffffffffffffffff\r\nab"), None);
    }

    #[test]
    fn parses_status_lines() {
        assert_eq!(parse_status(b"HTTP/1.1 200 OK\r\n\r\n"), Some(200));
        assert_eq!(parse_status(b"HTTP/1.0 404 Not Found\r\n"), Some(404));
        assert_eq!(parse_status(b"garbage\r\n"), None);
    }

    #[test]
    fn whole_answers() {
        let ok = parse_response(b"HTTP/1.0 200 OK\r\nContent-Length: 3\r\n\r\nabcdef", 10);
        assert_eq!((ok.outcome, ok.body), (FetchOutcome::Ok, b"abc".to_vec()));
        let big = parse_response(b"HTTP/1.0 200 OK\r\n\r\nabcdef", 4);
        assert_eq!(big.outcome, FetchOutcome::TooLarge);
        assert_eq!(big.body, b"abcd");
        let ch = parse_response(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
            100,
        );
        assert_eq!((ch.outcome, ch.body), (FetchOutcome::Ok, b"abc".to_vec()));
        let nf = parse_response(b"HTTP/1.0 404 Not Found\r\n\r\n", 10);
        assert_eq!(
            (nf.outcome, nf.status),
            (FetchOutcome::HttpError, Some(404))
        );
        for bad in [&b"HTTP/1.0 200"[..], b"garbage\r\n\r\n", b""] {
            assert_eq!(parse_response(bad, 10).outcome, FetchOutcome::Error);
        }
    }
}
