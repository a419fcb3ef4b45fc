//! The daemon's request line, parsed without trusting it: a pure function (no I/O, no
//! panics) so a fuzz target can call it. Every field is bounded here, before any handler
//! does arithmetic with it.

/// Longest request line accepted on the socket, newline included.
pub const MAX_REQUEST: usize = 256;
/// Largest window a request may ask for (a week); the model's own history bounds it further.
pub const MAX_WINDOW_S: u32 = 7 * 24 * 3600;

/// One parsed request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Request {
    /// `snapshot [SECONDS]`: requests of the last SECONDS (default: the model's window).
    Snapshot {
        window_s: Option<u32>,
    },
    /// `json [SECONDS]`: the snapshot itself (`wedgewatch.snapshot/1`), assembled and
    /// redacted by the daemon, as `wedgewatch snapshot --json` prints it.
    Json {
        window_s: Option<u32>,
    },
    /// `perfetto [SECONDS]`: the history as Chrome trace-event JSON.
    Perfetto {
        window_s: Option<u32>,
    },
    Baseline,
    Sources,
    Ping,
}

impl Request {
    /// The window asked for, in milliseconds (never overflows: at most [`MAX_WINDOW_S`]).
    pub fn window_ms(&self) -> Option<i64> {
        match self {
            Request::Snapshot { window_s }
            | Request::Json { window_s }
            | Request::Perfetto { window_s } => window_s.map(|s| i64::from(s) * 1000),
            _ => None,
        }
    }
}

/// Why a request line was refused. Shown to the client as `{error: "..."}`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProtocolError {
    #[error("request longer than {MAX_REQUEST} bytes")]
    TooLong,
    #[error("request is not UTF-8")]
    NotUtf8,
    #[error("empty request; {EXPECTED}")]
    Empty,
    #[error("unknown request {0:?}; {EXPECTED}")]
    UnknownVerb(String),
    #[error("bad window {0:?}: expected whole seconds from 1 to {MAX_WINDOW_S}")]
    BadWindow(String),
    #[error("{verb} takes no argument {extra:?}")]
    Unexpected { verb: String, extra: String },
}

const EXPECTED: &str =
    "expected snapshot [SECONDS], json [SECONDS], perfetto [SECONDS], baseline, sources or ping";

/// Shortened for error messages: a hostile client must not make the daemon echo kilobytes.
fn shown(word: &str) -> String {
    word.chars().take(32).collect()
}

/// Parses one request line (a trailing `\n` or `\r\n` is allowed).
pub fn parse_request(line: &[u8]) -> Result<Request, ProtocolError> {
    if line.len() > MAX_REQUEST {
        return Err(ProtocolError::TooLong);
    }
    let text = std::str::from_utf8(line).map_err(|_| ProtocolError::NotUtf8)?;
    let mut words = text.split_ascii_whitespace();
    let verb = words.next().ok_or(ProtocolError::Empty)?;
    let arg = words.next();
    if let Some(extra) = words.next() {
        return Err(ProtocolError::Unexpected {
            verb: shown(verb),
            extra: shown(extra),
        });
    }
    let no_arg = |r: Request| match arg {
        None => Ok(r),
        Some(a) => Err(ProtocolError::Unexpected {
            verb: shown(verb),
            extra: shown(a),
        }),
    };
    match verb {
        "snapshot" => Ok(Request::Snapshot {
            window_s: arg.map(parse_window).transpose()?,
        }),
        "json" => Ok(Request::Json {
            window_s: arg.map(parse_window).transpose()?,
        }),
        "perfetto" => Ok(Request::Perfetto {
            window_s: arg.map(parse_window).transpose()?,
        }),
        "baseline" => no_arg(Request::Baseline),
        "sources" => no_arg(Request::Sources),
        "ping" => no_arg(Request::Ping),
        other => Err(ProtocolError::UnknownVerb(shown(other))),
    }
}

fn parse_window(word: &str) -> Result<u32, ProtocolError> {
    match word.parse::<u32>() {
        Ok(s) if (1..=MAX_WINDOW_S).contains(&s) => Ok(s),
        _ => Err(ProtocolError::BadWindow(shown(word))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_requests_parse() {
        assert_eq!(
            parse_request(b"snapshot\n"),
            Ok(Request::Snapshot { window_s: None })
        );
        assert_eq!(
            parse_request(b" perfetto 300\r\n"),
            Ok(Request::Perfetto {
                window_s: Some(300)
            })
        );
        assert_eq!(
            parse_request(b"json 60\n"),
            Ok(Request::Json { window_s: Some(60) })
        );
        assert_eq!(parse_request(b"ping"), Ok(Request::Ping));
        assert_eq!(parse_request(b"baseline\n"), Ok(Request::Baseline));
        assert_eq!(parse_request(b"sources\n"), Ok(Request::Sources));
    }

    #[test]
    fn out_of_range_windows_are_refused_not_overflowed() {
        for bad in [
            "snapshot 9223372036854776",
            "snapshot 99999999999999999999999",
            "snapshot -5",
            "snapshot 0",
            "snapshot 1.5",
            "perfetto 604801",
        ] {
            let e = parse_request(bad.as_bytes()).expect_err(bad);
            assert!(matches!(e, ProtocolError::BadWindow(_)), "{bad}: {e}");
        }
        let r = parse_request(format!("snapshot {MAX_WINDOW_S}").as_bytes()).expect("max");
        assert_eq!(r.window_ms(), Some(i64::from(MAX_WINDOW_S) * 1000));
    }

    #[test]
    fn malformed_lines_are_refused_with_short_messages() {
        assert_eq!(parse_request(b""), Err(ProtocolError::Empty));
        assert_eq!(parse_request(b"\xff\xfe"), Err(ProtocolError::NotUtf8));
        assert_eq!(parse_request(&[b'a'; 300]), Err(ProtocolError::TooLong));
        assert!(matches!(
            parse_request(b"ping now"),
            Err(ProtocolError::Unexpected { .. })
        ));
        assert!(matches!(
            parse_request(b"snapshot 5 6"),
            Err(ProtocolError::Unexpected { .. })
        ));
        let long = format!("{}\n", "x".repeat(200));
        let e = parse_request(long.as_bytes()).expect_err("unknown");
        assert!(e.to_string().len() < 200, "{e}");
    }

    #[test]
    fn arbitrary_bytes_never_panic() {
        // a fixed pseudo-random stream (xorshift): deterministic, no extra crates
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let alphabet = b"snapshotperfetto 0123456789-+\n\r\t\xff\x00 ";
        for _ in 0..20_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let len = (x % 300) as usize;
            let line: Vec<u8> = (0..len)
                .map(|i| alphabet[((x >> (i % 57)) as usize + i) % alphabet.len()])
                .collect();
            if let Ok(r) = parse_request(&line) {
                assert!(r.window_ms().unwrap_or(0) <= i64::from(MAX_WINDOW_S) * 1000);
            }
        }
    }
}
