//! A minimal HTTP/1.0 GET with connect/total timeouts and a body cap, for loopback endpoints.
//!
//! HTTP/1.0 on purpose: the server closes the connection after the response and never uses
//! chunked encoding, so "read until EOF or cap" is the whole protocol. Only plain `http://`
//! (the endpoints we scrape are on loopback or the cluster network). A hung endpoint returns
//! `Timeout` within `total`; an endpoint that sends more than `cap` bytes returns `TooLarge`
//! with the first `cap` bytes of the body.

use crate::model::FetchOutcome;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Timeouts and size cap of one GET.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    pub connect: Duration,
    /// Whole request: connect + send + read, so a slow drip cannot hold us.
    pub total: Duration,
    /// Maximum body bytes kept; more is `TooLarge`.
    pub cap: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            connect: Duration::from_millis(300),
            total: Duration::from_millis(1500),
            cap: 8 * 1024 * 1024,
        }
    }
}

/// What one GET produced. Never an error: the outcome says what went wrong.
#[derive(Debug, Clone, PartialEq)]
pub struct Response {
    pub outcome: FetchOutcome,
    pub status: Option<u16>,
    /// The body (possibly partial on `Timeout`/`TooLarge`), without headers.
    pub body: Vec<u8>,
    pub elapsed: Duration,
    /// Human-readable detail for anything but `Ok`.
    pub detail: Option<String>,
}

/// The parts of an `http://host:port/path` URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Url {
    /// `host:port` to connect to (IPv6 in brackets).
    pub authority: String,
    /// Host header value.
    pub host: String,
    pub path: String,
}

/// Parses a plain `http://` URL; the port defaults to 80.
pub fn parse_url(url: &str) -> Result<Url, String> {
    let rest = url
        .strip_prefix("http://")
        .ok_or_else(|| format!("{url}: only http:// URLs are supported"))?;
    let (auth, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    if auth.is_empty() {
        return Err(format!("{url}: no host"));
    }
    let has_port = if auth.starts_with('[') {
        auth.contains("]:")
    } else {
        auth.contains(':')
    };
    let authority = if has_port {
        auth.to_string()
    } else {
        format!("{auth}:80")
    };
    Ok(Url {
        authority,
        host: auth.to_string(),
        path: path.to_string(),
    })
}

/// GET `url` within `limits`. Returns within `limits.total` (plus scheduling noise) whatever
/// the server does.
pub async fn get(url: &str, limits: Limits) -> Response {
    let start = Instant::now();
    let parsed = match parse_url(url) {
        Ok(u) => u,
        Err(e) => return finish(start, FetchOutcome::Error, None, Vec::new(), Some(e)),
    };
    let mut partial = Vec::new();
    let mut status = None;
    let work = fetch(&parsed, limits, &mut partial, &mut status);
    match tokio::time::timeout(limits.total, work).await {
        Ok(r) => {
            let (mut outcome, mut detail) = r;
            let mut body = split_body(&partial).unwrap_or_default();
            // We ask for HTTP/1.0, but a non-compliant server may still chunk its answer.
            if is_chunked(&partial) && outcome == FetchOutcome::Ok {
                match dechunk(&body) {
                    Some(b) => body = b,
                    None => {
                        outcome = FetchOutcome::Error;
                        detail = Some("malformed chunked body".into());
                    }
                }
            }
            finish(start, outcome, status, body, detail)
        }
        Err(_) => {
            let body = split_body(&partial).unwrap_or_default();
            let detail = format!(
                "no complete answer within {} ms ({} bytes received)",
                limits.total.as_millis(),
                partial.len()
            );
            finish(start, FetchOutcome::Timeout, status, body, Some(detail))
        }
    }
}

fn finish(
    start: Instant,
    outcome: FetchOutcome,
    status: Option<u16>,
    body: Vec<u8>,
    detail: Option<String>,
) -> Response {
    Response {
        outcome,
        status,
        body,
        elapsed: start.elapsed(),
        detail,
    }
}

/// The body after the header block, if the header block is complete.
pub fn split_body(raw: &[u8]) -> Option<Vec<u8>> {
    let end = find_header_end(raw)?;
    Some(raw[end..].to_vec())
}

/// Whether the response headers say `Transfer-Encoding: chunked`.
pub fn is_chunked(raw: &[u8]) -> bool {
    let Some(end) = find_header_end(raw) else {
        return false;
    };
    header_value(&raw[..end], "transfer-encoding")
        .is_some_and(|v| v.to_ascii_lowercase().contains("chunked"))
}

/// The value of header `name` (lowercase) in a header block.
pub fn header_value(head: &[u8], name: &str) -> Option<String> {
    String::from_utf8_lossy(head).lines().skip(1).find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.trim()
            .eq_ignore_ascii_case(name)
            .then(|| v.trim().to_string())
    })
}

/// Decodes a complete chunked body; None when it is malformed or incomplete.
pub fn dechunk(mut b: &[u8]) -> Option<Vec<u8>> {
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

pub fn find_header_end(raw: &[u8]) -> Option<usize> {
    raw.windows(4).position(|w| w == b"\r\n\r\n").map(|i| i + 4)
}

pub fn parse_status(raw: &[u8]) -> Option<u16> {
    let line_end = raw.iter().position(|&b| b == b'\n')?;
    let line = std::str::from_utf8(&raw[..line_end]).ok()?;
    let mut parts = line.split_whitespace();
    let proto = parts.next()?;
    if !proto.starts_with("HTTP/") {
        return None;
    }
    parts.next()?.parse().ok()
}

/// Connect, send, read until EOF or cap. Writes what it got into `buf` so a timeout still
/// keeps the partial answer.
async fn fetch(
    url: &Url,
    limits: Limits,
    buf: &mut Vec<u8>,
    status: &mut Option<u16>,
) -> (FetchOutcome, Option<String>) {
    let connect = tokio::time::timeout(limits.connect, TcpStream::connect(&url.authority)).await;
    let mut stream = match connect {
        Err(_) => {
            return (
                FetchOutcome::Timeout,
                Some(format!(
                    "connect to {} timed out after {} ms",
                    url.authority,
                    limits.connect.as_millis()
                )),
            )
        }
        Ok(Err(e)) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
            return (
                FetchOutcome::Refused,
                Some(format!("connect to {}: {e}", url.authority)),
            )
        }
        Ok(Err(e)) => {
            return (
                FetchOutcome::Error,
                Some(format!("connect to {}: {e}", url.authority)),
            )
        }
        Ok(Ok(s)) => s,
    };
    let req = format!(
        "GET {} HTTP/1.0\r\nHost: {}\r\nUser-Agent: wedgewatch\r\nAccept: */*\r\nConnection: close\r\n\r\n",
        url.path, url.host
    );
    if let Err(e) = stream.write_all(req.as_bytes()).await {
        return (FetchOutcome::Error, Some(format!("send request: {e}")));
    }
    let mut chunk = vec![0u8; 64 * 1024];
    let mut header_end: Option<usize> = None;
    let mut content_length: Option<usize> = None;
    loop {
        let n = match stream.read(&mut chunk).await {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) => {
                // A reset after a complete header block still leaves a usable answer.
                if header_end.is_none() {
                    return (FetchOutcome::Error, Some(format!("read response: {e}")));
                }
                break;
            }
        };
        buf.extend_from_slice(&chunk[..n]);
        if header_end.is_none() {
            header_end = find_header_end(buf);
            if let Some(h) = header_end {
                *status = parse_status(buf);
                content_length = header_value(&buf[..h], "content-length")
                    .and_then(|v| v.trim().parse::<usize>().ok());
            } else if buf.len() > 64 * 1024 {
                return (
                    FetchOutcome::Error,
                    Some("response header block larger than 64 KiB".into()),
                );
            }
        }
        if let Some(h) = header_end {
            if buf.len() - h > limits.cap {
                buf.truncate(h + limits.cap);
                return (
                    FetchOutcome::TooLarge,
                    Some(format!("body larger than the {} byte cap", limits.cap)),
                );
            }
            // A server that keeps the connection open despite `Connection: close` has
            // still answered completely once Content-Length bytes are in.
            if content_length.is_some_and(|cl| buf.len() - h >= cl) {
                break;
            }
        }
    }
    let Some(_) = header_end else {
        return (
            FetchOutcome::Error,
            Some(format!(
                "connection closed before a complete header ({} bytes)",
                buf.len()
            )),
        );
    };
    match *status {
        None => (FetchOutcome::Error, Some("malformed status line".into())),
        Some(s) if (200..300).contains(&s) => (FetchOutcome::Ok, None),
        Some(s) => (FetchOutcome::HttpError, Some(format!("HTTP status {s}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_urls() {
        let u = parse_url("http://127.0.0.1:29000/metrics").unwrap();
        assert_eq!(u.authority, "127.0.0.1:29000");
        assert_eq!(u.path, "/metrics");
        let u = parse_url("http://[::1]:8080").unwrap();
        assert_eq!(u.authority, "[::1]:8080");
        assert_eq!(u.path, "/");
        let u = parse_url("http://example").unwrap();
        assert_eq!(u.authority, "example:80");
        assert!(parse_url("https://x/").is_err());
        assert!(parse_url("http:///x").is_err());
    }

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
}
