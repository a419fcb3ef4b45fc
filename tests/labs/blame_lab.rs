//! Issue 32 items 2 and 3 on the lab (`tests/lab/`: the real sglang-router 0.3.2 in PD mode
//! in front of the lab engines), the wedgewatch binary run as a user runs it.
//!
//! - `prefill-5xx` (prefill answers prompts over 100 tokens with a 500 before its scheduler
//!   sees them): the real router answers the client from decode only and drains prefill's
//!   answer, so it holds the client while decode waits for KV that never comes (docs/
//!   findings.md "pd_leg_failed"). wedgewatch says `pd_leg_failed` at prefill, the request
//!   waiting at decode, the router holding it; not "accepted and forgotten" at decode.
//!   Short prompts keep flowing through the same pair meanwhile.
//! - `detokenizer-stuck` (the engine's detokenizer hangs on its first batch): the scheduler
//!   generates the tokens, none reaches the HTTP server. wedgewatch says
//!   `tokens_undelivered` at the engine, naming its detokenizer; not an idle-GPU wedge.
//!
//! Each look's window starts before the requests (`snapshot --window`, `check --window`), so
//! the engines' counts from before them are known. (A look after the fact may not see the
//! failed prefill leg at all: the router reuses its prefill connection, and a one-shot sees
//! only its newest exchange. docs/findings.md says what then.)

use crate::common::{self, fast_thresholds};
use wedgewatch_testkit::lab;

use lab::{Lab, LabOptions};
use serde_json::Value;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The wedgewatch binary for a lab, with the fast thresholds.
fn ww(lab: &Lab) -> Command {
    let mut c = common::ww(lab);
    c.arg("--thresholds").arg(fast_thresholds());
    c
}

/// `snapshot --json --no-daemon --window SECS`, started now; [`Sampling::json`] waits for it.
struct Sampling {
    child: Child,
    out: PathBuf,
    bound: Duration,
    started: Instant,
}

impl Sampling {
    fn start(lab: &Lab, window_s: u64, tag: &str) -> Sampling {
        let out = lab.run_dir().join(format!("snapshot-{tag}.json"));
        let child = ww(lab)
            .args(["snapshot", "--json", "--no-daemon", "--window"])
            .arg(window_s.to_string())
            .stdout(std::fs::File::create(&out).expect("snapshot file"))
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn wedgewatch snapshot");
        Sampling {
            child,
            out,
            bound: Duration::from_secs(window_s + 90),
            started: Instant::now(),
        }
    }

    fn json(mut self) -> Value {
        let status = loop {
            if let Some(st) = self.child.try_wait().expect("wait snapshot") {
                break st;
            }
            if self.started.elapsed() > self.bound {
                let _ = self.child.kill();
                let _ = self.child.wait();
                panic!("snapshot did not finish within {:?}", self.bound);
            }
            std::thread::sleep(Duration::from_millis(100));
        };
        assert!(status.success(), "snapshot failed: {status}");
        let text = std::fs::read_to_string(&self.out).expect("snapshot output");
        // Kept for reading after a failure (the lab's run dir goes with the lab).
        let name = self
            .out
            .file_name()
            .unwrap_or_default()
            .to_string_lossy()
            .into_owned();
        let _ = std::fs::write(
            std::env::temp_dir().join(format!("ww-blame-lab-{name}")),
            &text,
        );
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"))
    }
}

/// A streaming chat completion of `words` words POSTed to `base` (`http://host:port`) from a
/// thread that reads the answer until EOF or `hold`: (status, body bytes) when joined.
fn post_chat(base: &str, words: usize, hold: Duration) -> std::thread::JoinHandle<(u16, usize)> {
    let hostport = base.trim_start_matches("http://").to_string();
    std::thread::spawn(move || {
        let content = vec!["w"; words].join(" ");
        let body = serde_json::json!({
            "model": "lab-model", "stream": true, "max_tokens": 8,
            "messages": [{"role": "user", "content": content}],
        })
        .to_string();
        let addr: std::net::SocketAddr = hostport.parse().expect("address");
        let Ok(mut s) = TcpStream::connect_timeout(&addr, Duration::from_secs(5)) else {
            return (0, 0);
        };
        let _ = s.set_read_timeout(Some(Duration::from_millis(500)));
        let head = format!(
            "POST /v1/chat/completions HTTP/1.1\r\nHost: {hostport}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
            body.len()
        );
        if s.write_all(head.as_bytes())
            .and_then(|_| s.write_all(body.as_bytes()))
            .is_err()
        {
            return (0, 0);
        }
        let deadline = Instant::now() + hold;
        let mut buf = Vec::new();
        let mut chunk = [0u8; 8192];
        while Instant::now() < deadline {
            match s.read(&mut chunk) {
                Ok(0) => break,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) => {}
                Err(_) => break,
            }
        }
        let text = String::from_utf8_lossy(&buf);
        let status = text
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or(0);
        (status, buf.len())
    })
}

/// The snapshot's id of a lab component (matched by main pid).
fn comp_id(snap: &Value, pid: u32) -> String {
    snap["components"]
        .as_array()
        .expect("components")
        .iter()
        .find(|c| c["main_pid"].as_u64() == Some(u64::from(pid)))
        .and_then(|c| c["id"].as_str())
        .unwrap_or_else(|| panic!("no component with main pid {pid}"))
        .to_string()
}

/// This lab's findings (by its components' ids), as `kind component: summary` lines too.
fn lab_findings(snap: &Value, lab: &Lab) -> (Vec<Value>, String) {
    let ids: Vec<String> = lab
        .info
        .components
        .values()
        .filter_map(|c| {
            snap["components"].as_array()?.iter().find_map(|s| {
                (s["main_pid"].as_u64() == Some(u64::from(c.pid)))
                    .then(|| s["id"].as_str().map(str::to_string))?
            })
        })
        .collect();
    let mine: Vec<Value> = snap["findings"]
        .as_array()
        .expect("findings")
        .iter()
        .filter(|f| {
            f["component"]
                .as_str()
                .is_some_and(|c| ids.iter().any(|i| i == c))
        })
        .cloned()
        .collect();
    let text = mine
        .iter()
        .map(|f| format!("  {} {}: {}", f["kind"], f["component"], f["summary"]))
        .collect::<Vec<_>>()
        .join("\n");
    (mine, text)
}

fn evidence_text(f: &Value) -> String {
    f["evidence"]
        .as_array()
        .map(|es| {
            es.iter()
                .map(|e| format!("{}: {}", e["source"], e["detail"]))
                .collect::<Vec<_>>()
                .join("\n")
        })
        .unwrap_or_default()
}

#[test]
fn a_prefill_5xx_is_pd_leg_failed_at_prefill_while_decode_waits_and_the_router_holds_the_client() {
    let lab = Lab::up(&LabOptions::pd().prefill_env("LAB_FAULT_ERROR_ABOVE_TOKENS", "100"))
        .expect("lab up");
    let entry = lab.info.entry_url.clone();
    let sampling = Sampling::start(&lab, 20, "5xx");
    std::thread::sleep(Duration::from_secs(3));
    let long = post_chat(&entry, 150, Duration::from_secs(60));
    // Short prompts pass the same prefill and decode meanwhile: they are answered. (Not at
    // once: the router reuses its prefill connection, and a request that follows the error
    // on it between two socket samples would merge with it: then no prefill leg is seen.)
    std::thread::sleep(Duration::from_secs(2));
    let mut shorts = Vec::new();
    for _ in 0..6 {
        shorts.push(
            post_chat(&entry, 5, Duration::from_secs(30))
                .join()
                .expect("short"),
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    assert!(
        shorts
            .iter()
            .all(|(status, bytes)| *status == 200 && *bytes > 500),
        "short prompts through the faulty prefill: {shorts:?}"
    );
    let snap = sampling.json();
    let prefill = comp_id(&snap, lab.prefill().pid);
    let decode = comp_id(&snap, lab.decode().pid);
    let router = comp_id(&snap, lab.router().pid);
    let (mine, listed) = lab_findings(&snap, &lab);
    let f = mine
        .iter()
        .find(|f| f["kind"] == "pd_leg_failed")
        .unwrap_or_else(|| panic!("no pd_leg_failed; this lab's findings:\n{listed}"));
    assert_eq!(f["component"], prefill.as_str(), "{listed}");
    assert_eq!(f["role"], "prefill");
    assert_eq!(f["severity"], "critical");
    let summary = f["summary"].as_str().unwrap_or_default();
    for want in [
        format!("1 PD request failed at {prefill} (answered an error)"),
        format!("waits at {decode} for KV that will not come"),
        format!("{router} holds the client"),
    ] {
        assert!(summary.contains(&want), "{want} missing: {summary}");
    }
    let ev = evidence_text(f);
    assert!(ev.contains("prefill leg"), "{ev}");
    assert!(
        ev.contains("counted 1 inference answer(s) with an error status"),
        "{ev}"
    );
    // Decode only waits: no "accepted and forgotten" there, nothing about the shorts.
    assert!(
        !mine.iter().any(|f| f["kind"] == "wedged_request"),
        "{listed}"
    );
    // The request is stuck at decode, entered at the proxy.
    let stuck: Vec<&Value> = snap["logical_requests"]
        .as_array()
        .expect("logical requests")
        .iter()
        .filter(|l| l["verdict"] == "stuck" && l["stuck_at"] == decode.as_str())
        .collect();
    assert_eq!(stuck.len(), 1, "{stuck:#?}");
    assert_eq!(f["requests"][0], stuck[0]["id"]);

    assert!(
        !long.is_finished(),
        "the router still holds the long request"
    );
}

#[test]
fn a_stuck_detokenizer_is_tokens_undelivered_not_an_idle_gpu_wedge() {
    let lab = Lab::up(&LabOptions::regular().engine_env("LAB_FAULT_DETOKENIZER_STUCK_AFTER", "0"))
        .expect("lab up");
    let entry = lab.info.entry_url.clone();
    // `check` (the monitoring plugin) over a window that starts before the request.
    let check = ww(&lab)
        .args(["check", "--json", "--window", "18"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn check");
    std::thread::sleep(Duration::from_secs(3));
    let held = post_chat(&entry, 5, Duration::from_secs(60));
    let out = check.wait_with_output().expect("check");
    let result: Value = serde_json::from_slice(&out.stdout).expect("check --json");
    let _ = std::fs::write(
        std::env::temp_dir().join("ww-blame-lab-check-detok.json"),
        &out.stdout,
    );
    assert_eq!(out.status.code(), Some(2), "{result:#}");
    assert_eq!(result["status"], "CRITICAL");
    let engine = format!("engine@127.0.0.1:{}", lab.engine().port);
    let mine: Vec<Value> = result["findings"]
        .as_array()
        .expect("findings")
        .iter()
        .filter(|f| f["component"] == engine.as_str())
        .cloned()
        .collect();
    let listed = format!("{mine:#?}");
    let f = mine
        .iter()
        .find(|f| f["kind"] == "tokens_undelivered")
        .unwrap_or_else(|| panic!("no tokens_undelivered; this lab's findings:\n{listed}"));
    assert_eq!(f["component"], engine.as_str());
    assert_eq!(f["role"], "detokenizer");
    let summary = f["summary"].as_str().unwrap_or_default();
    let detok = lab
        .engine()
        .detokenizer_pid
        .expect("the engine's detokenizer");
    for want in [
        format!("at {engine} got no byte although its scheduler generated 8 tokens since"),
        format!("in its detokenizer (pid {detok})"),
        format!(
            "tokenizer manager (the HTTP process, pid {})",
            lab.engine().pid
        ),
    ] {
        assert!(summary.contains(&want), "{want} missing: {summary}");
    }
    let ev = evidence_text(f);
    assert!(ev.contains("tokenizer manager received 0"), "{ev}");
    // Neither "accepted and forgotten" on an idle GPU nor a spinning collective.
    for wrong in ["wedged_request", "busy_without_progress"] {
        assert!(
            !mine.iter().any(|f| f["kind"] == wrong),
            "{wrong}:\n{listed}"
        );
    }
    assert!(!held.is_finished(), "the request is still held");
}
