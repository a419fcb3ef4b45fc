//! How soon a wedge is judged, and never a slow request (`cargo bench --bench verdict`),
//! harness = false. Issue 33's goals, at production thresholds (a request judged after 10 s
//! when every witness says nothing works on it, `correlate::verdict`):
//!
//! 1. Daemon: the PD lab with the noon fault (decode `SGLANG_DECODE_PREALLOC_SPLIT_TOKENS =
//!    100`: a prompt above 100 tokens is accepted and forgotten), a daemon watching it.
//!    `WW_BENCH_WEDGES` (default 10) times: one long-prompt request is sent through the proxy
//!    and held open; the daemon's served snapshot is asked every `WW_BENCH_POLL_MS` (default
//!    250) until a `wedged_request` names that request (found by its client port at the
//!    proxy). Its time: from the request's last byte sent to the instant the daemon took that
//!    snapshot (`taken_at`), and to the bench seeing the daemon log open the finding. Then the
//!    request is closed and the lab let go quiet (its legs gone from the served snapshot).
//!    Goal: the worst served time <= 12 s.
//! 2. One-shot: the daemon stopped, `WW_BENCH_ONESHOTS` (default 10) wedges; for each, a cold
//!    `wedgewatch snapshot --json --no-daemon` (default window, which grows for a verdict due
//!    soon: said on stderr) started 1, 3, 5, 7 or 9 s after the request was sent (in turn).
//!    Its time: from the request's last byte to the one-shot's end, when it names the request
//!    in a `wedged_request`. Goal: found in every run, the worst <= 12 s after the hang began.
//! 3. Controls: the regular lab `up --controls` (`tests/lab/controls.py`: a 60 s prefill, a
//!    20 s first token while busy, an engine queue, a 40 s upload, the router's admission
//!    queue, all at once), a daemon, its served snapshot every 2 s and cold one-shots during the
//!    run. Goal: 0 false findings (stuck findings or stuck requests of that lab).
//!
//! The binary is `CARGO_BIN_EXE_wedgewatch` (bench profile); NVML the lab's fake library,
//! py-spy `tests/lab/.venv/bin/py-spy`. Exits 1 when a goal is missed (full run).
//!
//! Quick mode (`cargo test --bench verdict`, `common/mode.rs`): 1 daemon wedge, 1 one-shot
//! (started 3 s after: its window grows for the verdict due), no controls
//! (tests/labs/controls_lab.rs runs them in the test command). It fails when a wedge is never
//! reported; it judges no goal.

#[path = "common/daemon_proc.rs"]
mod daemon_proc;
#[path = "common/env.rs"]
mod env;
use wedgewatch_testkit::lab;
#[path = "common/mode.rs"]
mod mode;
#[path = "common/proc_stat.rs"]
mod proc_stat;
#[path = "common/stop.rs"]
mod stop;

use daemon_proc::{loadavg, quantile, wedgewatch, Daemon};
use lab::{Lab, LabOptions};
use mode::Mode;
use serde_json::Value;
use std::io::Write;
use std::net::TcpStream;
use std::process::Command;
use std::time::{Duration, Instant};
use wedgewatch::clock::{Clock as _, SystemClock};

/// The noon fault's limit, and a prompt well above it (words are tokens in the lab).
const SPLIT_TOKENS: &str = "100";
const WEDGE_WORDS: usize = 300;
/// The goal of every wedge's time (s).
const GOAL_S: f64 = 12.0;
/// No wedge is waited for longer (s): past the 30 s threshold with room.
const WEDGE_BOUND: Duration = Duration::from_secs(60);

/// Finding kinds that say a request is stuck (today's and those being added).
const STUCK_KINDS: [&str; 4] = [
    "wedged_request",
    "stalled_stream",
    "kv_transfer_stalled",
    "pd_leg_failed",
];

fn main() {
    // Its daemon discovers every stack on the machine: no other test's stack runs beside it.
    let _alone = wedgewatch_testkit::lab::exclusive();
    let mode = Mode::from_args();
    let wedges = mode.knob("WW_BENCH_WEDGES", 10usize, 1);
    let one_shots = mode.knob("WW_BENCH_ONESHOTS", 10usize, 1);
    let poll_ms = mode.knob("WW_BENCH_POLL_MS", 250u64, 250);
    println!("verdict bench ({mode:?}): load average {}", loadavg());
    let lab =
        Lab::up(&LabOptions::pd().decode_env("SGLANG_DECODE_PREALLOC_SPLIT_TOKENS", SPLIT_TOKENS))
            .expect("lab up");
    let mut b = Bench::new(lab);
    let daemon = daemon_section(&mut b, wedges, poll_ms);
    let cold = one_shot_section(&mut b, one_shots, mode);
    drop(b);
    let controls = match mode {
        Mode::Full => Some(controls_section()),
        Mode::Quick => {
            println!(
                "controls: full run only (tests/labs/controls_lab.rs runs them in the test command)"
            );
            None
        }
    };
    let works = daemon.works && cold.works && controls.as_ref().is_none_or(|c| c.works);
    let met = daemon.met && cold.met && controls.as_ref().is_none_or(|c| c.met);
    println!("load average after: {}", loadavg());
    if !works || mode.goal_fails(met) {
        std::process::exit(1);
    }
}

/// Whether a section ran (`works`) and met its goal (`met`).
struct Verdict {
    works: bool,
    met: bool,
}

struct Bench {
    lab: Lab,
    py_spy: std::path::PathBuf,
}

impl Bench {
    fn new(lab: Lab) -> Bench {
        Bench {
            lab,
            py_spy: lab::venv_bin("py-spy"),
        }
    }

    fn ww(&self) -> Command {
        wedgewatch(self.lab.nvml_dir(), &self.py_spy, None)
    }

    /// A wedge let go: the lab's proxy keeps a request whose client left open upstream
    /// (aiohttp does not cancel it), so the proxy is restarted, dropping the whole chain, and
    /// the next wedge starts on a quiet stack.
    fn let_go(&mut self, conn: TcpStream) {
        drop(conn);
        if let Err(e) = self.lab.restart("proxy", &[]) {
            println!("  could not restart the proxy: {e}");
        }
    }
}

fn now_ms() -> i64 {
    SystemClock.now_ms()
}

/// A request above the noon fault's limit through the proxy, held open: its connection and
/// the instant its last byte was written (epoch ms).
fn send_wedge(entry_url: &str) -> std::io::Result<(TcpStream, i64)> {
    let addr = entry_url.trim_start_matches("http://");
    let prompt = vec!["tensor"; WEDGE_WORDS].join(" ");
    let body = serde_json::json!({
        "model": "lab-model", "stream": true, "max_tokens": 8,
        "messages": [{"role": "user", "content": prompt}],
    })
    .to_string();
    let mut s = TcpStream::connect(addr)?;
    write!(
        s,
        "POST /v1/chat/completions HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )?;
    s.flush()?;
    Ok((s, now_ms()))
}

/// When a snapshot was taken (epoch ms).
fn taken_ms(snap: &Value) -> Option<i64> {
    snap["taken_at"]
        .as_str()
        .and_then(wedgewatch::clock::parse_rfc3339)
}

/// Whether a `wedged_request` names the request sent at `sent_ms`: a logical request of the
/// age it has in the snapshot, within 2 s (wedges are sent more than 10 s apart; its id
/// and its legs' grouping may change while the daemon rediscovers the restarted proxy).
fn judged_sent_at(snap: &Value, sent_ms: i64) -> bool {
    let Some(taken) = taken_ms(snap) else {
        return false;
    };
    let want = (taken - sent_ms) as f64;
    let age_of = |id: &Value| {
        snap["logical_requests"]
            .as_array()?
            .iter()
            .find(|l| l["id"] == *id)?["age_ms"]
            .as_f64()
    };
    snap["findings"].as_array().is_some_and(|fs| {
        fs.iter()
            .filter(|f| f["kind"] == "wedged_request")
            .flat_map(|f| f["requests"].as_array().into_iter().flatten())
            .any(|id| age_of(id).is_some_and(|a| (a - want).abs() < 2000.0))
    })
}

/// The snapshot's id of the component whose main pid is `pid`.
fn comp_id(snap: &Value, pid: u32) -> Option<String> {
    snap["components"].as_array()?.iter().find_map(|c| {
        (c["main_pid"].as_u64() == Some(u64::from(pid)))
            .then(|| c["id"].as_str().map(String::from))
            .flatten()
    })
}

/// A served snapshot (None: the daemon did not answer it).
fn served(b: &Bench, d: &Daemon) -> Option<Value> {
    let out = b
        .ww()
        .arg("--state-dir")
        .arg(d.state_dir.path())
        .args(["snapshot", "--json"])
        .output()
        .ok()?;
    let err = String::from_utf8_lossy(&out.stderr);
    if !out.status.success() || !err.contains("using the daemon") {
        return None;
    }
    serde_json::from_slice(&out.stdout).ok()
}

/// The daemon log's wedged_request lines at `comp` (other stacks on the machine are seen
/// too).
fn log_lines(d: &Daemon, comp: &str) -> Vec<String> {
    std::fs::read_to_string(d.log_path())
        .unwrap_or_default()
        .lines()
        .filter(|l| l.contains("kind=wedged_request") && l.contains(comp))
        .map(String::from)
        .collect()
}

/// When the daemon logged each wedged_request finding it opened at `comp` (epoch ms, from
/// the line's own time stamp).
fn log_opened(d: &Daemon, comp: &str) -> Vec<i64> {
    log_lines(d, comp)
        .iter()
        .filter(|l| l.contains("finding opened"))
        .filter_map(|l| wedgewatch::clock::parse_rfc3339(l.split_whitespace().next()?))
        .collect()
}

/// Times (s) of one wedge: served snapshot taken, and log line written (None: not within the
/// bound).
struct Timed {
    served_s: Option<f64>,
    log_s: Option<f64>,
}

/// Section 1: `n` wedges, each judged by the daemon's served snapshot.
fn daemon_section(b: &mut Bench, n: usize, poll_ms: u64) -> Verdict {
    let d = Daemon::start(b.lab.nvml_dir(), &b.py_spy, None);
    let Some(decode) = wait_for_lab(b, &d) else {
        println!("daemon: never saw the lab: {}", d.log_tail());
        return Verdict {
            works: false,
            met: false,
        };
    };
    let mut times = Vec::new();
    for k in 0..n {
        // A phase against the daemon's ticks that differs from one wedge to the next.
        std::thread::sleep(Duration::from_millis(700 * (k as u64 % 5)));
        let (t, conn) = one_daemon_wedge(b, &d, &decode, poll_ms);
        let answered = conn.as_ref().and_then(answer_line);
        println!(
            "  wedge {}: served snapshot {}, log {}{}",
            k + 1,
            secs_text(t.served_s),
            secs_text(t.log_s),
            answered.as_deref().map_or(String::new(), |a| format!(
                " (the request was answered, no wedge: {a})"
            ))
        );
        times.push(t);
        if let Some(c) = conn {
            b.let_go(c);
        }
        wait_quiet(b, &d, &decode);
    }
    let mut served: Vec<f64> = times.iter().filter_map(|t| t.served_s).collect();
    let mut logged: Vec<f64> = times.iter().filter_map(|t| t.log_s).collect();
    let works = served.len() == n;
    let worst = quantile(&mut served, 1.0);
    let met = works && worst <= GOAL_S;
    println!(
        "daemon: {} of {n} wedges judged in a served snapshot: median {:.1} s, worst {worst:.1} s from the last byte; goal worst <= {GOAL_S} s {}",
        served.len(),
        quantile(&mut served, 0.5),
        verdict_word(met)
    );
    println!(
        "daemon log: finding opened for {} of {n}: median {:.1} s, worst {:.1} s from the last byte (the line's time)",
        logged.len(),
        quantile(&mut logged, 0.5),
        quantile(&mut logged, 1.0)
    );
    Verdict { works, met }
}

fn secs_text(s: Option<f64>) -> String {
    s.map_or_else(|| "never".to_string(), |s| format!("{s:.1} s"))
}

fn verdict_word(met: bool) -> &'static str {
    if met {
        "MET"
    } else {
        "MISSED"
    }
}

/// The last engine's id once the daemon serves a snapshot showing it (bounded). (The proxy
/// is found once it carries a request.)
fn wait_for_lab(b: &Bench, d: &Daemon) -> Option<String> {
    let engine = b
        .lab
        .info
        .components
        .get("decode")
        .or_else(|| b.lab.info.components.get("engine"))?
        .pid;
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(60) {
        if let Some(id) = served(b, d).and_then(|s| comp_id(&s, engine)) {
            return Some(id);
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    None
}

/// One wedge: sent, then asked of the daemon until judged (bounded); its connection.
fn one_daemon_wedge(
    b: &Bench,
    d: &Daemon,
    decode: &str,
    poll_ms: u64,
) -> (Timed, Option<TcpStream>) {
    let logged_before = log_opened(d, decode);
    let (conn, sent_ms) = match send_wedge(&b.lab.info.entry_url) {
        Ok(c) => c,
        Err(e) => {
            println!("  could not send the wedge: {e}");
            let none = Timed {
                served_s: None,
                log_s: None,
            };
            return (none, None);
        }
    };
    let mut t = Timed {
        served_s: None,
        log_s: None,
    };
    let started = Instant::now();
    let mut last = None;
    while started.elapsed() < WEDGE_BOUND && (t.served_s.is_none() || t.log_s.is_none()) {
        if t.log_s.is_none() {
            if let Some(at) = log_opened(d, decode).get(logged_before.len()) {
                t.log_s = Some((at - sent_ms) as f64 / 1000.0);
            }
        }
        if t.served_s.is_none() {
            if let Some(s) = served(b, d) {
                if judged_sent_at(&s, sent_ms) {
                    let taken = taken_ms(&s).unwrap_or_else(now_ms);
                    t.served_s = Some((taken - sent_ms) as f64 / 1000.0);
                }
                last = Some(s);
            }
        }
        std::thread::sleep(Duration::from_millis(poll_ms));
    }
    if t.served_s.is_none() {
        explain_missed(d, last.as_ref(), sent_ms);
    }
    (t, Some(conn))
}

/// The status line of an answer that came on a wedge's connection (the router refusing it,
/// a worker it thought down), if any came.
fn answer_line(conn: &TcpStream) -> Option<String> {
    use std::io::Read;
    let mut c = conn.try_clone().ok()?;
    c.set_read_timeout(Some(Duration::from_millis(100))).ok()?;
    let mut buf = [0u8; 256];
    let n = c.read(&mut buf).ok().filter(|n| *n > 0)?;
    String::from_utf8_lossy(&buf[..n])
        .lines()
        .next()
        .map(String::from)
}

/// What the daemon showed of a wedge it did not judge: its last served snapshot's requests
/// (no probes) and sockets source, and its log's last lines.
fn explain_missed(d: &Daemon, last: Option<&Value>, sent_ms: i64) {
    let Some(s) = last else {
        println!(
            "    no served snapshot in the whole wait; log:\n{}",
            d.log_tail()
        );
        return;
    };
    let want = taken_ms(s).map(|t| t - sent_ms);
    println!(
        "    last served snapshot {:.1} s after sending; sockets: {}",
        want.unwrap_or(0) as f64 / 1000.0,
        s["sources"]["sockets"]
    );
    for l in s["logical_requests"].as_array().into_iter().flatten() {
        if l["probe"] != true {
            println!(
                "    {} age {} {} at {} legs {}",
                l["id"], l["age_ms"], l["verdict"], l["stuck_at"], l["legs"]
            );
        }
    }
    println!("    log:\n{}", d.log_tail());
}

/// After a wedge is closed: until no request of this lab is stuck in a served snapshot and
/// the daemon's finding closed (bounded), so the next wedge starts from a quiet lab.
fn wait_quiet(b: &Bench, d: &Daemon, decode: &str) {
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(45) {
        let stuck = served(b, d).is_none_or(|s| !stuck_here(&s, &b.lab).is_empty());
        let open = log_lines(d, decode)
            .iter()
            .rfind(|l| l.contains("finding opened") || l.contains("finding closed"))
            .is_some_and(|l| l.contains("finding opened"));
        if !stuck && !open {
            return;
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    println!("  (the lab did not go quiet within 45 s)");
}

/// Section 2: `n` wedges, each judged by one cold one-shot started some seconds after it.
fn one_shot_section(b: &mut Bench, n: usize, mode: Mode) -> Verdict {
    let delays: &[u64] = mode.pick(&[1, 3, 5, 7, 9], &[3]);
    let mut times = Vec::new();
    let mut found = 0;
    for k in 0..n {
        let delay = delays[k % delays.len()];
        let (conn, sent_ms) = match send_wedge(&b.lab.info.entry_url) {
            Ok(c) => c,
            Err(e) => {
                println!("  could not send the wedge: {e}");
                continue;
            }
        };
        std::thread::sleep(Duration::from_secs(delay));
        let out = b.ww().args(["snapshot", "--json", "--no-daemon"]).output();
        let ended_s = (now_ms() - sent_ms) as f64 / 1000.0;
        let (snap, err) = out.map_or((Value::Null, String::new()), |o| {
            (
                serde_json::from_slice(&o.stdout).unwrap_or(Value::Null),
                String::from_utf8_lossy(&o.stderr).into_owned(),
            )
        });
        let judged = judged_sent_at(&snap, sent_ms);
        let grew = err.lines().filter(|l| l.contains("looking")).count();
        println!(
            "  one-shot {} started {delay} s after: {} at {ended_s:.1} s{}",
            k + 1,
            if judged { "judged" } else { "NOT judged" },
            if grew > 0 {
                format!(" (window grown {grew} time(s))")
            } else {
                String::new()
            }
        );
        if judged {
            found += 1;
            times.push(ended_s);
        }
        b.let_go(conn);
    }
    let works = found == n;
    let worst = quantile(&mut times, 1.0);
    let met = works && worst <= GOAL_S;
    println!(
        "one-shot: {found} of {n} wedges judged: median {:.1} s, worst {worst:.1} s after the hang began; goal every one, worst <= {GOAL_S} s {}",
        quantile(&mut times, 0.5),
        verdict_word(met)
    );
    Verdict { works, met }
}

/// Section 3: the controls on their own lab, a daemon and one-shots watching: stuck findings
/// or stuck requests of that lab are false.
fn controls_section() -> Verdict {
    let lab = Lab::up(&LabOptions::regular().controls()).expect("controls lab up");
    let b = Bench::new(lab);
    let d = Daemon::start(b.lab.nvml_dir(), &b.py_spy, None);
    if wait_for_lab(&b, &d).is_none() {
        println!("controls: the daemon never saw the lab");
        return Verdict {
            works: false,
            met: false,
        };
    }
    let mut run = b.lab.controls().expect("controls");
    let started = Instant::now();
    let mut false_findings: Vec<String> = Vec::new();
    let (mut asked, mut cold) = (0, 0);
    let mut one_shots_at = vec![14u64, 34, 52];
    let report = loop {
        let el = started.elapsed().as_secs();
        let snap = if one_shots_at.first().is_some_and(|&t| el >= t) {
            one_shots_at.remove(0);
            cold += 1;
            b.ww()
                .args(["snapshot", "--json", "--no-daemon"])
                .output()
                .ok()
                .and_then(|o| serde_json::from_slice(&o.stdout).ok())
        } else {
            asked += 1;
            served(&b, &d)
        };
        if let Some(s) = snap {
            for f in stuck_here(&s, &b.lab) {
                if !false_findings.contains(&f) {
                    false_findings.push(f);
                }
            }
        }
        match run.try_report() {
            Ok(Some(r)) => break r,
            Ok(None) => std::thread::sleep(Duration::from_secs(2)),
            Err(e) => {
                println!("controls: {e}");
                return Verdict {
                    works: false,
                    met: false,
                };
            }
        }
    };
    let happened = report["controls"]
        .as_object()
        .is_some_and(|m| m.values().all(|c| c["ok"] == true && c["happened"] == true));
    let met = happened && false_findings.is_empty();
    println!(
        "controls: {asked} served snapshots and {cold} one-shots over {:.0} s, every control happened: {happened}; false findings: {}; goal 0 {}",
        started.elapsed().as_secs_f64(),
        false_findings.len(),
        verdict_word(met)
    );
    for f in &false_findings {
        println!("  false: {f}");
    }
    Verdict {
        works: happened,
        met,
    }
}

/// Stuck findings and stuck requests of this lab in a snapshot (each once, by kind or id).
fn stuck_here(snap: &Value, lab: &Lab) -> Vec<String> {
    let ids: Vec<String> = lab
        .info
        .components
        .values()
        .filter_map(|c| comp_id(snap, c.pid))
        .collect();
    let mine = |c: &Value| c.as_str().is_some_and(|c| ids.iter().any(|i| i == c));
    let mut out: Vec<String> = snap["findings"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|f| STUCK_KINDS.iter().any(|k| f["kind"] == *k) && mine(&f["component"]))
        .map(|f| format!("{} at {}", f["kind"], f["component"]))
        .collect();
    out.extend(
        snap["logical_requests"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|l| l["verdict"] == "stuck" && mine(&l["stuck_at"]))
            .map(|l| format!("request {} stuck at {}", l["id"], l["stuck_at"])),
    );
    out
}
