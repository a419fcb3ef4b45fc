//! `wedgewatch daemon --metrics-listen ADDR`: `GET /metrics` (rendered by `export::prometheus`)
//! on a small HTTP/1.1 listener. A scrape renders what the daemon already has (the newest
//! published [`Evaluation`] and the sampler's stats): no sampling, detector pass or model lock
//! per scrape.
//!
//! Clients are strangers: a head is read up to [`MAX_HEAD`] bytes within [`READ_TIMEOUT`], the
//! answer written within [`WRITE_TIMEOUT`], one request a connection. At most [`MAX_CLIENTS`]
//! are held ([`Clients`]); one past the cap sheds the oldest that has not sent its head (so
//! silent connections cannot lock scrapers out), and is closed only when every slot is
//! answering. Anything but `GET /metrics` gets a 4xx.

use crate::clock::{Clock, Millis};
use crate::error::{Error, Result};
use crate::export::prometheus::{self, Evaluation, SourceHealth};
use crate::sampler::StatsHandle;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// The latest evaluation, shared by the watch task (writer) and the scrapes (readers).
pub type Published = Arc<Mutex<Option<Evaluation>>>;

/// Largest request head read (request line and headers).
pub const MAX_HEAD: usize = 8 * 1024;
/// How long a client may take to send its request head.
pub const READ_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a client may take to read the answer.
pub const WRITE_TIMEOUT: Duration = Duration::from_secs(10);
/// Connections served at once.
pub const MAX_CLIENTS: usize = 16;

/// What a request head asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    Metrics,
    NotFound,
    MethodNotAllowed,
    BadRequest,
    TooLarge,
}

impl Route {
    fn status_line(self) -> &'static str {
        match self {
            Route::Metrics => "200 OK",
            Route::NotFound => "404 Not Found",
            Route::MethodNotAllowed => "405 Method Not Allowed",
            Route::BadRequest => "400 Bad Request",
            Route::TooLarge => "431 Request Header Fields Too Large",
        }
    }
}

/// The route of a request head (everything up to the blank line, or what arrived). Pure:
/// no I/O, never panics.
pub fn route(head: &[u8]) -> Route {
    if head.len() > MAX_HEAD {
        return Route::TooLarge;
    }
    let line = head.split(|&b| b == b'\n').next().unwrap_or_default();
    let Ok(line) = std::str::from_utf8(line) else {
        return Route::BadRequest;
    };
    let mut words = line.trim_end_matches('\r').split(' ');
    let (Some(method), Some(target), Some(version), None) =
        (words.next(), words.next(), words.next(), words.next())
    else {
        return Route::BadRequest;
    };
    if !version.starts_with("HTTP/1.") || !target.starts_with('/') {
        return Route::BadRequest;
    }
    let path = target.split('?').next().unwrap_or_default();
    match (method, path) {
        ("GET", "/metrics") => Route::Metrics,
        (_, "/metrics") => Route::MethodNotAllowed,
        _ => Route::NotFound,
    }
}

/// Whether `head` holds a complete request head (ends with a blank line).
fn head_complete(head: &[u8]) -> bool {
    head.windows(4).any(|w| w == b"\r\n\r\n") || head.windows(2).any(|w| w == b"\n\n")
}

/// A request head as it arrives. The blank line is looked for only in the new bytes (and the
/// three before them): a head dribbled a byte at a time costs linear time, not quadratic.
#[derive(Debug, Default)]
pub struct Head {
    bytes: Vec<u8>,
    complete: bool,
}

impl Head {
    /// Appends what arrived.
    pub fn push(&mut self, chunk: &[u8]) {
        let from = self.bytes.len().saturating_sub(3);
        self.bytes.extend_from_slice(chunk);
        self.complete = self.complete || head_complete(&self.bytes[from..]);
    }

    /// Whether reading may stop: the head is complete, or already too large.
    pub fn done(&self) -> bool {
        self.complete || self.bytes.len() > MAX_HEAD
    }

    /// The route of what the client sent before it stopped: a head cut short (closed, or
    /// read until its deadline) is a bad request whatever its first line says.
    pub fn route(&self) -> Route {
        if self.done() {
            route(&self.bytes)
        } else {
            Route::BadRequest
        }
    }
}

/// Binds the listener (an address in use is an error the daemon reports at start).
pub async fn bind(addr: SocketAddr) -> Result<TcpListener> {
    TcpListener::bind(addr)
        .await
        .map_err(|e| Error::Other(format!("--metrics-listen {addr}: {e}")))
}

/// The sampler's stats as the exporter's source health.
pub fn health(stats: &StatsHandle) -> Vec<SourceHealth> {
    let Ok(st) = stats.lock() else {
        return Vec::new();
    };
    st.values()
        .map(|s| SourceHealth {
            source: s.kind,
            status: s.last_t_ms.map(|_| s.status.status),
            last_sample_ms: s.last_t_ms,
            every_ms: s.every_ms,
            took_ms: s.took_ms,
            samples: s.samples,
            late: s.late,
            dropped: s.dropped,
            timeouts: s.timeouts,
        })
        .collect()
}

/// One scrape's body at `now`.
pub fn scrape(published: &Published, stats: &StatsHandle, now: Millis) -> String {
    let sources = health(stats);
    let evaluation = published.lock().map(|e| e.clone()).unwrap_or_default();
    prometheus::render(
        evaluation.as_ref(),
        &sources,
        now,
        env!("CARGO_PKG_VERSION"),
    )
}

/// The connections being served: each one's start, whether it is still reading its head
/// (idle: may be shed), and the handle that drops it.
#[derive(Default)]
struct Clients {
    next: u64,
    held: std::collections::BTreeMap<u64, Held>,
}

struct Held {
    reading: Arc<std::sync::atomic::AtomicBool>,
    task: tokio::task::AbortHandle,
}

type ClientTable = Arc<Mutex<Clients>>;

impl Clients {
    /// Room for one more: true when under the cap, or once the oldest idle connection (the
    /// lowest id still reading its head) has been dropped to make room.
    fn make_room(&mut self) -> bool {
        if self.held.len() < MAX_CLIENTS {
            return true;
        }
        let idle = self
            .held
            .iter()
            .find(|(_, h)| h.reading.load(Ordering::Acquire));
        let Some(id) = idle.map(|(id, _)| *id) else {
            return false;
        };
        if let Some(h) = self.held.remove(&id) {
            h.task.abort();
        }
        true
    }
}

/// Removes its connection from the table when the connection's task ends or is aborted.
struct Release(ClientTable, u64);

impl Drop for Release {
    fn drop(&mut self) {
        if let Ok(mut t) = self.0.lock() {
            t.held.remove(&self.1);
        }
    }
}

/// Serves scrapes until the task is aborted.
pub async fn serve(
    listener: TcpListener,
    published: Published,
    stats: StatsHandle,
    clock: Arc<dyn Clock>,
) {
    let table = ClientTable::default();
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            // e.g. out of fds: back off instead of spinning.
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        let Ok(mut t) = table.lock() else { return };
        if !t.make_room() {
            continue; // every slot is answering: this one is closed unanswered
        }
        let id = t.next;
        t.next += 1;
        let reading = Arc::new(AtomicBool::new(true));
        let release = Release(table.clone(), id);
        let (published, stats, clock) = (published.clone(), stats.clone(), clock.clone());
        let flag = reading.clone();
        let task = tokio::spawn(async move {
            let _release = release;
            let _ = answer(stream, &flag, &published, &stats, clock.as_ref()).await;
        });
        t.held.insert(
            id,
            Held {
                reading,
                task: task.abort_handle(),
            },
        );
    }
}

/// Reads a request head: up to the blank line, [`MAX_HEAD`] + 1 bytes at most.
async fn read_head(stream: &mut TcpStream) -> std::io::Result<Head> {
    let mut head = Head::default();
    let mut buf = [0u8; 1024];
    while !head.done() {
        let n = stream.read(&mut buf).await?;
        if n == 0 {
            break;
        }
        head.push(&buf[..n]);
    }
    Ok(head)
}

async fn answer(
    mut stream: TcpStream,
    reading: &AtomicBool,
    published: &Published,
    stats: &StatsHandle,
    clock: &dyn Clock,
) -> std::io::Result<()> {
    let head = tokio::time::timeout(READ_TIMEOUT, read_head(&mut stream))
        .await
        .map_err(|_| std::io::ErrorKind::TimedOut)??;
    reading.store(false, Ordering::Release);
    let r = head.route();
    let (content_type, body) = match r {
        Route::Metrics => (
            prometheus::CONTENT_TYPE,
            scrape(published, stats, clock.now_ms()),
        ),
        other => (
            "text/plain; charset=utf-8",
            format!(
                "{}: wedgewatch serves GET /metrics only\n",
                other.status_line()
            ),
        ),
    };
    let allow = if r == Route::MethodNotAllowed {
        "Allow: GET\r\n"
    } else {
        ""
    };
    let mut out = format!(
        "HTTP/1.1 {}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\n{allow}Connection: close\r\n\r\n",
        r.status_line(),
        body.len()
    )
    .into_bytes();
    out.extend_from_slice(body.as_bytes());
    let write = async {
        stream.write_all(&out).await?;
        stream.shutdown().await
    };
    tokio::time::timeout(WRITE_TIMEOUT, write)
        .await
        .map_err(|_| std::io::ErrorKind::TimedOut)?
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_get_metrics_is_routed_to_the_exposition() {
        let r = |s: &str| route(s.as_bytes());
        assert_eq!(
            r("GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"),
            Route::Metrics
        );
        assert_eq!(r("GET /metrics?x=1 HTTP/1.0\r\n\r\n"), Route::Metrics);
        assert_eq!(r("POST /metrics HTTP/1.1\r\n\r\n"), Route::MethodNotAllowed);
        assert_eq!(r("HEAD /metrics HTTP/1.1\r\n\r\n"), Route::MethodNotAllowed);
        assert_eq!(r("GET / HTTP/1.1\r\n\r\n"), Route::NotFound);
        assert_eq!(r("GET /metricsx HTTP/1.1\r\n\r\n"), Route::NotFound);
        assert_eq!(r("GET /metrics\r\n\r\n"), Route::BadRequest);
        assert_eq!(r("GET metrics HTTP/1.1\r\n\r\n"), Route::BadRequest);
        assert_eq!(r("GET  /metrics HTTP/1.1\r\n\r\n"), Route::BadRequest);
        assert_eq!(r("SSH-2.0-OpenSSH_9.2\r\n\r\n"), Route::BadRequest);
        assert_eq!(route(b"GET /metrics \xff\xfe\r\n\r\n"), Route::BadRequest);
        assert_eq!(route(b""), Route::BadRequest);
        let mut big = b"GET /metrics HTTP/1.1\r\nX: ".to_vec();
        big.resize(MAX_HEAD + 1, b'a');
        assert_eq!(route(&big), Route::TooLarge);
    }

    #[test]
    fn a_head_is_complete_at_its_blank_line() {
        assert!(head_complete(b"GET / HTTP/1.1\r\nA: b\r\n\r\n"));
        assert!(head_complete(b"GET / HTTP/1.1\n\n"));
        assert!(!head_complete(b"GET / HTTP/1.1\r\nA: b\r\n"));
    }

    #[test]
    fn a_head_arriving_a_byte_at_a_time_is_complete_at_its_blank_line() {
        let mut h = Head::default();
        for b in b"GET /metrics HTTP/1.1\r\nA: b\r\n\r" {
            h.push(&[*b]);
            assert!(!h.done());
        }
        assert_eq!(h.route(), Route::BadRequest, "cut short");
        h.push(b"\n");
        assert!(h.done());
        assert_eq!(h.route(), Route::Metrics);
    }
}
