//! The exporter's listener (`daemon::exporter::serve`) against hostile clients on a real
//! loopback socket: garbage, other methods and paths, an oversized head, a client that never
//! finishes its head, and more clients than it serves at once. Each gets a 4xx or is closed,
//! none stops a well-behaved scrape from being answered promptly, and nothing panics.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use wedgewatch::daemon::exporter::{self, MAX_CLIENTS, MAX_HEAD};
use wedgewatch_testkit::timing::within;

struct Server {
    addr: SocketAddr,
    _rt: tokio::runtime::Runtime,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Server {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn server() -> Server {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let listener = rt
        .block_on(exporter::bind("127.0.0.1:0".parse().expect("addr")))
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let published: exporter::Published = Arc::new(Mutex::new(None));
    let stats = Arc::new(Mutex::new(Default::default()));
    let clock: Arc<dyn wedgewatch::clock::Clock> = Arc::new(wedgewatch::clock::SystemClock);
    let task = rt.spawn(exporter::serve(listener, published, stats, clock));
    Server {
        addr,
        _rt: rt,
        task,
    }
}

/// Sends `bytes`, half-closes, reads the answer (bounded): its status line ("" if closed).
fn exchange(addr: SocketAddr, bytes: &[u8]) -> (String, String) {
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    let _ = s.write_all(bytes);
    let _ = s.shutdown(std::net::Shutdown::Write);
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    let text = String::from_utf8_lossy(&out).into_owned();
    let status = text.lines().next().unwrap_or_default().to_string();
    (status, text)
}

fn scrape_ok(addr: SocketAddr) -> Duration {
    let t = Instant::now();
    let (status, text) = exchange(addr, b"GET /metrics HTTP/1.1\r\nHost: t\r\n\r\n");
    assert_eq!(status, "HTTP/1.1 200 OK", "{text}");
    assert!(
        text.contains("\r\nContent-Type: text/plain; version=0.0.4"),
        "{text}"
    );
    assert!(text.contains("wedgewatch_build_info{version="), "{text}");
    t.elapsed()
}

#[test]
fn only_get_metrics_is_answered_and_garbage_gets_a_4xx() {
    let s = server();
    scrape_ok(s.addr);
    let cases: &[(&[u8], &str)] = &[
        (b"POST /metrics HTTP/1.1\r\n\r\n", "HTTP/1.1 405"),
        (b"GET /debug HTTP/1.1\r\n\r\n", "HTTP/1.1 404"),
        (
            b"GET /metrics/../etc/passwd HTTP/1.1\r\n\r\n",
            "HTTP/1.1 404",
        ),
        (
            b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03\r\n\r\n",
            "HTTP/1.1 400",
        ),
        (b"GET /metrics\r\n\r\n", "HTTP/1.1 400"),
        (b"GET /metrics HTTP/1.1\r\n", "HTTP/1.1 400"), // closed before its blank line
        (b"", "HTTP/1.1 400"),
    ];
    for (req, want) in cases {
        let (status, text) = exchange(s.addr, req);
        assert!(status.starts_with(want), "{req:?}: {text}");
        assert!(!text.contains("wedgewatch_"), "{req:?}: no metrics: {text}");
    }
    let (status, text) = exchange(s.addr, b"POST /metrics HTTP/1.1\r\n\r\n");
    assert!(text.contains("Allow: GET"), "{status}: {text}");
    scrape_ok(s.addr);
}

#[test]
fn an_oversized_head_is_refused_without_reading_it_all() {
    let s = server();
    let mut big = b"GET /metrics HTTP/1.1\r\nX-Fill: ".to_vec();
    big.resize(MAX_HEAD * 64, b'a');
    big.extend_from_slice(b"\r\n\r\n");
    let (status, _) = exchange(s.addr, &big);
    // 431, or the connection reset while we were still sending: either way, refused.
    assert!(
        status.is_empty() || status.starts_with("HTTP/1.1 431"),
        "{status}"
    );
    scrape_ok(s.addr);
}

#[test]
fn slow_and_excess_clients_do_not_block_a_scrape() {
    let s = server();
    // Clients that open and never finish their head, fewer than the limit: the scrape
    // still gets a slot and is answered at once.
    let idle: Vec<TcpStream> = (0..MAX_CLIENTS - 2)
        .map(|_| {
            let mut c = TcpStream::connect(s.addr).expect("connect");
            c.write_all(b"GET /metrics HTTP/1.1\r\n")
                .expect("partial head");
            c
        })
        .collect();
    std::thread::sleep(Duration::from_millis(200));
    // Waiting for a slot would take an idle client's read timeout.
    let took = scrape_ok(s.addr);
    assert!(took < exporter::READ_TIMEOUT, "{took:?}");
    // Over the limit: each extra connection sheds the oldest idle one; none is queued
    // forever.
    let extra: Vec<TcpStream> = (0..4)
        .map(|_| TcpStream::connect(s.addr).expect("connect"))
        .collect();
    std::thread::sleep(Duration::from_millis(200));
    for mut c in extra {
        c.set_read_timeout(Some(Duration::from_secs(10)))
            .expect("timeout");
        let mut buf = Vec::new();
        let _ = c.read_to_end(&mut buf);
    }
    // The slow ones are cut at the read timeout (5 s) and their slots come back. Each waits
    // past the bound asserted, so a server that never cut them fails it.
    let started = Instant::now();
    for mut c in idle {
        c.set_read_timeout(Some(within(exporter::READ_TIMEOUT) * 2))
            .expect("timeout");
        let mut buf = Vec::new();
        let _ = c.read_to_end(&mut buf);
        assert!(
            buf.is_empty() || String::from_utf8_lossy(&buf).starts_with("HTTP/1.1 4"),
            "{}",
            String::from_utf8_lossy(&buf)
        );
    }
    assert!(
        started.elapsed() < within(exporter::READ_TIMEOUT),
        "{:?}",
        started.elapsed()
    );
    scrape_ok(s.addr);
}

/// Issue 34 item 3, the hostile pattern: `MAX_CLIENTS` connections that never send a byte,
/// each closed and re-opened every ~4 s (inside the head timeout, so none ever times out),
/// held the whole time scrapes come in. Every scrape is answered, without waiting for an idle
/// connection's timeout: a new connection past the cap sheds the oldest idle one.
#[test]
fn idle_connections_reopened_inside_the_head_timeout_do_not_stop_scrapes() {
    use std::collections::VecDeque;
    use std::sync::atomic::{AtomicBool, Ordering};
    const REOPEN: Duration = Duration::from_secs(4);
    let s = server();
    let addr = s.addr;
    let stop = Arc::new(AtomicBool::new(false));
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let attacker = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let open = || (Instant::now(), TcpStream::connect(addr).expect("connect"));
            // Opened one by one over the first period, so that re-openings are spread out.
            let mut held: VecDeque<(Instant, TcpStream)> = VecDeque::new();
            let mut reopened = 0u32;
            while !stop.load(Ordering::Relaxed) {
                if held.len() < MAX_CLIENTS {
                    held.push_back(open());
                    if held.len() == MAX_CLIENTS {
                        let _ = ready_tx.send(());
                    }
                    std::thread::sleep(REOPEN / MAX_CLIENTS as u32 / 4);
                    continue;
                }
                if held.front().is_some_and(|(t, _)| t.elapsed() >= REOPEN) {
                    held.pop_front();
                    held.push_back(open());
                    reopened += 1;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            reopened
        })
    };
    ready_rx
        .recv_timeout(Duration::from_secs(30))
        .expect("the attacker holds every slot");
    let mut answered = 0;
    let mut slowest = Duration::ZERO;
    for _ in 0..12 {
        let t = Instant::now();
        let (status, _) = exchange(addr, b"GET /metrics HTTP/1.1\r\nHost: t\r\n\r\n");
        if status == "HTTP/1.1 200 OK" {
            answered += 1;
            slowest = slowest.max(t.elapsed());
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    stop.store(true, Ordering::Relaxed);
    let reopened = attacker.join().expect("attacker");
    assert!(reopened > 0, "the attacker re-opened connections");
    assert_eq!(answered, 12, "scrapes answered under the idle flood");
    assert!(
        slowest < exporter::READ_TIMEOUT,
        "no scrape waited for an idle connection's timeout: {slowest:?}"
    );
    scrape_ok(addr);
}

/// `wedgewatch daemon --metrics-listen ADDR` with an address that is not `IP:PORT`, or one
/// already taken: a usage error (exit 2) naming the flag, before any sampling.
#[test]
fn a_bad_or_taken_address_is_a_usage_error_naming_the_flag() {
    let held = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let taken = held.local_addr().expect("addr").to_string();
    let tmp = tempfile::tempdir().expect("tmp");
    for (addr, says) in [
        ("localhost:9466", "invalid value 'localhost:9466'"),
        (taken.as_str(), "--metrics-listen"),
    ] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_wedgewatch"))
            .arg("--state-dir")
            .arg(tmp.path().join("state"))
            .args([
                "daemon",
                "--no-record",
                "--for",
                "20s",
                "--metrics-listen",
                addr,
            ])
            .args(["--nvml-lib", "/nonexistent/libnvidia-ml.so.1"])
            .env_remove("RUST_LOG")
            .stdin(std::process::Stdio::null())
            .output()
            .expect("run wedgewatch");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{addr}: {err}");
        assert!(err.contains(says), "{addr}: {err}");
    }
}
