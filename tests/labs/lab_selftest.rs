//! Lab self-tests: the lab stack (tests/lab/) really shows each fault's symptom, checked
//! independently of wedgewatch with `ss -tin`, `py-spy dump --json --nonblocking`, the fake
//! NVML state files (and the fake libnvidia-ml.so through ctypes when it has been built), and
//! the engines' `/metrics` and `/v1/loads`. Every test brings up its own lab on free ports
//! and checks that `down` leaves none of its processes behind.
//!
//! Needs `tests/lab/.venv` (created on first use by `lab.py setup`).

use wedgewatch_testkit::lab;

use std::collections::BTreeMap;
use std::process::Command;
use std::thread::sleep;
use std::time::{Duration, Instant};

use lab::{http_get, metric_value, read_gpu_state, Lab, LabOptions};
use serde_json::Value;

const T: Duration = Duration::from_secs(3);

// ------------------------------------------------------------------------------ helpers

/// One TCP socket from `ss -tin`.
#[derive(Debug, Clone)]
#[allow(dead_code)] // local/peer are read through Debug in assertion messages
struct SsConn {
    state: String,
    local: String,
    peer: String,
    info: BTreeMap<String, String>,
    process: String,
}

impl SsConn {
    fn num(&self, key: &str) -> u64 {
        self.info.get(key).and_then(|v| v.parse().ok()).unwrap_or(0)
    }
}

/// `ss -tinp` with a filter expression, e.g. `dport = :8080`. (No `state` filter: with one,
/// ss drops the State column.)
fn ss(filter: &str) -> Vec<SsConn> {
    let out = Command::new("ss")
        .args(["-tinpH"])
        .args(filter.split_whitespace())
        .output()
        .expect("run ss");
    assert!(out.status.success(), "ss failed: {out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    let mut conns: Vec<SsConn> = Vec::new();
    for line in text.lines() {
        if line.starts_with(char::is_whitespace) {
            if let Some(c) = conns.last_mut() {
                for tok in line.split_whitespace() {
                    if let Some((k, v)) = tok.split_once(':') {
                        c.info.insert(k.to_string(), v.to_string());
                    }
                }
            }
        } else {
            let f: Vec<&str> = line.split_whitespace().collect();
            if f.len() >= 5 {
                conns.push(SsConn {
                    state: f[0].to_string(),
                    local: f[3].to_string(),
                    peer: f[4].to_string(),
                    info: BTreeMap::new(),
                    process: f[5..].join(" "),
                });
            }
        }
    }
    conns
}

/// Frame names of the main thread of `pid` (innermost first), via py-spy --nonblocking.
/// A `--nonblocking` read can race the interpreter ("Failed to get stack traces"); like the
/// stacks source, try again (here up to three times).
fn pyspy_main_frames(pid: u32) -> Vec<String> {
    let dump = || {
        Command::new(lab::venv_bin("py-spy"))
            .args(["dump", "--json", "--nonblocking", "--pid", &pid.to_string()])
            .env_remove("RUST_BACKTRACE")
            .output()
            .expect("run py-spy")
    };
    let mut out = dump();
    for _ in 0..2 {
        let raced = String::from_utf8_lossy(&out.stderr).contains("Failed to get stack traces");
        if out.status.success() || !raced {
            break;
        }
        out = dump();
    }
    assert!(
        out.status.success(),
        "py-spy dump {pid} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let threads: Value = serde_json::from_slice(&out.stdout).expect("py-spy JSON");
    let main = threads
        .as_array()
        .expect("thread array")
        .iter()
        .find(|t| t["os_thread_id"].as_u64() == Some(u64::from(pid)))
        .or_else(|| threads.as_array().and_then(|a| a.first()))
        .expect("a thread")
        .clone();
    main["frames"]
        .as_array()
        .expect("frames")
        .iter()
        .map(|f| f["name"].as_str().unwrap_or_default().to_string())
        .collect()
}

/// py-spy names methods by qualified name (`Scheduler.on_idle`); match either form.
fn has(frames: &[String], name: &str) -> bool {
    let dotted = format!(".{name}");
    frames.iter().any(|f| f == name || f.ends_with(&dotted))
}

fn metrics(url: &str) -> String {
    let (status, body) = http_get(url, T).unwrap_or_else(|e| panic!("GET {url}: {e}"));
    assert_eq!(status, 200, "GET {url}");
    body
}

fn loads(engine_url: &str) -> Value {
    let (status, body) = http_get(&format!("{engine_url}/v1/loads"), T).expect("GET /v1/loads");
    assert_eq!(status, 200);
    let v: Value = serde_json::from_str(&body).expect("loads JSON");
    v["loads"][0].clone()
}

fn now_s() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

fn chat_active(m: &str) -> f64 {
    metric_value(
        m,
        "sglang:http_requests_active",
        &[("endpoint", "/v1/chat/completions"), ("method", "POST")],
    )
    .unwrap_or(0.0)
}

/// Poll `cond` every 100 ms until true or `limit` passes. Limits are generous: the lab runs
/// beside the rest of the suite on 2 cores, and a slow poll is not a lab fault.
fn wait_until(limit: Duration, what: &str, mut cond: impl FnMut() -> bool) {
    let t0 = Instant::now();
    while !cond() {
        assert!(
            t0.elapsed() < limit,
            "timed out after {limit:?} waiting for {what}"
        );
        sleep(Duration::from_millis(100));
    }
}

fn gpu_util_power(lab: &Lab, index: u32) -> (u64, u64) {
    let g = read_gpu_state(lab.nvml_dir(), index);
    let n = |k: &str| g.get(k).and_then(|v| v.parse().ok()).unwrap_or(u64::MAX);
    (n("util.gpu"), n("power.mw"))
}

fn assert_all_gone(pids: &[u32]) {
    let left: Vec<u32> = pids
        .iter()
        .copied()
        .filter(|p| lab::pid_alive(*p))
        .collect();
    assert!(left.is_empty(), "processes left after down: {left:?}");
}

fn down_and_check(mut lab: Lab) {
    let pids = lab.seen_pids.clone();
    lab.down().expect("down");
    assert_all_gone(&pids);
}

/// Established client connections to the proxy (the harness side).
fn client_conns(lab: &Lab) -> Vec<SsConn> {
    ss(&format!("dport = :{}", lab.proxy().port))
        .into_iter()
        .filter(|c| c.state == "ESTAB")
        .collect()
}

/// Optional: read the GPU through the fake libnvidia-ml.so when the other helper's C file
/// has been merged (build.rs sets FAKE_NVML_PATH to "" otherwise).
fn nvml_lib_util_power(lab: &Lab, index: u32) -> Option<(u64, u64)> {
    let lib = env!("FAKE_NVML_PATH");
    if lib.is_empty() {
        return None;
    }
    let script = format!(
        r#"
import ctypes, sys
n = ctypes.CDLL({lib:?})
assert n.nvmlInit_v2() == 0
h = ctypes.c_void_p()
assert n.nvmlDeviceGetHandleByIndex_v2({index}, ctypes.byref(h)) == 0
class U(ctypes.Structure): _fields_ = [("gpu", ctypes.c_uint), ("memory", ctypes.c_uint)]
u = U(); p = ctypes.c_uint()
assert n.nvmlDeviceGetUtilizationRates(h, ctypes.byref(u)) == 0
assert n.nvmlDeviceGetPowerUsage(h, ctypes.byref(p)) == 0
print(u.gpu, p.value)
"#
    );
    let out = Command::new("python3")
        .args(["-c", &script])
        .env("FAKE_NVML_DIR", lab.nvml_dir())
        .output()
        .expect("python3");
    assert!(
        out.status.success(),
        "fake NVML caller failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let s = String::from_utf8_lossy(&out.stdout);
    let mut it = s
        .split_whitespace()
        .map(|x| x.parse::<u64>().unwrap_or(u64::MAX));
    Some((it.next()?, it.next()?))
}

fn agents(report: &Value) -> Vec<Value> {
    report["agents"].as_array().cloned().unwrap_or_default()
}

// ------------------------------------------------------------------------------ tests

#[test]
fn healthy_pd_stack_completes_every_round_and_looks_like_sglang() {
    let lab = Lab::up(&LabOptions::pd()).expect("lab up");
    let decode = lab.decode().clone();
    let prefill = lab.prefill().clone();

    // Process shape: untitled HTTP process with the real cmdline, titled children.
    let cmd = std::fs::read_to_string(format!("/proc/{}/cmdline", decode.pid)).unwrap();
    assert!(
        cmd.contains("sglang.launch_server") && cmd.contains("decode"),
        "{cmd:?}"
    );
    assert_eq!(decode.scheduler_pids.len(), 1);
    let sched = decode.scheduler_pids[0];
    let title = std::fs::read_to_string(format!("/proc/{sched}/cmdline")).unwrap();
    assert!(title.starts_with("sglang::scheduler"), "{title:?}");
    let det = decode.detokenizer_pid.expect("detokenizer");
    let title = std::fs::read_to_string(format!("/proc/{det}/cmdline")).unwrap();
    assert!(title.starts_with("sglang::detokenizer"), "{title:?}");
    let rtitle = std::fs::read_to_string(format!("/proc/{}/comm", lab.router().pid)).unwrap();
    assert!(
        rtitle.starts_with("sglang::router"),
        "real router title: {rtitle:?}"
    );

    // While agents run: py-spy sees the forward, the decode GPU is busy at high power.
    let run = lab.load_background(3, 4, 8.0).expect("load");
    let (mut saw_forward, mut saw_busy) = (false, false);
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(6) && !(saw_forward && saw_busy) {
        let f = pyspy_main_frames(sched);
        if has(&f, "forward")
            && has(&f, "forward_batch_generation")
            && has(&f, "run_batch")
            && has(&f, "event_loop_normal_disagg_decode")
        {
            saw_forward = true;
        }
        let g = read_gpu_state(lab.nvml_dir(), 1);
        let util: u64 = g["util.gpu"].parse().unwrap();
        let power: u64 = g["power.mw"].parse().unwrap();
        if util >= 90 && power >= 400_000 {
            assert!(g["procs"].starts_with(&format!("{sched}:")), "{g:?}");
            saw_busy = true;
        }
        sleep(Duration::from_millis(30));
    }
    let report = run.wait().expect("report");
    assert!(saw_forward, "py-spy never saw the decode forward");
    assert!(saw_busy, "decode GPU never read busy");
    assert_eq!(report["summary"]["all_completed"], true, "{report}");
    for a in agents(&report) {
        assert_eq!(a["rounds_completed"], 4, "{a}");
    }

    // Metrics: real names and labels, counters moved, nothing in flight afterwards.
    let m = metrics(decode.metrics_url.as_deref().unwrap());
    let lbl = [
        ("engine_type", "decode"),
        ("model_name", "lab-model"),
        ("tp_rank", "0"),
    ];
    assert!(metric_value(&m, "sglang:num_requests_total", &[]).unwrap() >= 12.0);
    assert!(
        metric_value(
            &m,
            "sglang:forward_execution_seconds_total",
            &[("category", "decode"), lbl[0]]
        )
        .unwrap()
            > 0.1
    );
    assert!(metric_value(&m, "sglang:scheduler_idle_seconds_total", &lbl).is_some());
    assert!(m.contains("# TYPE sglang:num_running_reqs gauge"));
    assert_eq!(chat_active(&m), 0.0);
    let pm = metrics(prefill.metrics_url.as_deref().unwrap());
    assert!(metric_value(
        &pm,
        "sglang:num_prefill_bootstrap_queue_reqs",
        &[("engine_type", "prefill")]
    )
    .is_some());
    let rm = metrics(lab.router().metrics_url.as_deref().unwrap());
    assert!(
        rm.contains("smg_worker_requests_active"),
        "router metrics: {rm}"
    );
    wait_until(Duration::from_secs(15), "decode GPU idle", || {
        gpu_util_power(&lab, 1) == (0, 70_000)
    });
    if let Some((util, power)) = nvml_lib_util_power(&lab, 1) {
        assert_eq!((util, power), (0, 70_000));
    }
    down_and_check(lab);
}

#[test]
fn healthy_regular_mode_completes_and_idles_in_on_idle() {
    let lab = Lab::up(&LabOptions::regular()).expect("lab up");
    let report = lab.load(2, 2, 8.0).expect("load");
    assert_eq!(report["summary"]["all_completed"], true, "{report}");
    let sched = lab.engine().scheduler_pids[0];
    let f = pyspy_main_frames(sched);
    assert!(has(&f, "event_loop_normal") && has(&f, "on_idle"), "{f:?}");
    let m = metrics(lab.engine().metrics_url.as_deref().unwrap());
    assert!(metric_value(&m, "sglang:num_running_reqs", &[("engine_type", "unified")]).is_some());
    down_and_check(lab);
}

#[test]
fn accepted_and_forgotten_agents_hang_with_idle_decode() {
    let lab = Lab::up(&LabOptions::pd().decode_env("SGLANG_DECODE_PREALLOC_SPLIT_TOKENS", "100"))
        .expect("lab up");
    let decode = lab.decode().clone();
    let murl = decode.metrics_url.clone().unwrap();
    let run = lab.load_background(4, 4, 5.0).expect("load");
    // All 4 agents stuck: 4 requests active on decode and 4 client connections that have
    // not received a byte for a while (an in-flight healthy request would get tokens).
    wait_until(Duration::from_secs(15), "4 forgotten requests", || {
        chat_active(&metrics(&murl)) == 4.0
            && client_conns(&lab)
                .iter()
                .filter(|c| c.num("bytes_received") == 0 && c.num("lastrcv") >= 300)
                .count()
                == 4
    });
    sleep(Duration::from_millis(1500));

    let m = metrics(&murl);
    let lbl = [("engine_type", "decode")];
    assert_eq!(chat_active(&m), 4.0);
    assert_eq!(metric_value(&m, "sglang:num_running_reqs", &lbl), Some(0.0));
    assert_eq!(metric_value(&m, "sglang:num_queue_reqs", &lbl), Some(0.0));
    let l = loads(&decode.url);
    assert_eq!(l["num_running_reqs"], 0);
    assert_eq!(l["disaggregation"]["decode_transfer_queue_reqs"], 0);
    assert!(
        now_s() - l["timestamp"].as_f64().unwrap() < 2.0,
        "loads stale: {l}"
    );
    assert_eq!(gpu_util_power(&lab, 1), (0, 70_000));
    // The prefill leg waits too, as on the real pair (tests/fixtures/sglang-real/shapes.md
    // (e)): prefill holds the requests in its bootstrap queue until decode sends where to
    // write their KV, which a decode that dropped them never does. Measured fact about the
    // real router (0.3.2, PD): its per-worker in-flight gauge does not count requests whose
    // decode leg never sent response headers, so the router also looks idle (with headers
    // sent, e.g. a stalled stream, it does count them).
    let pm = metrics(lab.prefill().metrics_url.as_deref().unwrap());
    assert_eq!(chat_active(&pm), 4.0);
    let pl = loads(&lab.prefill().url);
    assert_eq!(
        pl["disaggregation"]["prefill_bootstrap_queue_reqs"], 4,
        "{pl}"
    );
    let rm = metrics(lab.router().metrics_url.as_deref().unwrap());
    assert_eq!(
        metric_value(
            &rm,
            "smg_worker_requests_active",
            &[("worker", &decode.url)]
        ),
        Some(0.0),
        "{rm}"
    );
    for _ in 0..3 {
        let f = pyspy_main_frames(decode.scheduler_pids[0]);
        assert!(has(&f, "on_idle") && !has(&f, "forward"), "{f:?}");
        sleep(Duration::from_millis(100));
    }
    // Client side: 4 established connections that never received a byte.
    let conns = client_conns(&lab);
    let silent: Vec<&SsConn> = conns
        .iter()
        .filter(|c| c.num("bytes_received") == 0 && c.num("lastrcv") >= 1000)
        .collect();
    assert_eq!(silent.len(), 4, "{conns:#?}");
    // Engine side: the router's connections carrying the forgotten requests are quiet.
    let eng = ss(&format!("sport = :{}", decode.port));
    let quiet = eng
        .iter()
        .filter(|c| c.state == "ESTAB" && c.num("lastsnd") >= 1000)
        .count();
    assert!(quiet >= 4, "{eng:#?}");

    let report = run.wait().expect("report");
    for a in agents(&report) {
        let done = a["rounds_completed"].as_u64().unwrap();
        assert!((1..=3).contains(&done), "{a}");
        assert_eq!(a["hung_round"].as_u64(), Some(done + 1), "{a}");
        assert_eq!(a["hung_phase"], "no_response", "{a}");
    }
    down_and_check(lab);
}

#[test]
fn stalled_stream_stops_mid_stream() {
    let lab =
        Lab::up(&LabOptions::pd().decode_env("LAB_FAULT_STALL_AFTER_TOKENS", "5")).expect("lab up");
    let murl = lab.decode().metrics_url.clone().unwrap();
    let run = lab.load_background(1, 2, 4.0).expect("load");
    wait_until(Duration::from_secs(15), "a stalled stream", || {
        client_conns(&lab)
            .iter()
            .any(|c| c.num("bytes_received") > 0 && c.num("lastrcv") >= 1000)
    });
    assert_eq!(chat_active(&metrics(&murl)), 1.0);
    assert_eq!(gpu_util_power(&lab, 1), (0, 70_000));
    let decode_url = lab.decode().url.clone();
    let rm = metrics(lab.router().metrics_url.as_deref().unwrap());
    assert_eq!(
        metric_value(
            &rm,
            "smg_worker_requests_active",
            &[("worker", &decode_url)]
        ),
        Some(1.0),
        "{rm}"
    );
    let report = run.wait().expect("report");
    let a = &agents(&report)[0];
    assert_eq!(a["hung_round"], 1, "{a}");
    assert_eq!(a["hung_phase"], "mid_stream", "{a}");
    down_and_check(lab);
}

#[test]
fn busy_without_progress_spins_in_all_reduce_at_idle_power() {
    let lab = Lab::up(&LabOptions::pd().decode_env("LAB_FAULT_SPIN", "1")).expect("lab up");
    let decode = lab.decode().clone();
    let run = lab.load_background(2, 1, 4.0).expect("load");
    wait_until(Duration::from_secs(15), "GPU spinning", || {
        gpu_util_power(&lab, 1).0 >= 99
    });
    let (util, power) = gpu_util_power(&lab, 1);
    assert!(util >= 99 && power <= 100_000, "util {util} power {power}");
    if let Some((u, p)) = nvml_lib_util_power(&lab, 1) {
        assert!(u >= 99 && p <= 100_000, "via libnvidia-ml: {u} {p}");
    }
    let f = pyspy_main_frames(decode.scheduler_pids[0]);
    assert!(has(&f, "all_reduce") && has(&f, "forward"), "{f:?}");
    // The loop is wedged: the load snapshot and forward counter stop moving.
    let t1 = loads(&decode.url)["timestamp"].as_f64().unwrap();
    let m1 = metrics(decode.metrics_url.as_deref().unwrap());
    sleep(Duration::from_millis(800));
    let t2 = loads(&decode.url)["timestamp"].as_f64().unwrap();
    let m2 = metrics(decode.metrics_url.as_deref().unwrap());
    assert_eq!(t1, t2, "load snapshot should be stale");
    let fwd = |m: &str| {
        metric_value(
            m,
            "sglang:forward_execution_seconds_total",
            &[("category", "decode")],
        )
    };
    assert_eq!(fwd(&m1), fwd(&m2));
    assert!(client_conns(&lab)
        .iter()
        .all(|c| c.num("bytes_received") == 0));
    let report = run.wait().expect("report");
    for a in agents(&report) {
        assert_eq!(a["hung_phase"], "no_response", "{a}");
    }
    down_and_check(lab);
}

#[test]
fn queue_not_draining_piles_up_in_decode_transfer_queue() {
    let lab = Lab::up(&LabOptions::pd().decode_env("LAB_FAULT_TRANSFER_STUCK_AFTER", "1"))
        .expect("lab up");
    let decode = lab.decode().clone();
    // One long request goes through (it keeps decode batches, hence gauge reports, going)...
    let long = lab
        .load_background_with(1, 1, 10.0, 120)
        .expect("long load");
    wait_until(Duration::from_secs(15), "long request decoding", || {
        gpu_util_power(&lab, 1).0 >= 90
    });
    // ...then 3 more that stick in the transfer queue.
    let stuck = lab.load_background(3, 1, 5.0).expect("stuck load");
    wait_until(
        Duration::from_secs(15),
        "3 requests in the transfer queue",
        || loads(&decode.url)["disaggregation"]["decode_transfer_queue_reqs"] == 3,
    );
    wait_until(
        Duration::from_secs(15),
        "gauges reporting the queue",
        || {
            metric_value(
                &metrics(decode.metrics_url.as_deref().unwrap()),
                "sglang:num_decode_transfer_queue_reqs",
                &[("engine_type", "decode")],
            ) == Some(3.0)
        },
    );
    let long_report = long.wait().expect("long report");
    assert_eq!(
        long_report["summary"]["all_completed"], true,
        "{long_report}"
    );
    sleep(Duration::from_millis(500));
    let l = loads(&decode.url);
    assert_eq!(l["disaggregation"]["decode_transfer_queue_reqs"], 3);
    assert!(
        now_s() - l["timestamp"].as_f64().unwrap() < 1.0,
        "loads must stay fresh"
    );
    // Stall signature: queued work, yet neither forward nor idle time accumulates.
    let murl = decode.metrics_url.clone().unwrap();
    let counters = |m: &str| {
        (
            metric_value(
                m,
                "sglang:forward_execution_seconds_total",
                &[("category", "decode")],
            ),
            metric_value(m, "sglang:scheduler_idle_seconds_total", &[]),
            metric_value(m, "sglang:num_decode_transfer_queue_reqs", &[]),
        )
    };
    let c1 = counters(&metrics(&murl));
    sleep(Duration::from_millis(600));
    let c2 = counters(&metrics(&murl));
    assert_eq!(c1, c2);
    assert_eq!(c2.2, Some(3.0));
    assert_eq!(gpu_util_power(&lab, 1), (0, 70_000));
    let mut polling = 0;
    for _ in 0..6 {
        let f = pyspy_main_frames(decode.scheduler_pids[0]);
        assert!(!has(&f, "forward"), "{f:?}");
        if has(&f, "pop_transferred") {
            polling += 1;
        }
        sleep(Duration::from_millis(60));
    }
    assert!(polling >= 1, "py-spy never caught pop_transferred");
    let report = stuck.wait().expect("stuck report");
    assert_eq!(report["summary"]["hung_agents"], 3, "{report}");
    down_and_check(lab);
}

/// The server sides of TCP connections from process `from` to process `to` (ESTAB).
fn conns_between(from: u32, to: u32) -> Vec<SsConn> {
    let all = ss("");
    let owned = |c: &SsConn, pid: u32| c.process.contains(&format!("pid={pid},"));
    all.iter()
        .filter(|c| c.state == "ESTAB" && owned(c, to))
        .filter(|c| {
            all.iter()
                .any(|o| o.local == c.peer && o.peer == c.local && owned(o, from))
        })
        .map(|c| SsConn {
            state: c.state.clone(),
            local: c.local.clone(),
            peer: c.peer.clone(),
            info: c.info.clone(),
            process: c.process.clone(),
        })
        .collect()
}

/// KV pages travel from prefill's scheduler to each decode rank over TCP (24-byte header and
/// pages per slice, 8 bytes back each), and decode's request waits for them: with the
/// prefill's transfer worker stopped mid-slice after two transfers, later requests stay in
/// prefill's inflight queue and decode's transfer queue, both legs silent, the stream silent.
#[test]
fn kv_pages_travel_over_tcp_and_a_stalled_sender_holds_both_legs() {
    let lab = Lab::up(
        &LabOptions::pd()
            .tp_size(2)
            .prefill_env("LAB_FAULT_KV_SEND_STALL_AFTER", "2"),
    )
    .expect("lab up");
    let (prefill, decode) = (lab.prefill().clone(), lab.decode().clone());
    let sender = prefill.scheduler_pids[0];
    let run = lab.load_background(3, 3, 6.0).expect("load");
    // Two held on each side at once: a transfer takes milliseconds, so only a stalled one
    // keeps the next behind it.
    wait_until(
        Duration::from_secs(30),
        "both sides holding requests",
        || {
            let (p, d) = (loads(&prefill.url), loads(&decode.url));
            p["disaggregation"]["prefill_inflight_queue_reqs"].as_u64() >= Some(2)
                && d["disaggregation"]["decode_transfer_queue_reqs"].as_u64() >= Some(2)
        },
    );
    let mut before = Vec::new();
    for &rank in &decode.scheduler_pids {
        let kv: Vec<SsConn> = conns_between(sender, rank)
            .into_iter()
            .filter(|c| c.num("bytes_received") >= 4096)
            .collect();
        assert!(!kv.is_empty(), "no KV stream into rank pid {rank}");
        for c in &kv {
            let (got, acked) = (c.num("bytes_received"), c.num("bytes_acked"));
            assert!(acked > 0 && acked % 8 == 0 && got >= 8 * acked, "{c:?}");
        }
        before.extend(
            kv.iter()
                .map(|c| (c.local.clone(), c.peer.clone(), c.num("bytes_received"))),
        );
    }
    sleep(Duration::from_secs(3));
    for (local, peer, got) in before {
        // (The pooled connections share the listen port: one is told by its peer.)
        let c = ss(&format!("sport = :{}", local.rsplit(':').next().unwrap()))
            .into_iter()
            .find(|c| c.local == local && c.peer == peer)
            .expect("stream still open");
        assert_eq!(
            c.num("bytes_received"),
            got,
            "the stalled stream moved: {c:?}"
        );
        assert!(c.num("lastrcv") >= 2000, "{c:?}");
    }
    // Both legs of the held requests are open and silent at their engines.
    assert!(chat_active(&metrics(prefill.metrics_url.as_deref().unwrap())) >= 1.0);
    assert!(chat_active(&metrics(decode.metrics_url.as_deref().unwrap())) >= 1.0);
    let report = run.wait().expect("report");
    assert_ne!(report["summary"]["all_completed"], true, "{report}");
    down_and_check(lab);
}

#[test]
fn endpoint_unresponsive_metrics_accepts_and_never_answers() {
    let lab = Lab::up(&LabOptions::pd().decode_env("LAB_FAULT_HANG_METRICS", "1")).expect("lab up");
    let decode = lab.decode().clone();
    let err = http_get(
        &format!("{}/metrics", decode.url),
        Duration::from_millis(1500),
    )
    .expect_err("metrics must hang");
    assert!(
        err.contains("timed out")
            || err.contains("Resource temporarily")
            || err.contains("would block"),
        "expected a timeout after connecting, got {err}"
    );
    let (st, _) = http_get(&format!("{}/health", decode.url), T).unwrap();
    assert_eq!(st, 200);
    // Serving still works; only the scrape endpoint hangs.
    let report = lab.load(1, 1, 8.0).expect("load");
    assert_eq!(report["summary"]["all_completed"], true, "{report}");
    let (st, _) = http_get(&format!("{}/metrics", lab.prefill().url), T).unwrap();
    assert_eq!(st, 200);
    down_and_check(lab);
}

#[test]
fn accumulating_state_proxy_leaks_until_it_stops_forwarding() {
    let mut lab = Lab::up(
        &LabOptions::pd()
            .proxy_env("LAB_PROXY_LEAK", "1")
            .proxy_env("LAB_PROXY_LEAK_LIMIT", "4"),
    )
    .expect("lab up");
    let report = lab.load(2, 4, 3.0).expect("load");
    let done: u64 = agents(&report)
        .iter()
        .map(|a| a["rounds_completed"].as_u64().unwrap())
        .sum();
    assert_eq!(done, 4, "{report}");
    assert_eq!(report["summary"]["hung_agents"], 2, "{report}");
    let router_port = lab.router().port;
    let old_pid = lab.proxy().pid;
    let leaked = |pid: u32| {
        ss(&format!("dport = :{router_port}"))
            .iter()
            .filter(|c| c.process.contains(&format!("pid={pid},")))
            .filter(|c| c.state == "ESTAB" || c.state == "CLOSE-WAIT")
            .count()
    };
    assert!(
        leaked(old_pid) >= 4,
        "{:#?}",
        ss(&format!("dport = :{router_port}"))
    );
    lab.restart("proxy", &[]).expect("restart proxy");
    assert_eq!(leaked(old_pid), 0);
    assert_eq!(leaked(lab.proxy().pid), 0);
    // A fresh proxy forwards again, for a while.
    let report = lab.load(1, 2, 4.0).expect("load");
    assert_eq!(report["summary"]["all_completed"], true, "{report}");
    down_and_check(lab);
}

#[test]
fn process_restart_under_load_breaks_inflight_and_recovers() {
    let mut lab = Lab::up(&LabOptions::pd()).expect("lab up");
    let old = lab.decode().clone();
    let run = lab.load_background(2, 8, 4.0).expect("load");
    sleep(Duration::from_millis(800));
    lab.restart("decode", &[]).expect("restart decode");
    let new = lab.decode().clone();
    assert_ne!(new.pid, old.pid);
    assert_all_gone(&[old.pid, old.scheduler_pids[0], old.detokenizer_pid.unwrap()]);
    assert_eq!(new.scheduler_pids.len(), 1);
    let report = run.wait().expect("report");
    assert_eq!(report["summary"]["all_completed"], false, "{report}");
    assert!(
        agents(&report)
            .iter()
            .any(|a| !a["errors"].as_array().unwrap().is_empty() || !a["hung_round"].is_null()),
        "{report}"
    );
    let report = lab.load(2, 2, 6.0).expect("load after restart");
    assert_eq!(report["summary"]["all_completed"], true, "{report}");
    down_and_check(lab);
}

#[test]
fn fixture_tears_down_when_the_test_panics() {
    let (tx, rx) = std::sync::mpsc::channel();
    let h = std::thread::spawn(move || {
        let lab = Lab::up(&LabOptions::regular()).expect("lab up");
        tx.send(lab.seen_pids.clone()).unwrap();
        panic!("deliberate panic with a live lab");
    });
    assert!(h.join().is_err());
    let pids = rx.recv().expect("pids");
    assert!(pids.len() >= 5, "{pids:?}");
    assert_all_gone(&pids);
}
