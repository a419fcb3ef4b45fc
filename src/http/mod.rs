//! A minimal HTTP/1.0 GET with connect/total timeouts and a body cap, for loopback endpoints.
//!
//! HTTP/1.0 on purpose: the server closes the connection after the response and never uses
//! chunked encoding, so "read until EOF or cap" is the whole protocol. Only plain `http://`
//! (the endpoints we scrape are on loopback or the cluster network). A hung endpoint returns
//! `Timeout` within `total`; an endpoint that sends more than `cap` bytes returns `TooLarge`
//! with the first `cap` bytes of the body. A host name is resolved under the connect timeout
//! on a thread nobody waits for ([`resolve`]), so a hung resolver cannot outlive the GET nor
//! hold the runtime at exit. The answer's bytes are read by [`parse_response`], a pure
//! function. Discovery, which is synchronous, uses the same client through [`get_blocking`].

mod resolve;
mod response;

pub use resolve::{system as system_resolver, Resolver, MAX_PENDING as MAX_PENDING_LOOKUPS};
pub use response::{parse_response, Parsed, MAX_HEADER};

use crate::model::FetchOutcome;
use crate::netns::Netns;
use response::{content_length, header_end};
use std::net::SocketAddr;
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
/// the server or the resolver does.
pub async fn get(url: &str, limits: Limits) -> Response {
    get_via(url, limits, resolve::system).await
}

/// [`get`] with another resolver (tests: one that hangs).
pub async fn get_via(url: &str, limits: Limits, resolver: Resolver) -> Response {
    get_via_in(url, limits, resolver, None).await
}

// --- netns (issue 11 item 5): connections made inside a container's network namespace ---

/// [`get`] with the connection made inside network namespace `netns` (a component in a
/// container, [`crate::netns`]); `None` is the host's namespace, as [`get`].
pub async fn get_in(url: &str, limits: Limits, netns: Option<Netns>) -> Response {
    get_via_in(url, limits, resolve::system, netns).await
}

/// [`get_blocking`] inside network namespace `netns`.
pub fn get_blocking_in(url: &str, limits: Limits, netns: Option<Netns>) -> Response {
    blocking(url, limits, netns)
}

/// A URL's address inside another namespace: an IP literal only. A name would be resolved by
/// the host's resolver, for the host's network, so it is refused rather than guessed at.
fn literal_addr(url: &Url) -> Result<SocketAddr, Failure> {
    url.authority.parse::<SocketAddr>().map_err(|_| {
        (
            FetchOutcome::Error,
            format!(
                "{}: not an IP address; names are not resolved inside another network namespace",
                url.authority
            ),
        )
    })
}

// --- end netns ---

async fn get_via_in(
    url: &str,
    limits: Limits,
    resolver: Resolver,
    netns: Option<Netns>,
) -> Response {
    let start = Instant::now();
    let parsed = match parse_url(url) {
        Ok(u) => u,
        Err(e) => return finish(start, FetchOutcome::Error, None, Vec::new(), Some(e)),
    };
    let mut raw = Vec::new();
    let work = fetch(&parsed, limits, resolver, netns, &mut raw);
    match tokio::time::timeout(limits.total, work).await {
        Ok(Err((outcome, detail))) => finish(start, outcome, None, Vec::new(), Some(detail)),
        Ok(Ok(())) => {
            let p = parse_response(&raw, limits.cap);
            finish(start, p.outcome, p.status, p.body, p.detail)
        }
        Err(_) => {
            // Keep what arrived: a partial exposition still carries its first series.
            let p = parse_response(&raw, limits.cap);
            let detail = format!(
                "no complete answer within {} ms ({} bytes received)",
                limits.total.as_millis(),
                raw.len()
            );
            finish(start, FetchOutcome::Timeout, p.status, p.body, Some(detail))
        }
    }
}

/// [`get`] for synchronous callers (discovery), on its own thread and runtime so it works
/// inside or outside an async context; returns within `limits.total` plus a margin.
pub fn get_blocking(url: &str, limits: Limits) -> Response {
    blocking(url, limits, None)
}

fn blocking(url: &str, limits: Limits, netns: Option<Netns>) -> Response {
    let start = Instant::now();
    let (tx, rx) = std::sync::mpsc::channel();
    let owned = url.to_string();
    let spawned = std::thread::Builder::new()
        .name("ww-http".into())
        .spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build();
            let r = match rt {
                Ok(rt) => rt.block_on(get_in(&owned, limits, netns)),
                Err(e) => finish(
                    start,
                    FetchOutcome::Error,
                    None,
                    Vec::new(),
                    Some(format!("no runtime: {e}")),
                ),
            };
            let _ = tx.send(r);
        });
    let failed =
        |detail: String| finish(start, FetchOutcome::Error, None, Vec::new(), Some(detail));
    if let Err(e) = spawned {
        return failed(format!("no thread: {e}"));
    }
    match rx.recv_timeout(limits.total + Duration::from_millis(500)) {
        Ok(r) => r,
        Err(_) => finish(
            start,
            FetchOutcome::Timeout,
            None,
            Vec::new(),
            Some(format!("no answer within {} ms", limits.total.as_millis())),
        ),
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

type Failure = (FetchOutcome, String);

/// Resolves (under the connect timeout) and connects to the first address that answers.
async fn connect(
    url: &Url,
    limits: Limits,
    resolver: Resolver,
    netns: Option<Netns>,
) -> Result<TcpStream, Failure> {
    if let Some(ns) = netns {
        let sa = literal_addr(url)?;
        return crate::netns::connect(ns, sa, limits.connect)
            .await
            .map_err(|e| match e {
                crate::netns::NetnsError::Timeout { .. } => (FetchOutcome::Timeout, e.to_string()),
                _ if e.is_refused() => (FetchOutcome::Refused, e.to_string()),
                _ => (FetchOutcome::Error, e.to_string()),
            });
    }
    let addrs = resolve::resolve(&url.authority, limits.connect, resolver)
        .await
        .map_err(|e| (FetchOutcome::Error, e))?;
    let mut last = (
        FetchOutcome::Error,
        format!("{}: no address", url.authority),
    );
    for sa in addrs {
        last = match connect_one(sa, limits.connect).await {
            Ok(s) => return Ok(s),
            Err(f) => f,
        };
    }
    Err(last)
}

async fn connect_one(sa: SocketAddr, within: Duration) -> Result<TcpStream, Failure> {
    match tokio::time::timeout(within, TcpStream::connect(sa)).await {
        Err(_) => Err((
            FetchOutcome::Timeout,
            format!("connect to {sa} timed out after {} ms", within.as_millis()),
        )),
        Ok(Err(e)) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
            Err((FetchOutcome::Refused, format!("connect to {sa}: {e}")))
        }
        Ok(Err(e)) => Err((FetchOutcome::Error, format!("connect to {sa}: {e}"))),
        Ok(Ok(s)) => Ok(s),
    }
}

/// Connect, send, read until EOF, cap or `Content-Length`. Writes what it got into `raw` so a
/// timeout still keeps the partial answer; [`parse_response`] reads it afterwards.
async fn fetch(
    url: &Url,
    limits: Limits,
    resolver: Resolver,
    netns: Option<Netns>,
    raw: &mut Vec<u8>,
) -> Result<(), Failure> {
    let mut stream = connect(url, limits, resolver, netns).await?;
    let req = format!(
        "GET {} HTTP/1.0\r\nHost: {}\r\nUser-Agent: wedgewatch\r\nAccept: */*\r\nConnection: close\r\n\r\n",
        url.path, url.host
    );
    if let Err(e) = stream.write_all(req.as_bytes()).await {
        return Err((FetchOutcome::Error, format!("send request: {e}")));
    }
    let mut chunk = vec![0u8; 64 * 1024];
    let mut head: Option<(usize, Option<usize>)> = None;
    loop {
        let n = match stream.read(&mut chunk).await {
            Ok(0) => return Ok(()),
            Ok(n) => n,
            // A reset after a complete header block still leaves a usable answer.
            Err(_) if head.is_some() => return Ok(()),
            Err(e) => return Err((FetchOutcome::Error, format!("read response: {e}"))),
        };
        raw.extend_from_slice(&chunk[..n]);
        if head.is_none() {
            head = header_end(raw).map(|h| (h, content_length(&raw[..h])));
            if head.is_none() && raw.len() > MAX_HEADER {
                return Ok(());
            }
        }
        if let Some((h, cl)) = head {
            let body = raw.len() - h;
            // Past the cap (one byte over says `TooLarge`), or a server that keeps the
            // connection open despite `Connection: close` but has sent Content-Length bytes.
            if body > limits.cap || cl.is_some_and(|cl| body >= cl) {
                raw.truncate(h + body.min(limits.cap.saturating_add(1)));
                return Ok(());
            }
        }
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
}
