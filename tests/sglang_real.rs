//! The real-SGLang tier (docs/lab.md "Real SGLang tier"): PyPI `sglang` 0.5.23 on the CPU, a
//! real prefill (TP 1) / decode (TP 2) pair moving KV over Mooncake TCP, behind the real
//! `sglang-router` (`tests/lab/sglang/sglang_lab.py`), looked at by the wedgewatch binary as a
//! user runs it (`snapshot --json`, `diff`).
//!
//! One test, one stack (each start costs minutes of CPU), in phases:
//! 1. idle, right after `up`: discovery (router, prefill, decode, their `sglang::scheduler*`
//!    and detokenizer children, roles, TP ranks, the prefill's bootstrap port and the
//!    router's workers), the real metrics mapped, stacks idle (decode's TP ranks waiting in
//!    `broadcast_pyobj`) -> the baseline;
//! 2. streaming load through the router: a running request in decode's metrics, its
//!    schedulers in a forward pass; after >= 40 s of traffic the healthy negative: no
//!    finding at all (checked last, see `HEALTHY_AFTER`);
//! 3. a stuck detokenizer (issue 32): the fault hook's gate file makes decode's real
//!    `DetokenizerManager` hold the batch it gets; two streams through the router get not one
//!    byte while decode's schedulers generate their tokens; a snapshot whose window started
//!    before the requests (they follow its first scrape of decode) gives `tokens_undelivered`
//!    at decode naming its detokenizer, and no `wedged_request` there; the gate removed, both
//!    streams finish;
//! 4. one PD leg fails (issue 32): the prefill runs with a smaller `--context-length` than
//!    decode (set at `up`), so a long prompt through the router is refused by prefill (400)
//!    and accepted by decode, which waits for KV that never comes while the router holds the
//!    client; a snapshot started before it gives `pd_leg_failed` at prefill naming decode and
//!    the router;
//! 5. decode restarted with `LAB_SGLANG_FORGET_AFTER=2` (the change since noon, our fault
//!    hook on the decode's PYTHONPATH only): two streams through the lab proxy in front of the
//!    router are accepted and forgotten; a snapshot with `--baseline` gives `wedged_request`
//!    at decode, each request's path starting at the proxy, and `config_changed` naming the
//!    variable, and `diff` names it. (The restart also drops phase 4's waiting request.)
//!
//! Set-up: `python3 tests/lab/sglang/sglang_lab.py setup` (tests/run-all.sh starts it beside
//! the build; the test runs it too, idempotent, waiting on its lock). `WEDGEWATCH_SKIP_SGLANG=1`
//! skips the tier (said on stderr). A set-up or start failure fails the test.
//! `WEDGEWATCH_LAB_KEEP=1` keeps the run directory (server logs, snapshots). The stack is seen
//! by every discovery on the machine: this binary is in the lab lane (tests/lanes.sh).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;
use wedgewatch_testkit::lab::{self, Keeper};

/// The fault's variable: the "change since noon" on the decode server.
const FAULT_VAR: &str = "LAB_SGLANG_FORGET_AFTER";
/// SGLang's own start-up warm-up and `restart-decode`'s warm-up pass; every later request is
/// forgotten.
const FAULT_VALUE: &str = "2";
/// The healthy negative is judged after this much traffic: decode's pooled bootstrap session
/// is then older than any stuck-request threshold (issue 38).
const HEALTHY_AFTER: Duration = Duration::from_secs(40);
/// The fault hook's switch for a stuck detokenizer (`tests/lab/sglang/fault/`): while the
/// file it names exists, decode's real `DetokenizerManager` holds the batch it got. Set at `up`
/// (so the baseline has it), switched by the test at run time.
const GATE_VAR: &str = "LAB_SGLANG_DETOKENIZER_GATE";
/// The prefill's context, smaller than decode's (the model's 1024): prompts between the two
/// are refused by prefill (HTTP 400) and accepted by decode. The healthy load fits both.
const PREFILL_CONTEXT: u32 = 256;
/// Words of the prompt the prefill refuses (the lab tokenizer: about a token a word).
const LONG_PROMPT_WORDS: usize = 400;
/// The window of the snapshots that must see the engines' counts from before their
/// requests (started first; the requests follow its first scrape, then wait past
/// `wedged_after_ms`, 8 s in thresholds-fast).
const BLAME_WINDOW_S: u32 = 26;
/// A scheduler's states in a forward pass (probes/stacks-sglang.toml); on the CPU the TP
/// all-reduce inside the forward is classified as the collective.
const FORWARD: [&str; 3] = ["running_batch", "nccl_collective", "waiting_gpu_result"];
/// Snapshots taken while generating, at most, to see the running request and a forward pass.
const GENERATING_TRIES: usize = 10;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn sglang_lab() -> PathBuf {
    repo().join("tests/lab/sglang/sglang_lab.py")
}

fn skipped() -> bool {
    if std::env::var("WEDGEWATCH_SKIP_SGLANG").is_ok_and(|v| !v.is_empty() && v != "0") {
        eprintln!("SKIPPED: the real-SGLang tier (WEDGEWATCH_SKIP_SGLANG is set)");
        return true;
    }
    false
}

/// Runs a command to completion under a hard bound (killed past it); (success, stdout, stderr).
fn run_bounded(mut cmd: Command, bound: Duration, out_p: &Path) -> (bool, String, String) {
    let err_p = out_p.with_extension("err");
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(out_p).expect("stdout file"))
        .stderr(std::fs::File::create(&err_p).expect("stderr file"))
        .spawn()
        .unwrap_or_else(|e| panic!("spawn {cmd:?}: {e}"));
    let t0 = Instant::now();
    let status = loop {
        if let Some(st) = child.try_wait().expect("wait") {
            break Some(st);
        }
        if t0.elapsed() > bound {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let out = std::fs::read_to_string(out_p).unwrap_or_default();
    let err = std::fs::read_to_string(&err_p).unwrap_or_default();
    match status {
        Some(st) => (st.success(), out, err),
        None => (false, out, format!("{err}\n(killed after {bound:?})")),
    }
}

/// The process trees the tier's wedgewatch watches (`--within`): the stack's keeper and the
/// proxy. Other stacks on the machine (the labs of the other tests) are left out.
static WATCHED: Mutex<Vec<u32>> = Mutex::new(Vec::new());

fn watch(pid: u32) {
    WATCHED.lock().unwrap_or_else(|p| p.into_inner()).push(pid);
}

/// The pair and router started by `sglang_lab.py up` under a keeper (restarts included, they
/// are its process tree); Drop stops them (`down`: SIGINT, then SIGKILL of each process
/// group and its recorded children).
struct Stack {
    dir: PathBuf,
    info: Value,
    keeper: Keeper,
}

impl Stack {
    fn lab(&mut self, args: &[&str], bound: Duration, tag: &str) -> (bool, String, String) {
        let mut argv = vec!["python3".to_string(), sglang_lab().display().to_string()];
        argv.extend(args.iter().map(|a| a.to_string()));
        argv.extend(["--run-dir".to_string(), self.dir.display().to_string()]);
        let (ok, out, err) = match self.keeper.run_bounded(&argv, bound) {
            Ok(out) => (true, out, String::new()),
            Err(e) => (false, String::new(), e),
        };
        let _ = std::fs::write(self.dir.join(format!("{tag}.out")), &out);
        (ok, out, err)
    }

    fn up(dir: &Path) -> Stack {
        std::fs::create_dir_all(dir).expect("run dir");
        let keeper = Keeper::start(&repo().join("tests/lab")).expect("the stack's keeper");
        watch(keeper.pid());
        let mut st = Stack {
            dir: dir.to_path_buf(),
            info: Value::Null,
            keeper,
        };
        let t0 = Instant::now();
        // Both servers start in parallel (480 s bound each), then the router (120 s) and a
        // warm-up (180 s).
        let gate = format!("{GATE_VAR}={}", st.gate().display());
        let context = PREFILL_CONTEXT.to_string();
        let (ok, out, err) = st.lab(
            &[
                "up",
                "--decode-env",
                &gate,
                "--prefill-context-length",
                &context,
            ],
            Duration::from_secs(900),
            "up",
        );
        st.info = serde_json::from_str(&out).unwrap_or(Value::Null);
        assert!(ok, "sglang_lab.py up failed:\n{err}");
        eprintln!(
            "[sglang_real] pair and router up in {:.1}s (prefill healthy after {}s, decode {}s)",
            t0.elapsed().as_secs_f64(),
            st.info["servers"]["prefill"]["healthy_after_s"],
            st.info["servers"]["decode"]["healthy_after_s"]
        );
        st
    }

    /// The file whose presence holds decode's detokenizer (`GATE_VAR`).
    fn gate(&self) -> PathBuf {
        self.dir.join("detokenizer.gate")
    }

    /// Restarts decode with `env` added to the environment it had at `up` (the gate).
    fn restart_decode(&mut self, env: &str) {
        let t0 = Instant::now();
        let gate = format!("{GATE_VAR}={}", self.gate().display());
        let (ok, out, err) = self.lab(
            &["restart-decode", "--decode-env", &gate, "--decode-env", env],
            Duration::from_secs(900),
            "restart",
        );
        assert!(ok, "sglang_lab.py restart-decode failed:\n{err}");
        self.info = serde_json::from_str(&out).expect("restart-decode JSON");
        eprintln!(
            "[sglang_real] decode restarted with {env} in {:.1}s",
            t0.elapsed().as_secs_f64()
        );
    }

    fn pid(&self, server: &str) -> u64 {
        self.info["servers"][server]["pid"]
            .as_u64()
            .expect("server pid")
    }

    /// The pid of the server's child whose command line (its process title) is `title`.
    fn child(&self, server: &str, title: &str) -> u64 {
        self.info["servers"][server]["children"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|k| k["cmdline"].as_str() == Some(title))
            .and_then(|k| k["pid"].as_u64())
            .unwrap_or_else(|| panic!("{server} has no child titled {title}: {}", self.info))
    }

    fn port(&self, name: &str) -> u16 {
        let p = self.info["ports"][name].as_u64().expect("port");
        u16::try_from(p).expect("port fits")
    }

    fn model(&self) -> String {
        self.info["model"].as_str().expect("model").to_string()
    }

    fn log_tail(&self, server: &str) -> String {
        let log = std::fs::read_to_string(self.dir.join(format!("logs/{server}.log")))
            .unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }
}

impl Drop for Stack {
    fn drop(&mut self) {
        let (ok, _, err) = self.lab(&["down"], Duration::from_secs(90), "down");
        if !ok {
            eprintln!("[sglang_real] down: {err}");
        }
    }
}

/// The lab's streaming proxy (`tests/lab/proxy.py`) in front of the router: the incident's
/// path starts at a proxy. Its own process group, killed on drop.
struct Proxy {
    child: std::process::Child,
    port: u16,
}

impl Proxy {
    fn start(dir: &Path, router_port: u16) -> Proxy {
        use std::os::unix::process::CommandExt;
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .expect("a free port");
        let log = std::fs::File::create(dir.join("proxy.log")).expect("proxy log");
        let child = Command::new(repo().join("tests/lab/.venv/bin/python"))
            .arg(repo().join("tests/lab/proxy.py"))
            .args(["--listen-port", &port.to_string()])
            .args(["--upstream", &format!("http://127.0.0.1:{router_port}")])
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .process_group(0)
            .spawn()
            .expect("start the lab proxy");
        watch(child.id());
        let proxy = Proxy { child, port };
        let deadline = Instant::now() + Duration::from_secs(60);
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "the lab proxy never listened");
            std::thread::sleep(Duration::from_millis(100));
        }
        proxy
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        let _ = nix::sys::signal::killpg(
            nix::unistd::Pid::from_raw(self.child.id() as i32),
            nix::sys::signal::Signal::SIGKILL,
        );
        let _ = self.child.wait();
    }
}

/// A streaming chat completion body (`ignore_eos`: the model's text is random).
fn chat_body(model: &str, max_tokens: u32, round: usize) -> String {
    serde_json::json!({
        "model": model, "max_tokens": max_tokens, "ignore_eos": true, "stream": true,
        "temperature": 0,
        "messages": [{"role": "user", "content": format!("round {round}: hello engine, please answer")}],
    })
    .to_string()
}

/// Opens a connection to the router and sends one POST /v1/chat/completions.
fn send_chat(port: u16, body: &str) -> TcpStream {
    let mut s = TcpStream::connect(("127.0.0.1", port)).expect("connect to the router");
    let req = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).expect("send request");
    s
}

/// One whole request (Connection: close, read to the end, bounded); the response bytes.
fn chat(port: u16, body: &str, bound: Duration) -> Vec<u8> {
    let mut s = send_chat(port, body);
    s.set_read_timeout(Some(bound)).expect("timeout");
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    out
}

/// Reads what comes within `bound` (a forgotten stream: headers, or nothing).
fn read_for(s: &mut TcpStream, bound: Duration) -> Vec<u8> {
    s.set_read_timeout(Some(Duration::from_millis(200)))
        .expect("timeout");
    let t0 = Instant::now();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while t0.elapsed() < bound {
        match s.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(_) => {}
        }
    }
    got
}

/// `wedgewatch snapshot --json --no-daemon --window W` (+ args), bounded; the JSON, or the
/// failure as an error (a loaded machine can run a source past its deadline), which
/// `snapshot_until` tries again. Each snapshot is kept in the run directory.
fn try_snapshot(dir: &Path, window_s: u32, extra: &[&str], tag: &str) -> Result<Value, String> {
    let c = snapshot_cmd(window_s, extra);
    let bound = Duration::from_secs(u64::from(window_s) + 90);
    let (ok, out, err) = run_bounded(c, bound, &dir.join(format!("snap-{tag}.json")));
    if !ok {
        return Err(format!("wedgewatch snapshot failed: {err}"));
    }
    serde_json::from_str(&out).map_err(|e| format!("snapshot is not JSON ({e}): {out}"))
}

/// `wedgewatch --thresholds thresholds-fast snapshot --json --no-daemon --window W` (+ args)
/// with the lab venv's py-spy.
fn snapshot_cmd(window_s: u32, extra: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_wedgewatch"));
    c.arg("--thresholds")
        .arg(repo().join("tests/fixtures/thresholds-fast.toml"))
        .args(["snapshot", "--json", "--no-daemon", "--window"])
        .arg(window_s.to_string())
        .args(extra);
    for pid in WATCHED.lock().unwrap_or_else(|p| p.into_inner()).iter() {
        c.arg("--within").arg(pid.to_string());
    }
    if std::env::var_os("WEDGEWATCH_PY_SPY").is_none() {
        c.env(
            "WEDGEWATCH_PY_SPY",
            repo().join("tests/lab/.venv/bin/py-spy"),
        );
    }
    c
}

/// A snapshot started now and running beside the test (its window covers what the test does
/// next); killed on drop if still running.
struct Sampling {
    child: std::process::Child,
    out: PathBuf,
    bound: Duration,
    started: Instant,
}

impl Sampling {
    fn start(dir: &Path, window_s: u32, tag: &str) -> Sampling {
        let out = dir.join(format!("snap-{tag}.json"));
        let child = snapshot_cmd(window_s, &[])
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&out).expect("snapshot file"))
            .stderr(std::fs::File::create(out.with_extension("err")).expect("stderr file"))
            .spawn()
            .expect("spawn wedgewatch snapshot");
        Sampling {
            child,
            out,
            bound: Duration::from_secs(u64::from(window_s) + 90),
            started: Instant::now(),
        }
    }

    /// Waits for the snapshot (bounded); its JSON, or why not.
    fn finish(mut self) -> Result<Value, String> {
        let status = loop {
            if let Some(st) = self.child.try_wait().expect("wait snapshot") {
                break st;
            }
            if self.started.elapsed() > self.bound {
                return Err(format!("snapshot still running after {:?}", self.bound));
            }
            std::thread::sleep(Duration::from_millis(100));
        };
        let out = std::fs::read_to_string(&self.out).unwrap_or_default();
        if !status.success() {
            let err = std::fs::read_to_string(self.out.with_extension("err")).unwrap_or_default();
            return Err(format!("wedgewatch snapshot failed ({status}): {err}"));
        }
        serde_json::from_str(&out).map_err(|e| format!("snapshot is not JSON ({e}): {out}"))
    }
}

impl Drop for Sampling {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// GET `path` from 127.0.0.1:`port` (HTTP/1.0: never chunked; bounded); the body, or None.
fn http_get(port: u16, path: &str) -> Option<String> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    let req = format!("GET {path} HTTP/1.0\r\nHost: 127.0.0.1:{port}\r\n\r\n");
    s.write_all(req.as_bytes()).ok()?;
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    let text = String::from_utf8_lossy(&out);
    let (_, body) = text.split_once("\r\n\r\n")?;
    Some(body.to_string())
}

/// How many times an SGLang server's own count (`sglang:http_requests_total`) says `GET
/// /v1/loads` was asked of it: wedgewatch fetches it beside each scrape, nobody else here
/// (0 before the first; None when the answer did not parse).
fn loads_asked(port: u16) -> Option<f64> {
    let body = http_get(port, "/metrics")?;
    body.lines()
        .filter(|l| {
            l.starts_with("sglang:http_requests_total{")
                && l.contains("endpoint=\"/v1/loads\"")
                && l.contains("method=\"GET\"")
        })
        .map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<Option<f64>>()
}

/// Waits until something (the snapshot just started) has scraped each of `ports` since now.
fn await_scraped(ports: &[u16], bound: Duration) -> Result<(), String> {
    let t0 = Instant::now();
    let first: Vec<Option<f64>> = ports.iter().map(|&p| loads_asked(p)).collect();
    loop {
        let all = ports
            .iter()
            .zip(&first)
            .all(|(&p, a)| match (a, loads_asked(p)) {
                (Some(a), Some(b)) => b > *a,
                _ => false,
            });
        if all {
            return Ok(());
        }
        if t0.elapsed() > bound {
            return Err(format!(
                "no scrape of {ports:?} within {bound:?} (from {first:?})"
            ));
        }
        std::thread::sleep(Duration::from_millis(300));
    }
}

/// A snapshot started, and seen scraping the engines at `ports`: their counts from before
/// what the test does next are known. A snapshot not seen scraping them (discovery missed
/// the stack once on the loaded machine) is killed and started again, at most 3 times.
fn watching(dir: &Path, tag: &str, ports: &[u16]) -> Sampling {
    let mut why = String::new();
    for i in 1..=3 {
        let sampling = Sampling::start(dir, BLAME_WINDOW_S, tag);
        match await_scraped(ports, Duration::from_secs(40)) {
            Ok(()) => return sampling,
            Err(e) => {
                eprintln!("[sglang_real] {tag}: try {i}/3: {e}");
                why = e;
            }
        }
    }
    panic!("{tag}: no snapshot scraped the engines: {why}");
}

/// Snapshots until `check` passes (a loaded machine may cut a window's dumps short), at most
/// `tries`, each window 2 s longer than the one before; the passing snapshot, or a panic with
/// the last reason.
fn snapshot_until(
    dir: &Path,
    extra: &[&str],
    tag: &str,
    tries: usize,
    check: impl Fn(&Value) -> Result<(), String>,
) -> Value {
    let mut why = String::new();
    let mut window = 3;
    for i in 1..=tries {
        match try_snapshot(dir, window, extra, tag).and_then(|s| check(&s).map(|()| s)) {
            Ok(snap) => return snap,
            Err(e) => {
                eprintln!("[sglang_real] {tag}: try {i}/{tries} ({window} s window): {e}");
                why = e;
                window += 2;
            }
        }
    }
    panic!("{tag}: not seen in {tries} snapshots: {why}");
}

fn component_where<'a>(snap: &'a Value, what: &str, pred: impl Fn(&Value) -> bool) -> &'a Value {
    snap["components"]
        .as_array()
        .expect("components")
        .iter()
        .find(|c| pred(c))
        .unwrap_or_else(|| {
            let ids: Vec<&str> = snap["components"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|c| c["id"].as_str())
                .collect();
            panic!("no component {what}; have {ids:?}")
        })
}

/// The component whose main pid is `pid`.
fn component(snap: &Value, pid: u64) -> &Value {
    component_where(snap, &format!("with main pid {pid}"), |c| {
        c["main_pid"].as_u64() == Some(pid)
    })
}

fn component_id<'a>(snap: &'a Value, id: &str) -> &'a Value {
    component_where(snap, id, |c| c["id"].as_str() == Some(id))
}

/// The states of the main thread of `pid` over the window's dumps.
fn main_thread_states(snap: &Value, pid: u64) -> Vec<String> {
    snap["threads"]
        .as_array()
        .expect("threads")
        .iter()
        .filter(|t| t["pid"].as_u64() == Some(pid) && t["name"] == "MainThread")
        .flat_map(|t| match &t["states_over_window"] {
            Value::Array(a) if !a.is_empty() => a
                .iter()
                .filter_map(|s| s.as_str().map(str::to_string))
                .collect::<Vec<_>>(),
            _ => t["state"]
                .as_str()
                .map(str::to_string)
                .into_iter()
                .collect(),
        })
        .collect()
}

fn threads_text(snap: &Value, pid: u64) -> String {
    snap["threads"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|t| t["pid"].as_u64() == Some(pid) && t["name"] == "MainThread")
        .map(|t| {
            let frames: Vec<&str> = t["frames"]
                .as_array()
                .into_iter()
                .flatten()
                .take(6)
                .filter_map(|x| x.as_str())
                .collect();
            format!("  {}: {}", t["state"], frames.join(" <- "))
        })
        .collect::<Vec<_>>()
        .join("\n")
}

fn metric(comp: &Value, name: &str) -> Option<f64> {
    comp["metrics"][name].as_f64()
}

fn findings_at<'a>(snap: &'a Value, comp_id: &str) -> Vec<&'a Value> {
    snap["findings"]
        .as_array()
        .expect("findings")
        .iter()
        .filter(|f| f["component"].as_str() == Some(comp_id))
        .collect()
}

fn summaries(fs: &[&Value]) -> String {
    fs.iter()
        .map(|f| {
            format!(
                "  {} {} {}: {}",
                f["severity"], f["kind"], f["component"], f["summary"]
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

fn listens(comp: &Value, addr: &str) -> bool {
    comp["listen"]
        .as_array()
        .is_some_and(|l| l.iter().any(|a| a.as_str() == Some(addr)))
}

/// The pids the checks look at, read once from the stack's record.
struct Pids {
    router: u64,
    prefill: u64,
    decode: u64,
    prefill_sched: u64,
    decode_tp0: u64,
    decode_tp1: u64,
}

impl Pids {
    fn of(st: &Stack) -> Pids {
        Pids {
            router: st.pid("router"),
            prefill: st.pid("prefill"),
            decode: st.pid("decode"),
            prefill_sched: st.child("prefill", "sglang::scheduler"),
            decode_tp0: st.child("decode", "sglang::scheduler_TP0"),
            decode_tp1: st.child("decode", "sglang::scheduler_TP1"),
        }
    }
}

/// Idle stacks: decode's TP ranks wait in `broadcast_pyobj` (rank 0 too: it broadcasts the
/// requests it has not got), the prefill's scheduler runs its idle bookkeeping.
fn check_idle_stacks(snap: &Value, p: &Pids) -> Result<(), String> {
    for (what, pid) in [("decode TP0", p.decode_tp0), ("decode TP1", p.decode_tp1)] {
        let st = main_thread_states(snap, pid);
        if st.is_empty() || st.iter().any(|s| s != "gloo_collective") {
            return Err(format!(
                "idle {what}: {st:?} (stacks: {})\n{}",
                snap["sources"]["stacks"],
                threads_text(snap, pid)
            ));
        }
    }
    let st = main_thread_states(snap, p.prefill_sched);
    if !st.iter().any(|s| s == "idle") || st.iter().any(|s| FORWARD.contains(&s.as_str())) {
        return Err(format!(
            "idle prefill scheduler: {st:?}\n{}",
            threads_text(snap, p.prefill_sched)
        ));
    }
    Ok(())
}

/// Discovery of the whole pair from the idle snapshot.
fn check_discovery(snap: &Value, st: &Stack, p: &Pids) {
    let router = component(snap, p.router);
    assert_eq!(
        (router["stack"].as_str(), router["role"].as_str()),
        (Some("sglang"), Some("router")),
        "{router}"
    );
    for port in [st.port("router"), st.port("router_metrics")] {
        assert!(listens(router, &format!("127.0.0.1:{port}")), "{router}");
    }
    let workers = router["labels"]["workers"].as_str().unwrap_or_default();
    for server in ["prefill", "decode"] {
        let url = format!("http://127.0.0.1:{}", st.port(server));
        assert!(
            workers.contains(&url),
            "router workers {workers:?} lack {url}"
        );
    }
    let prefill = component(snap, p.prefill);
    let decode = component(snap, p.decode);
    for (c, role, tp) in [(prefill, "prefill", "1"), (decode, "decode", "2")] {
        assert_eq!(
            (
                c["stack"].as_str(),
                c["role"].as_str(),
                c["labels"]["tp"].as_str()
            ),
            (Some("sglang"), Some(role), Some(tp)),
            "{c}"
        );
    }
    // PD pairing: the prefill's bootstrap port, from its flags, and listened on.
    let bp = st.port("bootstrap");
    assert_eq!(
        prefill["labels"]["bootstrap_port"].as_str(),
        Some(bp.to_string().as_str()),
        "{prefill}"
    );
    assert!(listens(prefill, &format!("127.0.0.1:{bp}")), "{prefill}");
    let (pid_, did) = (id_of(prefill), id_of(decode));
    let children = [
        (format!("scheduler@{pid_}"), p.prefill_sched, "scheduler"),
        (format!("scheduler_TP0@{did}"), p.decode_tp0, "scheduler"),
        (format!("scheduler_TP1@{did}"), p.decode_tp1, "scheduler"),
        (format!("detokenizer@{pid_}"), 0, "detokenizer"),
        (format!("detokenizer@{did}"), 0, "detokenizer"),
    ];
    for (id, pid, role) in children {
        let k = component_id(snap, &id);
        assert_eq!(k["role"].as_str(), Some(role), "{k}");
        if pid != 0 {
            assert_eq!(k["main_pid"].as_u64(), Some(pid), "{k}");
        }
    }
}

fn id_of(c: &Value) -> String {
    c["id"].as_str().expect("component id").to_string()
}

/// The real exposition mapped, idle (after `up`'s warm-up).
fn check_idle_metrics(snap: &Value, p: &Pids) -> Result<(), String> {
    let decode = component(snap, p.decode);
    let prefill = component(snap, p.prefill);
    for (c, names) in [
        (
            decode,
            &[
                "running",
                "queued",
                "decode_prealloc_queue",
                "decode_transfer_queue",
            ][..],
        ),
        (
            prefill,
            &[
                "running",
                "queued",
                "prefill_bootstrap_queue",
                "prefill_inflight_queue",
            ][..],
        ),
    ] {
        for name in names {
            check(metric(c, name) == Some(0.0), || {
                format!("{} {name} is not 0: {}", c["id"], c["metrics"])
            })?;
        }
    }
    for name in ["generation_tokens_total", "requests_total"] {
        check(metric(decode, name).is_some_and(|v| v >= 1.0), || {
            format!("decode {name}: {}", decode["metrics"])
        })?;
    }
    check(
        metric(prefill, "kv_transfers_total").is_some_and(|v| v >= 1.0),
        || format!("prefill kv_transfers_total: {}", prefill["metrics"]),
    )
}

/// Streams of `tokens` through the router from `clients` threads until `stop`.
fn load(
    port: u16,
    model: &str,
    clients: usize,
    tokens: u32,
    stop: &Arc<AtomicBool>,
) -> Vec<std::thread::JoinHandle<()>> {
    (0..clients)
        .map(|i| {
            let (stop, model) = (stop.clone(), model.to_string());
            std::thread::spawn(move || {
                let t0 = Instant::now();
                while !stop.load(Ordering::Relaxed) && t0.elapsed() < Duration::from_secs(900) {
                    chat(
                        port,
                        &chat_body(&model, tokens, i),
                        Duration::from_secs(120),
                    );
                }
            })
        })
        .collect()
}

/// Phase 2: load; a running request and a forward pass seen; then the healthy negative after
/// `HEALTHY_AFTER` of traffic. Returns what the healthy negative found (empty = none).
fn generating_then_healthy(dir: &Path, st: &Stack, p: &Pids) -> Vec<Value> {
    let stop = Arc::new(AtomicBool::new(false));
    let t_load = Instant::now();
    let threads = load(st.port("router"), &st.model(), 2, 48, &stop);
    let (mut saw_running, mut saw_forward) = (false, false);
    for i in 1..=GENERATING_TRIES {
        if saw_running && saw_forward {
            break;
        }
        let snap = match try_snapshot(dir, 3, &[], "generating") {
            Ok(s) => s,
            Err(e) => {
                eprintln!("[sglang_real] generating: try {i}/{GENERATING_TRIES}: {e}");
                continue;
            }
        };
        let d = component(&snap, p.decode);
        saw_running |= metric(d, "running").is_some_and(|v| v >= 1.0);
        for pid in [p.decode_tp0, p.decode_tp1] {
            let states = main_thread_states(&snap, pid);
            saw_forward |= states.iter().any(|s| FORWARD.contains(&s.as_str()));
            eprintln!(
                "[sglang_real] generating: try {i}: decode rank {pid}: {states:?}, running {:?}",
                metric(d, "running")
            );
        }
    }
    assert!(
        saw_running,
        "generating: no snapshot saw a running request at decode"
    );
    assert!(
        saw_forward,
        "generating: no snapshot saw a decode rank in a forward pass"
    );
    if let Some(rest) = HEALTHY_AFTER.checked_sub(t_load.elapsed()) {
        std::thread::sleep(rest);
    }
    let snap = try_snapshot(dir, 3, &[], "healthy").expect("healthy snapshot");
    stop.store(true, Ordering::Relaxed);
    for h in threads {
        let _ = h.join();
    }
    let findings = snap["findings"].as_array().cloned().unwrap_or_default();
    eprintln!(
        "[sglang_real] healthy negative after {:.0}s of traffic: {} finding(s)",
        t_load.elapsed().as_secs_f64(),
        findings.len()
    );
    findings
}

/// The router serves a short chat again (after a phase that held decode), bounded.
fn await_serving(st: &Stack, what: &str) {
    let t0 = Instant::now();
    loop {
        let got = chat(
            st.port("router"),
            &chat_body(&st.model(), 2, 7),
            Duration::from_secs(60),
        );
        let text = String::from_utf8_lossy(&got);
        if text.starts_with("HTTP/1.1 200") && text.contains("data: [DONE]") {
            eprintln!(
                "[sglang_real] {what}: the router serves again after {:.1}s",
                t0.elapsed().as_secs_f64()
            );
            return;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(180),
            "{what}: the router does not serve again: {text:?}\n{}",
            st.log_tail("decode")
        );
        std::thread::sleep(Duration::from_secs(2));
    }
}

/// The finding of `kind` at `comp`, or why not (the snapshot's findings listed).
fn finding_at<'a>(snap: &'a Value, comp: &str, kind: &str) -> Result<&'a Value, String> {
    findings_at(snap, comp)
        .into_iter()
        .find(|f| f["kind"] == kind)
        .ok_or_else(|| {
            format!(
                "no {kind} at {comp}; the findings:\n{}",
                all_summaries(snap)
            )
        })
}

fn all_summaries(snap: &Value) -> String {
    summaries(
        &snap["findings"]
            .as_array()
            .expect("findings")
            .iter()
            .collect::<Vec<_>>(),
    )
}

/// `Err(what)` unless `ok`.
fn check(ok: bool, what: impl FnOnce() -> String) -> Result<(), String> {
    if ok {
        Ok(())
    } else {
        Err(what())
    }
}

/// No `wedged_request` ("accepted and forgotten") at `comp`.
fn not_forgotten(snap: &Value, comp: &str) -> Result<(), String> {
    let wrong: Vec<&Value> = findings_at(snap, comp)
        .into_iter()
        .filter(|f| f["kind"] == "wedged_request")
        .collect();
    check(wrong.is_empty(), || {
        format!("accepted and forgotten at {comp}:\n{}", summaries(&wrong))
    })
}

/// Phase 3, a stuck detokenizer: decode's detokenizer holds its next batch (the gate file)
/// while two streams go through the router. Decode's schedulers generate their tokens, not
/// one byte reaches a client; a snapshot whose window started before the requests says
/// `tokens_undelivered` at decode naming its detokenizer, not "accepted and forgotten".
/// Then the gate goes and both streams finish. The judgement's checks are the `Err` (the
/// test goes on to the next phases and fails at the end); the stack's own failures panic.
fn stuck_detokenizer(dir: &Path, st: &Stack, p: &Pids) -> Result<(), String> {
    let detok = st.child("decode", "sglang::detokenizer");
    std::fs::write(st.gate(), b"held by tests/sglang_real.rs\n").expect("gate file");
    let sampling = watching(dir, "undelivered", &[st.port("decode")]);
    let mut streams: Vec<TcpStream> = (200..202)
        .map(|round| send_chat(st.port("router"), &chat_body(&st.model(), 16, round)))
        .collect();
    let sent = Instant::now();
    let snap = sampling.finish();
    // Not one byte reached a client while the detokenizer held its batch.
    let got: Vec<usize> = streams
        .iter_mut()
        .map(|s| read_for(s, Duration::from_millis(500)).len())
        .collect();
    let held = sent.elapsed();
    std::fs::remove_file(st.gate()).expect("remove the gate");
    // Released, the detokenizer decodes what it held and what queued: both streams finish.
    for s in &mut streams {
        s.set_read_timeout(Some(Duration::from_secs(120)))
            .expect("timeout");
        let mut rest = Vec::new();
        let _ = s.read_to_end(&mut rest);
        let text = String::from_utf8_lossy(&rest);
        assert!(
            text.starts_with("HTTP/1.1 200") && text.contains("data: [DONE]"),
            "a released stream finishes: {text:?}\n{}",
            st.log_tail("decode")
        );
    }
    let snap = snap.expect("undelivered snapshot");
    eprintln!(
        "[sglang_real] stuck detokenizer (held {:.0}s; the clients got {got:?} bytes):\n{}",
        held.as_secs_f64(),
        all_summaries(&snap)
    );
    check(got == [0, 0], || {
        format!("bytes reached the clients while held: {got:?}")
    })?;
    let did = id_of(component(&snap, p.decode));
    let f = finding_at(&snap, &did, "tokens_undelivered")?;
    check(f["role"] == "detokenizer", || format!("{f}"))?;
    let summary = f["summary"].as_str().unwrap_or_default();
    for want in [
        "2 requests accepted".to_string(),
        format!("in its detokenizer (pid {detok})"),
        format!("(the HTTP process, pid {})", p.decode),
    ] {
        check(summary.contains(&want), || {
            format!("{want} missing: {summary}")
        })?;
    }
    not_forgotten(&snap, &did)
}

/// Phase 4, one PD leg fails: the prefill (context `PREFILL_CONTEXT`) refuses a long prompt
/// with a 400 while decode (the model's 1024) accepts the same request and waits for KV that
/// will not come; the router holds the client. A snapshot whose window started before it
/// says `pd_leg_failed` at prefill naming decode and the router. Checks as in phase 3.
fn failed_prefill_leg(dir: &Path, st: &Stack, p: &Pids) -> Result<(), String> {
    let sampling = watching(dir, "pd-leg", &[st.port("prefill"), st.port("decode")]);
    let body = serde_json::json!({
        "model": st.model(), "max_tokens": 8, "ignore_eos": true, "stream": true,
        "temperature": 0,
        "messages": [{"role": "user", "content": vec!["w"; LONG_PROMPT_WORDS].join(" ")}],
    })
    .to_string();
    let mut client = send_chat(st.port("router"), &body);
    let snap = sampling.finish().expect("pd-leg snapshot");
    let got = read_for(&mut client, Duration::from_millis(500));
    let prefill = id_of(component(&snap, p.prefill));
    let decode = id_of(component(&snap, p.decode));
    let router = id_of(component(&snap, p.router));
    eprintln!(
        "[sglang_real] failed prefill leg; the client got {:?}; decode queues {} / {}:\n{}",
        String::from_utf8_lossy(&got),
        component(&snap, p.decode)["metrics"]["decode_prealloc_queue"],
        component(&snap, p.decode)["metrics"]["decode_transfer_queue"],
        all_summaries(&snap)
    );
    drop(client);
    let f = finding_at(&snap, &prefill, "pd_leg_failed")?;
    let summary = f["summary"].as_str().unwrap_or_default();
    for want in [
        format!("1 PD request failed at {prefill} (answered an error)"),
        format!("waits at {decode} for KV that will not come"),
        format!("{router} holds the client"),
    ] {
        check(summary.contains(&want), || {
            format!("{want} missing: {summary}")
        })?;
    }
    not_forgotten(&snap, &decode)?;
    check(got.is_empty(), || {
        format!(
            "the router answered the client: {:?}",
            String::from_utf8_lossy(&got)
        )
    })
}

/// Phase 5: the forgotten requests at decode, against the baseline.
fn the_incident(dir: &Path, st: &mut Stack, baseline: &Path) {
    st.restart_decode(&format!("{FAULT_VAR}={FAULT_VALUE}"));
    let p = Pids::of(st);
    // Through a proxy in front of the router, as the incident's agents were.
    let proxy = Proxy::start(dir, st.port("router"));
    let (port, model) = (proxy.port, st.model());
    let mut hung: Vec<TcpStream> = Vec::new();
    for round in 100..102 {
        let mut s = send_chat(port, &chat_body(&model, 8, round));
        let got = read_for(&mut s, Duration::from_secs(2));
        let text = String::from_utf8_lossy(&got);
        assert!(
            !text.contains("data: [DONE]"),
            "a forgotten stream must not finish: {text:?}\n{}",
            st.log_tail("decode")
        );
        hung.push(s);
    }
    let hung_at = Instant::now();
    // thresholds-fast: wedged after 8 s; the snapshot's window ends past it.
    std::thread::sleep(Duration::from_secs(6));
    let base = baseline.to_str().expect("utf-8").to_string();
    let snap = snapshot_until(dir, &["--baseline", &base], "faulted", 3, |snap| {
        let did = id_of(component(snap, p.decode));
        let fs = findings_at(snap, &did);
        if fs.iter().any(|f| f["kind"] == "wedged_request") {
            Ok(())
        } else {
            Err(format!("no wedged_request at {did}:\n{}", summaries(&fs)))
        }
    });
    assert!(
        hung_at.elapsed() >= Duration::from_secs(8),
        "{:?}",
        hung_at.elapsed()
    );
    let did = id_of(component(&snap, p.decode));
    let fs = findings_at(&snap, &did);
    eprintln!(
        "[sglang_real] faulted:\n{}",
        summaries(
            &snap["findings"]
                .as_array()
                .expect("findings")
                .iter()
                .collect::<Vec<_>>()
        )
    );
    let wedged = fs
        .iter()
        .find(|f| f["kind"] == "wedged_request")
        .expect("wedged_request at decode");
    let summary = wedged["summary"].as_str().unwrap_or_default();
    assert!(summary.starts_with("2 requests"), "{summary}");
    // Each stuck request's path starts at the proxy and ends at decode.
    let paths: Vec<&str> = wedged["evidence"]
        .as_array()
        .expect("evidence")
        .iter()
        .filter_map(|e| e["detail"].as_str()?.split_once("path: ").map(|(_, p)| p))
        .collect();
    assert_eq!(paths.len(), 2, "{wedged}");
    for path in paths {
        assert!(
            path.starts_with("proxy@") && path.contains("router@") && path.contains(&did),
            "{path}"
        );
    }
    let changed = fs
        .iter()
        .find(|f| f["kind"] == "config_changed")
        .unwrap_or_else(|| panic!("no config_changed at {did}:\n{}", summaries(&fs)));
    assert!(changed.to_string().contains(FAULT_VAR), "{changed}");
    // `diff` exits 1 on differences (README "Exit status"), like diff(1).
    let faulted = dir.join("snap-faulted.json");
    let out = Command::new(env!("CARGO_BIN_EXE_wedgewatch"))
        .arg("diff")
        .arg(baseline)
        .arg(&faulted)
        .output()
        .expect("run wedgewatch diff");
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "diff: {text}");
    assert!(
        text.lines()
            .any(|l| l.trim() == format!("+ env {FAULT_VAR}={FAULT_VALUE}")),
        "diff names {FAULT_VAR}:\n{text}"
    );
    drop(hung);
    drop(proxy);
}

#[test]
fn real_sglang_pd_discovery_metrics_stacks_and_the_incident() {
    if skipped() {
        return;
    }
    let t_all = Instant::now();
    let dir = std::env::temp_dir().join(format!("ww-sglang-real-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("run dir");
    let mut setup = Command::new("python3");
    setup.arg(sglang_lab()).arg("setup");
    let (ok, out, err) = run_bounded(setup, Duration::from_secs(2400), &dir.join("setup.out"));
    assert!(
        ok,
        "sglang_lab.py setup failed (WEDGEWATCH_SKIP_SGLANG=1 skips this tier):\n{err}"
    );
    eprintln!("[sglang_real] setup: {}", out.trim());
    // its stack is seen by every discovery: a test that sees every stack waits for it
    let _stacks = lab::shared();

    let mut st = Stack::up(&dir);
    let p = Pids::of(&st);
    // Decode publishes its scheduler gauges at its first batch report or after 30 s idle:
    // the baseline waits for them (windows of 3, 5, ... 13 s).
    let base = snapshot_until(&dir, &[], "baseline", 6, |s| {
        check_idle_stacks(s, &p).and_then(|()| check_idle_metrics(s, &p))
    });
    check_discovery(&base, &st, &p);
    let baseline = dir.join("snap-baseline.json");
    let healthy_findings = generating_then_healthy(&dir, &st, &p);
    let t_blame = Instant::now();
    let undelivered = stuck_detokenizer(&dir, &st, &p);
    await_serving(&st, "after the stuck detokenizer");
    let leg_failed = failed_prefill_leg(&dir, &st, &p);
    eprintln!(
        "[sglang_real] blame past the hop (stuck detokenizer, failed prefill leg): {:.1}s",
        t_blame.elapsed().as_secs_f64()
    );
    the_incident(&dir, &mut st, &baseline);
    drop(st);
    eprintln!(
        "[sglang_real] whole test {:.1}s",
        t_all.elapsed().as_secs_f64()
    );
    // Last, so every other check has run: the two blames past the hop, then the healthy
    // negative (issue 38 made it fail on
    // decode's pooled bootstrap session).
    let blames: Vec<String> = [
        ("stuck detokenizer", undelivered),
        ("failed prefill leg", leg_failed),
    ]
    .into_iter()
    .filter_map(|(what, r)| r.err().map(|e| format!("{what}: {e}")))
    .collect();
    assert!(blames.is_empty(), "{}", blames.join("\n\n"));
    assert!(
        healthy_findings.is_empty(),
        "healthy negative: findings on a healthy pair after {HEALTHY_AFTER:?} of traffic:\n{}",
        healthy_findings
            .iter()
            .map(|f| format!("  {}: {}", f["component"], f["summary"]))
            .collect::<Vec<_>>()
            .join("\n")
    );
    if std::env::var_os("WEDGEWATCH_LAB_KEEP").is_none() {
        let _ = std::fs::remove_dir_all(&dir);
    } else {
        eprintln!("[sglang_real] kept {}", dir.display());
    }
}
