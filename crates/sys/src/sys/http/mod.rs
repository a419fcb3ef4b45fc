//! A minimal HTTP/1.0 GET with connect/total timeouts and a body cap. HTTP/1.0 on purpose: the
//! server closes after the response and never chunks, so "read until EOF or cap" is the whole
//! protocol. A hung endpoint is `Timeout` within `total`, more than `cap` bytes `TooLarge`;
//! names are resolved on a thread nobody waits for ([`resolve`]); a caller's [`Connector`]
//! ([`get_using`]) reaches inside another network namespace.

mod connect;
mod resolve;
mod response;

pub use connect::Connector;

pub use resolve::{system as system_resolver, Resolver, MAX_PENDING as MAX_PENDING_LOOKUPS};
pub use response::{parse_response, Parsed, MAX_HEADER};

use crate::model::FetchOutcome;
use response::{content_length, header_end};
use std::net::SocketAddr;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use url::Url;

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

/// Where one GET goes: parsed once with the one URL type ([`url::Url`]).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Target {
    /// `host:port` to connect to (IPv6 in brackets; the port defaults to 80).
    pub authority: String,
    /// Host header value (the port only when the URL names a non-default one).
    pub host: String,
    /// Path and query sent in the request line.
    pub path: String,
}

/// Parses a plain `http://` URL (the only scheme the scraped endpoints speak); the port
/// defaults to 80.
fn parse_url(raw: &str) -> Result<Target, String> {
    if !raw.starts_with("http://") {
        return Err(format!("{raw}: only http:// URLs are supported"));
    }
    // The url crate reads `http:///x` as host `x`; a URL without a host is refused here.
    if raw["http://".len()..].starts_with('/') {
        return Err(format!("{raw}: no host"));
    }
    let url = Url::parse(raw).map_err(|e| format!("{raw}: {e}"))?;
    let host = url
        .host_str()
        .filter(|h| !h.is_empty())
        .ok_or_else(|| format!("{raw}: no host"))?;
    let port = url.port_or_known_default().unwrap_or(80);
    let path = &url[url::Position::BeforePath..url::Position::AfterQuery];
    Ok(Target {
        authority: format!("{host}:{port}"),
        host: match url.port() {
            Some(p) => format!("{host}:{p}"),
            None => host.to_string(),
        },
        path: if path.is_empty() { "/" } else { path }.to_string(),
    })
}

/// GET `url` within `limits`. Returns within `limits.total` (plus scheduling noise) whatever
/// the server or the resolver does.
pub async fn get(url: &str, limits: Limits) -> Response {
    get_via(url, limits, resolve::system).await
}

/// [`get`] with an `Authorization` header (a router's own API key, sent back to that router
/// only). The header value is never part of a detail.
pub async fn get_authorized(url: &str, limits: Limits, authorization: &str) -> Response {
    let route = Route {
        resolver: resolve::system,
        connector: None,
        authorization: Some(authorization),
    };
    get_with(url, limits, route).await
}

/// [`get`] with another resolver (tests: one that hangs).
pub async fn get_via(url: &str, limits: Limits, resolver: Resolver) -> Response {
    get_using(url, limits, resolver, None).await
}

/// [`get_via`] whose TCP connection is made by `connector` (None: from this process, by
/// tokio). The seam for scraping from inside another network namespace.
pub async fn get_using(
    url: &str,
    limits: Limits,
    resolver: Resolver,
    connector: Option<Connector>,
) -> Response {
    let route = Route {
        resolver,
        connector,
        authorization: None,
    };
    get_with(url, limits, route).await
}

// --- netns ---

/// [`get`] with every part of the route given: the resolver and connector of a component in a
/// container ([`crate::sys::netns::route`]) and, for a router, its own key (see
/// [`get_authorized`]).
pub async fn get_routed(
    url: &str,
    limits: Limits,
    (resolver, connector): (Resolver, Option<Connector>),
    authorization: Option<&str>,
) -> Response {
    let route = Route {
        resolver,
        connector,
        authorization,
    };
    get_with(url, limits, route).await
}

// --- end netns ---

/// How one GET reaches its server: who resolves the name, who makes the connection, and
/// the credential it carries (a router's own key; never part of a detail).
struct Route<'a> {
    resolver: Resolver,
    connector: Option<Connector>,
    authorization: Option<&'a str>,
}

async fn get_with(url: &str, limits: Limits, route: Route<'_>) -> Response {
    let start = Instant::now();
    let parsed = match parse_url(url) {
        Ok(u) => u,
        Err(e) => return finish(start, FetchOutcome::Error, None, Vec::new(), Some(e)),
    };
    let mut raw = Vec::new();
    let work = fetch(&parsed, limits, route, &mut raw);
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
    get_blocking_with(url, limits, None)
}

/// [`get_blocking`] with an `Authorization` value (see [`get_authorized`]).
pub fn get_blocking_with(url: &str, limits: Limits, authorization: Option<String>) -> Response {
    get_blocking_routed(url, limits, (resolve::system, None), authorization)
}

/// [`get_blocking_with`] through a given route (netns: a component in a container, see
/// [`get_routed`]).
pub fn get_blocking_routed(
    url: &str,
    limits: Limits,
    (resolver, connector): (Resolver, Option<Connector>),
    authorization: Option<String>,
) -> Response {
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
                Ok(rt) => {
                    let route = Route {
                        resolver,
                        connector,
                        authorization: authorization.as_deref(),
                    };
                    rt.block_on(get_with(&owned, limits, route))
                }
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
    url: &Target,
    limits: Limits,
    resolver: Resolver,
    connector: Option<Connector>,
) -> Result<TcpStream, Failure> {
    let addrs = resolve::resolve(&url.authority, limits.connect, resolver)
        .await
        .map_err(|e| (FetchOutcome::Error, e))?;
    let mut last = (
        FetchOutcome::Error,
        format!("{}: no address", url.authority),
    );
    for sa in addrs {
        let attempt = match &connector {
            Some(c) => connect::via(c, sa, limits.connect).await,
            None => connect_one(sa, limits.connect).await,
        };
        last = match attempt {
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
    url: &Target,
    limits: Limits,
    route: Route<'_>,
    raw: &mut Vec<u8>,
) -> Result<(), Failure> {
    let mut stream = connect(url, limits, route.resolver, route.connector).await?;
    // A value with a line break would smuggle headers: such a header is not sent at all.
    let auth = route
        .authorization
        .filter(|a| !a.contains(['\r', '\n']))
        .map(|a| format!("Authorization: {a}\r\n"))
        .unwrap_or_default();
    let req = format!(
        "GET {} HTTP/1.0\r\nHost: {}\r\nUser-Agent: wedgewatch\r\nAccept: */*\r\n{auth}Connection: close\r\n\r\n",
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
            // Past the cap (one byte over says `TooLarge`), or all Content-Length bytes in.
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
        let u = parse_url("http://u:p@127.0.0.1:29000/m?x=1#f").unwrap();
        assert_eq!(
            (u.authority.as_str(), u.path.as_str()),
            ("127.0.0.1:29000", "/m?x=1")
        );
    }

    #[tokio::test]
    async fn a_supplied_connector_makes_the_connection_and_cannot_hang_the_get() {
        use std::io::{Read, Write};
        use std::sync::atomic::{AtomicBool, Ordering};
        use std::sync::Arc;
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        std::thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            let mut buf = [0u8; 1024];
            let _ = s.read(&mut buf);
            let _ = s.write_all(b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok");
        });
        let used = Arc::new(AtomicBool::new(false));
        let seen = Arc::clone(&used);
        let direct: Connector = Arc::new(move |sa, within| {
            seen.store(true, Ordering::SeqCst);
            std::net::TcpStream::connect_timeout(&sa, within)
        });
        let url = format!("http://127.0.0.1:{port}/x");
        let r = get_using(&url, Limits::default(), resolve::system, Some(direct)).await;
        assert_eq!(
            (r.outcome, r.body.as_slice()),
            (FetchOutcome::Ok, &b"ok"[..])
        );
        assert!(used.load(Ordering::SeqCst));

        // Hangs past the bound asserted (nobody waits for its thread).
        let hangs: Connector = Arc::new(|_, _| {
            std::thread::sleep(Duration::from_secs(15));
            Err(std::io::Error::other("late"))
        });
        let limits = Limits {
            connect: Duration::from_millis(100),
            ..Limits::default()
        };
        let t = Instant::now();
        let r = get_using("http://127.0.0.1:9/", limits, resolve::system, Some(hangs)).await;
        assert_eq!(r.outcome, FetchOutcome::Timeout, "{r:?}");
        let bound = wedgewatch_model::clock::test_bound(limits.connect);
        assert!(t.elapsed() < bound, "{:?}", t.elapsed());
    }
}
