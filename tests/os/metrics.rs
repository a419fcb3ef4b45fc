//! The metrics source against a real Python HTTP server on 127.0.0.1 (SGLang-, router- and
//! vLLM-shaped expositions, a hung endpoint, a 50 MB body, garbage, a refused port), and,
//! when `tests/lab/.venv` has sglang-router, against the real router.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};
use wedgewatch::clock::SystemClock;
use wedgewatch::model::{Component, FetchOutcome, MetricsScrape, Payload, Role, Status, Topology};
use wedgewatch::probes::ProbeSet;
use wedgewatch::sources::metrics::{labelled_key, rates, MetricsConfig, MetricsSource};
use wedgewatch::sources::sockets::{SocketConfig, SocketSource};
use wedgewatch::sources::Source;
use wedgewatch::sys::http::{self, Limits};
use wedgewatch_testkit::timing::within;

const SERVER: &str = r#"
import json, os, random, sys, threading, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
threading.Timer(120, lambda: os._exit(0)).start()
scrapes = [0]

SGLANG = '''# HELP sglang:num_running_reqs The number of running requests.
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{engine_type="decode",model_name="m",pp_rank="0",tp_rank="0"} 0.0
# TYPE sglang_num_queue_reqs gauge
sglang_num_queue_reqs{model_name="m"} 2.0
sglang:http_requests_active{endpoint="/v1/chat/completions",method="POST"} 2.0
sglang:num_decode_prealloc_queue_reqs{engine_type="decode",model_name="m"} 1.0
sglang_num_prefill_prealloc_queue_reqs{model_name="m"} 3.0
# TYPE sglang:forward_execution_seconds_total counter
sglang:forward_execution_seconds_total{category="decode",model_name="m"} %(fwd)s
sglang:forward_execution_seconds_total{category="prefill",model_name="m"} 1.0
sglang:forward_execution_seconds_created{category="decode",model_name="m"} 1.7e9
sglang:scheduler_idle_seconds_total{model_name="m"} 5.0 1700000000000
sglang:weird{path="a\\"b"} NaN
'''

ROUTER = '''# TYPE smg_worker_requests_active gauge
smg_worker_requests_active{worker="http://127.0.0.1:31011"} 2
smg_worker_requests_active{worker="http://127.0.0.1:31012"} 2
# TYPE smg_worker_health gauge
smg_worker_health{worker="http://127.0.0.1:31011"} 1
smg_http_connections_active 0
smg_http_requests_total{method="POST",path="/v1/chat/completions"} 40
'''

VLLM = '''vllm:num_requests_running{engine="0",model_name="m"} 1.0
vllm:num_requests_waiting{engine="0",model_name="m"} 4.0
vllm:generation_tokens_total{engine="0",model_name="m"} 1234.0
vllm:request_success_created{engine="0",model_name="m",finished_reason="stop"} 1.7e9
'''

class H(BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass
    def send(self, body, ctype='text/plain; version=0.0.4'):
        self.send_response(200)
        self.send_header('Content-Type', ctype)
        self.send_header('Content-Length', str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def do_GET(self):
        p = self.path
        if p == '/metrics':
            scrapes[0] += 1
            self.send((SGLANG % {'fwd': 10.0 + 1.5 * scrapes[0]}).encode())
        elif p == '/router/metrics':
            self.send(ROUTER.encode())
        elif p == '/vllm/metrics':
            self.send(VLLM.encode())
        elif p == '/keepalive/metrics':
            # Answers completely but keeps the connection open (ignores Connection: close).
            body = b'sglang:num_running_reqs 1\n'
            self.wfile.write(b'HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n' % len(body) + body)
            self.wfile.flush()
            time.sleep(30)
        elif p == '/hang/metrics':
            time.sleep(60)
        elif p == '/big/metrics':
            self.send_response(200)
            self.end_headers()
            line = b'sglang:num_running_reqs{tp_rank="0"} 1.0\n'
            chunk = line * (1024 * 1024 // len(line))
            try:
                for _ in range(50):
                    self.wfile.write(chunk)
            except OSError:
                pass
        elif p == '/garbage/metrics':
            rnd = random.Random(7)
            junk = bytes(rnd.randrange(256) for _ in range(20000))
            self.send(junk + b'\nsglang:num_running_reqs 7\n}{ 1 2 3\n')
        elif p == '/workers':
            self.send(json.dumps({'workers': [
                {'url': 'http://127.0.0.1:31011', 'worker_type': 'prefill', 'load': 2},
                {'url': 'http://127.0.0.1:31012', 'worker_type': 'decode', 'load': 2}],
                'total': 2}).encode(), 'application/json')
        elif p.startswith('/v1/loads'):
            self.send(json.dumps({'loads': [{'dp_rank': 0, 'num_running_reqs': 0,
                'num_waiting_reqs': 2}]}).encode(), 'application/json')
        else:
            self.send_response(404)
            self.end_headers()

class S(ThreadingHTTPServer):
    # The default backlog of 5 drops SYNs when every component is scraped at once.
    request_queue_size = 128
    daemon_threads = True
srv = S(('127.0.0.1', 0), H)
print(srv.server_address[1], flush=True)
srv.serve_forever()
"#;

struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn first_line(child: &mut Child, within: Duration) -> String {
    let out = child.stdout.take().expect("stdout");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = BufReader::new(out).read_line(&mut line);
        let _ = tx.send(line);
    });
    rx.recv_timeout(within)
        .expect("child did not report in time")
}

fn start_server() -> (Proc, u16) {
    let mut child = Command::new("python3")
        .arg("-c")
        .arg(SERVER)
        .stdout(Stdio::piped())
        .spawn()
        .expect("python3");
    let line = first_line(&mut child, Duration::from_secs(15));
    let port = line.trim().parse().expect("port");
    (Proc(child), port)
}

fn closed_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

fn comp(
    id: &str,
    role: Role,
    stack: &str,
    metrics: Option<String>,
    http: Option<String>,
) -> Component {
    let mut c = Component::new(id, role, stack);
    c.metrics_url = metrics;
    c.http_url = http;
    c
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

fn source(limits: Limits) -> MetricsSource {
    let maps = ProbeSet::builtin().unwrap().metric_maps;
    MetricsSource::new(
        maps,
        MetricsConfig {
            limits,
            extras: true,
            ..MetricsConfig::default()
        },
    )
    .unwrap()
}

fn by_id<'a>(s: &'a [MetricsScrape], id: &str) -> &'a MetricsScrape {
    s.iter().find(|s| s.component == id).expect(id)
}

#[test]
fn scrapes_everything_concurrently_and_marks_bad_endpoints() {
    let (_srv, port) = start_server();
    let base = format!("http://127.0.0.1:{port}");
    let refused = closed_port();
    let topo = Topology {
        components: vec![
            comp(
                "decode",
                Role::Decode,
                "sglang",
                Some(format!("{base}/metrics")),
                Some(base.clone()),
            ),
            comp(
                "router",
                Role::Router,
                "sglang",
                Some(format!("{base}/router/metrics")),
                Some(base.clone()),
            ),
            comp(
                "vllm",
                Role::Engine,
                "vllm",
                Some(format!("{base}/vllm/metrics")),
                None,
            ),
            comp(
                "hung",
                Role::Prefill,
                "sglang",
                Some(format!("{base}/hang/metrics")),
                None,
            ),
            comp(
                "big",
                Role::Prefill,
                "sglang",
                Some(format!("{base}/big/metrics")),
                None,
            ),
            comp(
                "junk",
                Role::Prefill,
                "sglang",
                Some(format!("{base}/garbage/metrics")),
                None,
            ),
            comp(
                "gone",
                Role::Prefill,
                "sglang",
                Some(format!("http://127.0.0.1:{refused}/metrics")),
                None,
            ),
        ],
        edges: vec![],
    };
    let limits = Limits {
        connect: Duration::from_millis(300),
        total: Duration::from_millis(800),
        cap: 1024 * 1024,
    };
    let src = source(limits);
    let rt = rt();
    let start = Instant::now();
    let sample = rt.block_on(src.sample(&topo, &SystemClock));
    let took = start.elapsed();
    // The hung endpoint (60 s) costs its own timeout, not the others' time.
    assert!(took < within(limits.total), "took {took:?}");
    let Payload::Metrics(s) = &sample.payload else {
        panic!("payload")
    };
    assert_eq!(s.len(), 7);

    let d = by_id(s, "decode");
    assert_eq!(d.metrics.as_ref().unwrap().outcome, FetchOutcome::Ok);
    assert_eq!(d.bad_lines, 0);
    assert_eq!(d.mapped["running"], 0.0); // `sglang:` prefix
    assert_eq!(d.mapped["queued"], 2.0); // `sglang_` prefix
    assert_eq!(d.mapped["http_active"], 2.0);
    assert_eq!(d.mapped["decode_prealloc_queue"], 1.0);
    assert_eq!(d.mapped["prefill_bootstrap_queue"], 3.0); // old name
    assert_eq!(d.mapped["idle_seconds_total"], 5.0); // with a timestamp
    assert!(d.series.iter().any(|x| x.name.ends_with("_created")));
    assert_eq!(d.extra["v1_loads"]["loads"][0]["num_waiting_reqs"], 2);
    assert!(d.extra_probes[0].url.contains("/v1/loads"));

    let r = by_id(s, "router");
    assert_eq!(r.mapped["worker_in_flight"], 4.0);
    assert_eq!(
        r.mapped[&labelled_key("worker_in_flight", "worker", "http://127.0.0.1:31012")],
        2.0
    );
    assert_eq!(r.mapped["requests_total"], 40.0);
    assert_eq!(r.extra["workers"]["workers"][1]["worker_type"], "decode");

    let v = by_id(s, "vllm");
    assert_eq!(v.mapped["running"], 1.0);
    assert_eq!(v.mapped["queued"], 4.0);
    assert_eq!(v.mapped["generation_tokens_total"], 1234.0);

    let h = by_id(s, "hung").metrics.as_ref().unwrap();
    assert_eq!(h.outcome, FetchOutcome::Timeout);
    let hung_for = Duration::from_millis(h.elapsed_ms);
    assert!(
        hung_for + Duration::from_millis(10) >= limits.total && hung_for < within(limits.total),
        "{h:?}"
    );

    let b = by_id(s, "big");
    let bp = b.metrics.as_ref().unwrap();
    assert_eq!(bp.outcome, FetchOutcome::TooLarge, "{bp:?}");
    assert_eq!(bp.body_bytes, 1024 * 1024);
    // The capped part is parsed, up to the series limit, and the cut is said.
    assert_eq!(b.series.len(), 20_000);
    assert!(
        bp.detail
            .as_deref()
            .is_some_and(|d| d.contains("series cut")),
        "{bp:?}"
    );
    assert_eq!(b.bad_lines, 0, "the cut line is dropped, not counted");

    let j = by_id(s, "junk");
    assert_eq!(j.metrics.as_ref().unwrap().outcome, FetchOutcome::Ok);
    assert!(j.bad_lines > 10, "{}", j.bad_lines);
    assert_eq!(j.mapped["running"], 7.0);

    let g = by_id(s, "gone").metrics.as_ref().unwrap();
    assert_eq!(g.outcome, FetchOutcome::Refused);

    assert_eq!(sample.status.status, Status::Degraded);
    let reason = sample.status.reason.clone().unwrap();
    for what in ["/hang/metrics timeout", "/big/metrics too large", "refused"] {
        assert!(reason.contains(what), "{what} not in {reason}");
    }
    assert!(!reason.contains("/router/metrics"), "{reason}");
}

#[test]
fn counters_become_rates_between_samples() {
    let (_srv, port) = start_server();
    let base = format!("http://127.0.0.1:{port}");
    let topo = Topology {
        components: vec![comp(
            "decode",
            Role::Decode,
            "sglang",
            Some(format!("{base}/metrics")),
            None,
        )],
        edges: vec![],
    };
    let src = source(Limits::default());
    let rt = rt();
    let a = rt.block_on(src.sample(&topo, &SystemClock));
    std::thread::sleep(Duration::from_millis(300));
    let b = rt.block_on(src.sample(&topo, &SystemClock));
    assert_eq!(b.status.status, Status::Ok, "{:?}", b.status);
    let (Payload::Metrics(pa), Payload::Metrics(pb)) = (&a.payload, &b.payload) else {
        panic!("payload")
    };
    let dt = b.t_ms - a.t_ms;
    let r = rates(&pa[0], &pb[0], dt);
    // The server adds 1.5 s of forward time per scrape.
    let expect = 1.5 / (dt as f64 / 1000.0);
    assert!(
        (r["forward_seconds_total_rate"] - expect).abs() < 1e-9,
        "{r:?}"
    );
    assert_eq!(r["idle_seconds_total_rate"], 0.0);
    assert!(!r.contains_key("running_rate"));
}

#[test]
fn http_get_limits_hold() {
    let (_srv, port) = start_server();
    let rt = rt();
    let lim = Limits {
        connect: Duration::from_millis(300),
        total: Duration::from_millis(500),
        cap: 4096,
    };
    let hung = rt.block_on(http::get(
        &format!("http://127.0.0.1:{port}/hang/metrics"),
        lim,
    ));
    assert_eq!(hung.outcome, FetchOutcome::Timeout);
    // The endpoint sleeps 60 s: only the total timeout ends it within the bound.
    assert!(hung.elapsed < within(lim.total), "{:?}", hung.elapsed);
    let nf = rt.block_on(http::get(&format!("http://127.0.0.1:{port}/nope"), lim));
    assert_eq!(
        (nf.outcome, nf.status),
        (FetchOutcome::HttpError, Some(404))
    );
    let big = rt.block_on(http::get(
        &format!("http://127.0.0.1:{port}/big/metrics"),
        lim,
    ));
    assert_eq!(
        (big.outcome, big.body.len()),
        (FetchOutcome::TooLarge, 4096)
    );
    // The server holds the connection 30 s: a client reading to the close would end at
    // the total timeout, with `Timeout`.
    let ka_lim = Limits {
        total: Duration::from_secs(10),
        ..lim
    };
    let ka = rt.block_on(http::get(
        &format!("http://127.0.0.1:{port}/keepalive/metrics"),
        ka_lim,
    ));
    assert_eq!(ka.outcome, FetchOutcome::Ok, "{ka:?}");
    assert_eq!(ka.body, b"sglang:num_running_reqs 1\n");
    assert!(ka.elapsed < ka_lim.total, "{:?}", ka.elapsed);
    let ok = rt.block_on(http::get(&format!("http://127.0.0.1:{port}/workers"), lim));
    assert_eq!((ok.outcome, ok.status), (FetchOutcome::Ok, Some(200)));
    assert!(ok.body.starts_with(b"{\"workers\""));
    let bad = rt.block_on(http::get("https://127.0.0.1/", lim));
    assert_eq!(bad.outcome, FetchOutcome::Error);
}

/// A listener whose accept queue is full drops SYNs: the connect itself hangs.
#[test]
fn connect_timeout_is_enforced() {
    const FULL: &str = r#"
import os, socket, threading, time
threading.Timer(60, lambda: os._exit(0)).start()
s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen(0)
print(s.getsockname()[1], flush=True)
while True: time.sleep(1)
"#;
    let mut c = Command::new("python3")
        .args(["-c", FULL])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let port: u16 = first_line(&mut c, Duration::from_secs(15))
        .trim()
        .parse()
        .unwrap();
    let _guard = Proc(c);
    // Fill the queue (bounded: the first connect that times out proves it is full).
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let mut held = Vec::new();
    for _ in 0..16 {
        match std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(200)) {
            Ok(s) => held.push(s),
            Err(_) => break,
        }
    }
    assert!(held.len() < 16, "accept queue never filled");
    // A total far above the connect timeout plus slack: only the connect timeout ends the
    // GET within the bound.
    let lim = Limits {
        connect: Duration::from_millis(300),
        total: Duration::from_secs(30),
        cap: 4096,
    };
    let t = rt().block_on(http::get(&format!("http://127.0.0.1:{port}/metrics"), lim));
    assert_eq!(t.outcome, FetchOutcome::Timeout, "{t:?}");
    assert!(
        t.detail.as_deref().unwrap_or("").contains("connect"),
        "{t:?}"
    );
    assert!(t.elapsed < within(lim.connect), "{:?}", t.elapsed);
}

/// The real router (sglang-router 0.3.2) in PD mode over two tiny stdlib workers: its
/// metrics port and `/workers`. Needs `tests/lab/.venv` (see the brief); skipped loudly
/// without it.
#[test]
fn real_router_metrics_and_workers() {
    let py = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/lab/.venv/bin/python");
    let has_router = py.exists()
        && Command::new(&py)
            .args(["-c", "import sglang_router"])
            .status()
            .map(|s| s.success())
            .unwrap_or(false);
    if !has_router {
        eprintln!(
            "SKIPPED real_router_metrics_and_workers: {} with sglang_router not found \
             (python3 -m venv tests/lab/.venv && tests/lab/.venv/bin/pip install sglang-router==0.3.2)",
            py.display()
        );
        return;
    }
    const WORKER: &str = r#"
import json, os, threading, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
threading.Timer(120, lambda: os._exit(0)).start()
class H(BaseHTTPRequestHandler):
    def log_message(self, *a): pass
    def do_GET(self):
        body = b'{}' if self.path == '/health' else b''
        self.send_response(200 if self.path == '/health' else 404)
        self.send_header('Content-Length', str(len(body)))
        self.end_headers(); self.wfile.write(body)
    def do_POST(self):
        # Accept the request and never answer: "accepted and forgotten".
        self.rfile.read(int(self.headers.get('Content-Length') or 0))
        time.sleep(60)
srv = ThreadingHTTPServer(('127.0.0.1', 0), H); srv.daemon_threads = True
print(srv.server_address[1], flush=True); srv.serve_forever()
"#;
    let spawn_worker = || {
        let mut c = Command::new(&py)
            .args(["-c", WORKER])
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let port: u16 = first_line(&mut c, Duration::from_secs(15))
            .trim()
            .parse()
            .unwrap();
        (Proc(c), port)
    };
    let (p_proc, pport) = spawn_worker();
    let (d_proc, dport) = spawn_worker();
    let (p_pid, d_pid) = (p_proc.0.id(), d_proc.0.id());
    let rport = closed_port();
    let mport = closed_port();
    let router = Command::new(&py)
        .args([
            "-m",
            "sglang_router.launch_router",
            "--host",
            "127.0.0.1",
            "--port",
        ])
        .arg(rport.to_string())
        .args(["--pd-disaggregation", "--prefill"])
        .arg(format!("http://127.0.0.1:{pport}"))
        .arg("none")
        .arg("--decode")
        .arg(format!("http://127.0.0.1:{dport}"))
        .args(["--prometheus-host", "127.0.0.1", "--prometheus-port"])
        .arg(mport.to_string())
        .args(["--shutdown-grace-period-secs", "1", "--log-level", "warn"])
        .env("HF_ENDPOINT", "http://127.0.0.1:9")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let router_pid = router.id() as i32;
    let _router = Proc(router);
    let rt = rt();
    let ready = format!("http://127.0.0.1:{rport}/readiness");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let r = rt.block_on(http::get(&ready, Limits::default()));
        if r.outcome == FetchOutcome::Ok {
            break;
        }
        assert!(Instant::now() < deadline, "router not ready in 30 s: {r:?}");
        std::thread::sleep(Duration::from_millis(250));
    }
    let topo = Topology {
        components: vec![comp(
            "router",
            Role::Router,
            "sglang",
            Some(format!("http://127.0.0.1:{mport}/metrics")),
            Some(format!("http://127.0.0.1:{rport}")),
        )],
        edges: vec![],
    };
    let src = source(Limits::default());
    let sample = rt.block_on(src.sample(&topo, &SystemClock));
    assert_eq!(sample.status.status, Status::Ok, "{:?}", sample.status);
    let Payload::Metrics(s) = &sample.payload else {
        panic!("payload")
    };
    let r = &s[0];
    assert!(
        r.series.iter().any(|x| x.name.starts_with("smg_")),
        "{:?}",
        r.series
    );
    assert_eq!(r.bad_lines, 0);
    assert!(r.mapped.contains_key("worker_healthy"), "{:?}", r.mapped);
    let workers = r.extra["workers"].to_string();
    assert!(workers.contains(&format!("127.0.0.1:{dport}")), "{workers}");
    assert!(workers.contains("decode"), "{workers}");

    // The incident in miniature: a request the workers accept and never answer. The router
    // counts it in flight for both legs, and the sockets show client -> router -> prefill and
    // router -> decode connections, silent on the way back.
    let mut client = std::net::TcpStream::connect(("127.0.0.1", rport)).unwrap();
    let body = r#"{"text":"hello","sampling_params":{"max_new_tokens":4},"stream":false}"#;
    write!(
        client,
        "POST /generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let me = std::process::id() as i32;
    let worker = |id: &str, role: Role, pid: u32, port: u16| {
        let mut c = comp(id, role, "sglang", None, None);
        c.pids = vec![pid as i32];
        c.listen = vec![format!("127.0.0.1:{port}")];
        c
    };
    let mut router_c = topo.components[0].clone();
    router_c.pids = vec![router_pid];
    router_c.listen = vec![format!("127.0.0.1:{rport}"), format!("127.0.0.1:{mport}")];
    let mut client_c = comp("client", Role::Client, "generic", None, None);
    client_c.pids = vec![me];
    let full = Topology {
        components: vec![
            client_c,
            router_c,
            worker("prefill", Role::Prefill, p_pid, pport),
            worker("decode", Role::Decode, d_pid, dport),
        ],
        edges: vec![],
    };
    let sockets = SocketSource::new(SocketConfig::default());
    let deadline = Instant::now() + Duration::from_secs(10);
    let (table, scrape) = loop {
        let Payload::Sockets(t) = rt.block_on(sockets.sample(&full, &SystemClock)).payload else {
            panic!("payload")
        };
        let m = rt.block_on(src.sample(&topo, &SystemClock));
        let Payload::Metrics(ms) = m.payload else {
            panic!("payload")
        };
        let ms = ms.into_iter().next().unwrap();
        let key = labelled_key(
            "worker_in_flight",
            "worker",
            &format!("http://127.0.0.1:{dport}"),
        );
        // The worker's socket has an owner only once it is accept()ed (before that it sits
        // in the kernel's accept queue with no fd): on a loaded machine that takes a moment.
        // And the router forwards the request a moment after it accepted the connection.
        let accepted = t.sockets.iter().any(|s| {
            s.local_port() == Some(dport)
                && s.pid == Some(d_pid as i32)
                && s.state == wedgewatch::model::TcpState::Established
                && s.tcp_info.is_some_and(|ti| ti.bytes_received > 0)
        });
        if connections(&full, &t).len() == 3 && ms.mapped.get(&key) == Some(&1.0) && accepted {
            break (t, ms);
        }
        assert!(
            Instant::now() < deadline,
            "no wedge picture in 10 s: {:?} {:?}",
            connections(&full, &t),
            ms.mapped
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    let links = connections(&full, &table);
    let edges: Vec<(&str, &str)> = links
        .iter()
        .map(|(from, to)| (from.as_str(), to.as_str()))
        .collect();
    assert_eq!(
        edges,
        vec![
            ("client", "router"),
            ("router", "decode"),
            ("router", "prefill")
        ]
    );
    assert_eq!(
        scrape.mapped[&labelled_key(
            "worker_in_flight",
            "worker",
            &format!("http://127.0.0.1:{pport}")
        )],
        1.0
    );
    // The decode worker's accepted socket: request bytes in, nothing out.
    let d = table
        .sockets
        .iter()
        .find(|s| {
            s.local_port() == Some(dport)
                && s.pid == Some(d_pid as i32)
                && s.state == wedgewatch::model::TcpState::Established
        })
        .expect("decode's accepted socket");
    let ti = d.tcp_info.unwrap();
    assert!(ti.bytes_received > 0 && ti.bytes_acked <= 1, "{ti:?}");
    drop(client);
}

/// Live connections between components as (from, to): an ESTABLISHED socket of one
/// component's pid whose remote port another component listens on, one per connection.
fn connections(topo: &Topology, t: &wedgewatch::model::SocketTable) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = t
        .sockets
        .iter()
        .filter(|s| s.state == wedgewatch::model::TcpState::Established)
        .filter_map(|s| {
            let from = topo.component_of_pid(s.pid?)?;
            let to = topo.component_listening_on(s.remote_port()?)?;
            (from.id != to.id).then(|| (from.id.clone(), to.id.clone()))
        })
        .collect();
    out.sort();
    out
}
