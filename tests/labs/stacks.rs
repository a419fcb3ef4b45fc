//! The stacks source against live Python processes shaped like SGLang's scheduler
//! (tests/fixtures/pyspy/fake_sglang/scheduler.py) and against recorded py-spy JSON.
//!
//! py-spy is found through `$WEDGEWATCH_PY_SPY`, else `tests/lab/.venv/bin/py-spy`
//! (create it with `python3 -m venv tests/lab/.venv && tests/lab/.venv/bin/pip install py-spy==0.4.3`).

use wedgewatch_testkit::lab;
use wedgewatch_testkit::timing::within;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use wedgewatch::clock::SystemClock;
use wedgewatch::model::{CaptureMode, Component, Payload, Role, Status, ThreadState, Topology};
use wedgewatch::probes::ProbeSet;
use wedgewatch::sources::stacks::{
    classify, parse_pyspy_json, summarize_window, RuleSet, StackSource, StackTarget, StacksConfig,
};
use wedgewatch::sources::Source;

fn manifest() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn py_spy() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("WEDGEWATCH_PY_SPY").filter(|p| !p.is_empty()) {
        return Some(PathBuf::from(p));
    }
    let p = manifest().join("tests/lab/.venv/bin/py-spy");
    if p.exists() {
        Some(p)
    } else {
        eprintln!(
            "\n!!!! SKIPPED: py-spy not found: set WEDGEWATCH_PY_SPY or create tests/lab/.venv \
             with py-spy (python3 -m venv tests/lab/.venv && tests/lab/.venv/bin/pip install \
             py-spy==0.4.3) !!!!\n"
        );
        None
    }
}

fn rules() -> Vec<wedgewatch::sources::stacks::StackRule> {
    ProbeSet::builtin().expect("built-in probes").stack_rules
}

fn config(py_spy: PathBuf) -> StacksConfig {
    StacksConfig {
        py_spy: Some(py_spy),
        dumps_per_window: 3,
        dump_interval: Duration::from_millis(200),
        ..StacksConfig::from_env()
    }
}

/// A child process killed and reaped on drop, so a failing test leaves nothing running.
struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Proc {
    fn pid(&self) -> i32 {
        self.0.id() as i32
    }
}

/// The fake scheduler, with its mode file.
struct FakeScheduler {
    proc: Proc,
    mode_file: PathBuf,
    _dir: tempfile::TempDir,
}

impl FakeScheduler {
    fn start(mode: &str) -> FakeScheduler {
        let dir = tempfile::tempdir().unwrap();
        let mode_file = dir.path().join("mode");
        std::fs::write(&mode_file, mode).unwrap();
        let child = Command::new("python3")
            .arg(manifest().join("tests/fixtures/pyspy/fake_sglang/scheduler.py"))
            .arg(&mode_file)
            .stdin(Stdio::null())
            .spawn()
            .expect("python3");
        let s = FakeScheduler {
            proc: Proc(child),
            mode_file,
            _dir: dir,
        };
        s.wait_ack(mode);
        s
    }

    fn set_mode(&self, mode: &str) {
        let tmp = self.mode_file.with_extension("tmp");
        std::fs::write(&tmp, mode).unwrap();
        std::fs::rename(&tmp, &self.mode_file).unwrap();
        self.wait_ack(mode);
    }

    fn wait_ack(&self, mode: &str) {
        let ack = self.mode_file.with_extension("ack");
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if std::fs::read_to_string(&ack).is_ok_and(|s| s == mode) {
                // Let the loop settle into the new mode's steady state.
                std::thread::sleep(Duration::from_millis(150));
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!("fake scheduler did not acknowledge mode {mode}");
    }
}

fn proc_state(pid: i32) -> char {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("stat");
    // The state follows the closing parenthesis of comm.
    let after = &stat[stat.rfind(')').expect("comm") + 2..];
    after.chars().next().expect("state")
}

fn assert_not_stopped(pid: i32) {
    let s = proc_state(pid);
    assert!(
        s != 'T' && s != 't',
        "target {pid} left stopped (state {s})"
    );
}

fn main_thread_states(
    window: &wedgewatch::sources::stacks::StackWindow,
    pid: i32,
) -> Vec<ThreadState> {
    window
        .captures
        .iter()
        .filter(|c| c.pid == pid)
        .map(|c| {
            assert!(c.error.is_none(), "capture error: {:?}", c.error);
            assert_eq!(c.mode, CaptureMode::Nonblocking);
            let main = c
                .threads
                .iter()
                .find(|t| t.tid == pid)
                .unwrap_or_else(|| panic!("no main thread in {:?}", c.threads));
            if std::env::var_os("WW_DEBUG_STACKS").is_some() {
                eprintln!(
                    "{} {:?}",
                    main.state,
                    main.frames
                        .iter()
                        .take(6)
                        .map(|f| &f.name)
                        .collect::<Vec<_>>()
                );
            }
            main.state.clone()
        })
        .collect()
}

#[test]
fn recorded_and_synthesized_fixtures_classify_as_expected() {
    let _lab = lab::shared();
    let dir = manifest().join("tests/fixtures/pyspy");
    let expected: std::collections::BTreeMap<String, String> =
        serde_json::from_str(&std::fs::read_to_string(dir.join("expected.json")).unwrap()).unwrap();
    assert!(expected.len() >= 15, "fixtures missing: {expected:?}");
    let rules = rules();
    let set = RuleSet::new(&rules).expect("built-in rules compile");
    for (file, want) in &expected {
        let threads = parse_pyspy_json(&std::fs::read_to_string(dir.join(file)).unwrap())
            .unwrap_or_else(|e| panic!("{file}: {e}"));
        let main = threads
            .iter()
            .find(|t| t.name.as_deref() == Some("MainThread"))
            .unwrap_or_else(|| panic!("{file}: no MainThread"));
        let stack = if file.contains("vllm") {
            "vllm"
        } else {
            "sglang"
        };
        let c = set.classify(Some(stack), main);
        let (state, rule) = (c.state, c.rule);
        assert_eq!(
            state,
            want.as_str(),
            "{file}: rule {rule:?}, frames {:?}",
            main.frames
        );
        // The free fn (all stacks' rules) agrees on these fixtures.
        assert_eq!(
            classify(&rules, main).state,
            want.as_str(),
            "{file} via classify()"
        );
        // Helper threads (watchdog, workers) are not scheduler states.
        for t in threads
            .iter()
            .filter(|t| t.name.as_deref() != Some("MainThread"))
        {
            let s = set.classify(Some(stack), t).state;
            assert_ne!(
                s,
                ThreadState::RunningBatch,
                "{file}: helper thread {:?}",
                t.name
            );
        }
    }
}

#[test]
fn live_scheduler_idle_batch_dropping_and_nccl() {
    let _lab = lab::shared();
    let Some(py_spy) = py_spy() else { return };
    let rt = tokio::runtime::Runtime::new().unwrap();
    let src = StackSource::new(config(py_spy), &rules()).unwrap();
    let sched = FakeScheduler::start("idle");
    let pid = sched.proc.pid();
    let targets = [StackTarget {
        pid,
        stack: Some("sglang".into()),
        component: Some("scheduler@decode".into()),
        whole_window: true,
    }];

    let window = |mode: &str| {
        sched.set_mode(mode);
        let w = rt.block_on(src.capture_window(&targets, &SystemClock));
        assert_eq!(w.status.status, Status::Ok, "{mode}: {:?}", w.status);
        assert_eq!(w.captures.len(), 3, "{mode}: three dumps per window");
        assert_not_stopped(pid);
        w
    };

    let w = window("idle");
    let states = main_thread_states(&w, pid);
    assert!(
        states.iter().all(|s| *s == ThreadState::Idle),
        "idle: {states:?}"
    );
    let ev = summarize_window(&w.captures);
    let main = ev.iter().find(|e| e.tid == pid).unwrap();
    assert_eq!(main.consistent_state, Some(ThreadState::Idle));

    let w = window("batch");
    let states = main_thread_states(&w, pid);
    assert!(
        states.iter().all(|s| *s == ThreadState::RunningBatch),
        "batch: {states:?}"
    );

    // Accepted and forgotten: the loop cycles through the PD queues and on_idle's stall path,
    // never running a batch.
    let w = window("drop");
    let states = main_thread_states(&w, pid);
    assert!(
        states
            .iter()
            .all(|s| *s == ThreadState::PdQueuePolling || *s == ThreadState::Idle),
        "drop: {states:?}"
    );
    assert!(
        states.contains(&ThreadState::PdQueuePolling),
        "drop: {states:?}"
    );

    let w = window("nccl");
    let states = main_thread_states(&w, pid);
    assert!(
        states.iter().all(|s| *s == ThreadState::NcclCollective),
        "nccl: {states:?}"
    );
    // Helper threads stay out of the scheduler states.
    for c in &w.captures {
        assert!(c.threads.len() >= 3, "main + 2 workers: {:?}", c.threads);
    }
    sched.set_mode("idle");
    assert_not_stopped(pid);
}

#[test]
fn source_trait_samples_the_topology_and_skips_non_python() {
    let _lab = lab::shared();
    let Some(py_spy) = py_spy() else { return };
    let rt = tokio::runtime::Runtime::new().unwrap();
    let sched = FakeScheduler::start("batch");
    let sleeper = Proc(Command::new("sleep").arg("30").spawn().expect("sleep"));
    let mut topo = Topology::default();
    let mut engine = Component::new("decode@127.0.0.1:1", Role::Decode, "sglang");
    engine.pids = vec![sleeper.pid()];
    let mut s = Component::new("scheduler@decode@127.0.0.1:1", Role::Scheduler, "sglang");
    s.pids = vec![sched.proc.pid()];
    topo.components = vec![engine, s];
    let mut cfg = config(py_spy);
    cfg.dumps_per_window = 2;
    let src = StackSource::new(cfg, &rules()).unwrap();
    let sample = rt.block_on(src.sample(&topo, &SystemClock));
    assert_eq!(sample.status.status, Status::Ok, "{:?}", sample.status);
    let Payload::Stacks(caps) = sample.payload else {
        panic!("not stacks")
    };
    // The scheduler in both dumps of the window, the engine's own process in the first.
    assert_eq!(caps.len(), 3, "scheduler x 2 + engine x 1: {caps:?}");
    let of = |pid: i32| caps.iter().filter(|c| c.pid == pid).count();
    assert_eq!((of(sched.proc.pid()), of(sleeper.pid())), (2, 1));
    for c in &caps {
        if c.pid == sleeper.pid() {
            let why = c.skipped.as_deref().expect("sleep is skipped");
            assert!(why.contains("not a Python process"), "{why}");
            assert!(c.threads.is_empty());
        } else {
            assert!(c.skipped.is_none() && c.error.is_none(), "{c:?}");
            let main = c.threads.iter().find(|t| t.tid == c.pid).unwrap();
            assert_eq!(main.state, ThreadState::RunningBatch);
            assert_eq!(main.rule.as_deref(), Some("sglang.running_batch"));
        }
    }
    assert_not_stopped(sched.proc.pid());
}

#[test]
fn py_spy_absent_is_unavailable_with_install_hint() {
    let _lab = lab::shared();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let empty = tempfile::tempdir().unwrap();
    let cfg = StacksConfig {
        py_spy: None,
        py_spy_env: None,
        search_path: Some(empty.path().as_os_str().to_owned()),
        ..StacksConfig::from_env()
    };
    let src = StackSource::new(cfg, &rules()).unwrap();
    let targets = [StackTarget {
        pid: std::process::id() as i32,
        stack: None,
        component: None,
        whole_window: true,
    }];
    let w = rt.block_on(src.capture_window(&targets, &SystemClock));
    assert_eq!(w.status.status, Status::Unavailable);
    let reason = w.status.reason.unwrap();
    assert!(reason.contains("pip install py-spy"), "{reason}");
    assert!(w.captures.is_empty());

    // An explicit path that is not there says so too.
    let cfg = StacksConfig {
        py_spy: Some(empty.path().join("py-spy")),
        ..StacksConfig::from_env()
    };
    let reason = cfg.resolve_py_spy().unwrap_err();
    assert!(
        reason.contains("not an executable") && reason.contains("pip install"),
        "{reason}"
    );
}

/// Schedulers are dumped on every round of a window (their state across it is the
/// evidence); other processes once a window, a third of the reads and of py-spy's CPU.
#[test]
fn only_whole_window_targets_are_dumped_every_round() {
    let _lab = lab::shared();
    let Some(py_spy) = py_spy() else { return };
    let rt = tokio::runtime::Runtime::new().unwrap();
    let sched = FakeScheduler::start("idle");
    let front = FakeScheduler::start("idle");
    let src = StackSource::new(config(py_spy), &rules()).unwrap();
    let targets = [
        StackTarget {
            pid: sched.proc.pid(),
            stack: Some("sglang".into()),
            component: Some("scheduler@decode".into()),
            whole_window: true,
        },
        StackTarget {
            pid: front.proc.pid(),
            stack: Some("sglang".into()),
            component: Some("decode".into()),
            whole_window: false,
        },
    ];
    let w = rt.block_on(src.capture_window(&targets, &SystemClock));
    assert_eq!(w.status.status, Status::Ok, "{:?}", w.status);
    let dumps = |pid: i32| {
        w.captures
            .iter()
            .filter(|c| c.pid == pid && c.error.is_none() && !c.threads.is_empty())
            .count()
    };
    assert_eq!(dumps(sched.proc.pid()), 3, "the scheduler, every round");
    assert_eq!(dumps(front.proc.pid()), 1, "the front end, once");
}

/// A py-spy in `dir` that runs `script` (sh) and then the real one.
fn py_spy_wrapper(dir: &tempfile::TempDir, real: &Path, script: &str) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let wrapper = dir.path().join("py-spy");
    let text = format!("#!/bin/sh\n{script}exec {} \"$@\"\n", real.display());
    std::fs::write(&wrapper, text).unwrap();
    std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755)).unwrap();
    wrapper
}

fn scheduler_target(pid: i32) -> StackTarget {
    StackTarget {
        pid,
        stack: Some("sglang".into()),
        component: Some("scheduler@decode".into()),
        whole_window: true,
    }
}

/// The one-shot window of [`capture_cut_by_window`].
const WINDOW: Duration = Duration::from_secs(3);

/// The py-spy bound of the sources that [`capture_cut_by_window`] runs: past the bound it
/// asserts, so a window that waited for a hung dump fails it.
fn window_py_spy_timeout() -> Duration {
    within(WINDOW) + Duration::from_secs(5)
}

/// A window of dumps inside a one-shot collection whose cut comes [`WINDOW`] from now, which
/// it must keep.
fn capture_cut_by_window(
    rt: &tokio::runtime::Runtime,
    src: &StackSource,
    targets: &[StackTarget],
) -> wedgewatch::sources::stacks::StackWindow {
    let t0 = Instant::now();
    let end = tokio::time::Instant::now() + WINDOW;
    let w = rt.block_on(wedgewatch::sources::window::until(
        Some(end),
        src.capture_window(targets, &SystemClock),
    ));
    assert!(t0.elapsed() < within(WINDOW), "{:?}", t0.elapsed());
    w
}

/// Inside a one-shot collection the rounds stop before its window ends: a dump still
/// running then is given up and the dumps done are delivered, said so (a cut sample used to
/// lose them all: "stacks cut off ... still running at the end of the window").
#[test]
fn rounds_stop_at_the_window_end_and_keep_the_dumps_done() {
    let _lab = lab::shared();
    let Some(py_spy) = py_spy() else { return };
    let rt = tokio::runtime::Runtime::new().unwrap();
    let sched = FakeScheduler::start("idle");
    // The real py-spy for the first dump; every later one hangs (a starved host).
    let dir = tempfile::tempdir().unwrap();
    let count = dir.path().join("count");
    let script = format!(
        "if [ -e {c} ]; then exec sleep 30; fi\ntouch {c}\n",
        c = count.display()
    );
    let cfg = StacksConfig {
        timeout: window_py_spy_timeout(),
        ..config(py_spy_wrapper(&dir, &py_spy, &script))
    };
    let src = StackSource::new(cfg, &rules()).unwrap();
    let targets = [scheduler_target(sched.proc.pid())];
    let w = capture_cut_by_window(&rt, &src, &targets);
    assert_eq!(w.status.status, Status::Degraded, "{:?}", w.status);
    let reason = w.status.reason.clone().unwrap_or_default();
    assert!(
        reason.contains("1 of 3 dumps: the window ended during dump 2"),
        "{reason}"
    );
    assert_eq!(w.captures.len(), 1, "{:?}", w.captures);
    assert!(!w.captures[0].threads.is_empty(), "{:?}", w.captures[0]);
}

/// A first round that the window ends in delivers the processes dumped by then and names
/// how many were not (a host with a hundred Python processes): the stacks source is
/// degraded, not unavailable.
#[test]
fn a_first_round_cut_by_the_window_keeps_the_processes_dumped() {
    let _lab = lab::shared();
    let Some(py_spy) = py_spy() else { return };
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (quick, slow) = (FakeScheduler::start("idle"), FakeScheduler::start("idle"));
    // py-spy hangs on the second process only.
    let dir = tempfile::tempdir().unwrap();
    let script = format!(
        "case \" $* \" in *\" {slow} \"*) exec sleep 30;; esac\n",
        slow = slow.proc.pid()
    );
    let cfg = StacksConfig {
        timeout: window_py_spy_timeout(),
        ..config(py_spy_wrapper(&dir, &py_spy, &script))
    };
    let src = StackSource::new(cfg, &rules()).unwrap();
    let targets = [
        scheduler_target(quick.proc.pid()),
        scheduler_target(slow.proc.pid()),
    ];
    let w = capture_cut_by_window(&rt, &src, &targets);
    assert_eq!(w.status.status, Status::Degraded, "{:?}", w.status);
    let reason = w.status.reason.clone().unwrap_or_default();
    assert!(
        reason.contains("1 of 2 processes not dumped: the window ended first"),
        "{reason}"
    );
    let pids: Vec<i32> = w.captures.iter().map(|c| c.pid).collect();
    assert_eq!(pids, vec![quick.proc.pid()], "{:?}", w.captures);
    assert!(!w.captures[0].threads.is_empty(), "{:?}", w.captures[0]);
}

#[test]
fn exited_pid_is_recorded_not_fatal_and_timeout_kills_py_spy() {
    let _lab = lab::shared();
    let Some(py_spy) = py_spy() else { return };
    let rt = tokio::runtime::Runtime::new().unwrap();
    // A pid that existed and is gone (reaped).
    let mut gone = Command::new("python3")
        .arg("-c")
        .arg("pass")
        .spawn()
        .unwrap();
    let gone_pid = gone.id() as i32;
    gone.wait().unwrap();
    let sched = FakeScheduler::start("idle");
    let mut cfg = config(py_spy.clone());
    cfg.dumps_per_window = 1;
    let src = StackSource::new(cfg, &rules()).unwrap();
    let targets = [
        StackTarget {
            pid: gone_pid,
            stack: Some("sglang".into()),
            component: None,
            whole_window: true,
        },
        StackTarget {
            pid: sched.proc.pid(),
            stack: Some("sglang".into()),
            component: None,
            whole_window: true,
        },
    ];
    let w = rt.block_on(src.capture_window(&targets, &SystemClock));
    assert_eq!(w.status.status, Status::Ok, "{:?}", w.status);
    let g = w.captures.iter().find(|c| c.pid == gone_pid).unwrap();
    assert!(
        g.error.as_deref().is_some_and(|e| e.contains("exited")),
        "{g:?}"
    );
    let live = w
        .captures
        .iter()
        .find(|c| c.pid == sched.proc.pid())
        .unwrap();
    assert!(live.error.is_none() && !live.threads.is_empty());

    // A py-spy that cannot finish in time is killed and the source says degraded.
    let mut cfg = config(py_spy);
    cfg.dumps_per_window = 1;
    cfg.timeout = Duration::from_millis(1);
    let cfg_timeout = cfg.timeout;
    let src = StackSource::new(cfg, &rules()).unwrap();
    let started = Instant::now();
    let w = rt.block_on(src.capture_window(&targets[1..], &SystemClock));
    assert!(
        started.elapsed() < within(cfg_timeout),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(w.status.status, Status::Degraded, "{:?}", w.status);
    let e = w.captures[0].error.as_deref().unwrap();
    assert!(e.contains("killed"), "{e}");
    std::thread::sleep(Duration::from_millis(100));
    assert_not_stopped(sched.proc.pid());
}

#[test]
fn native_mode_only_on_request_and_recorded() {
    let _lab = lab::shared();
    let Some(py_spy) = py_spy() else { return };
    let rt = tokio::runtime::Runtime::new().unwrap();
    let sched = FakeScheduler::start("batch");
    let mut cfg = config(py_spy);
    cfg.dumps_per_window = 1;
    assert!(!cfg.native, "native is off by default");
    cfg.native = true;
    let src = StackSource::new(cfg, &rules()).unwrap();
    let targets = [StackTarget {
        pid: sched.proc.pid(),
        stack: Some("sglang".into()),
        component: None,
        whole_window: true,
    }];
    let w = rt.block_on(src.capture_window(&targets, &SystemClock));
    let c = &w.captures[0];
    assert_eq!(c.mode, CaptureMode::Native);
    assert!(c.warnings.iter().any(|w| w.contains("paused")), "{c:?}");
    assert_not_stopped(sched.proc.pid());
    // Native unwinding works on this kind of machine (ptrace, no yama restrictions).
    assert!(c.error.is_none(), "{c:?}");
    let main = c.threads.iter().find(|t| t.tid == c.pid).unwrap();
    assert_eq!(main.state, ThreadState::RunningBatch, "{:?}", main.frames);
}

#[test]
fn permission_denied_degrades_and_names_ptrace() {
    let _lab = lab::shared();
    let Some(py_spy) = py_spy() else { return };
    // Run the real py-spy as `nobody` against a root-owned target: the kernel refuses ptrace.
    let setpriv = Path::new("/usr/bin/setpriv");
    if !nix::unistd::geteuid().is_root() || !setpriv.exists() {
        eprintln!("\n!!!! SKIPPED: needs root and /usr/bin/setpriv to drop privileges !!!!\n");
        return;
    }
    let rt = tokio::runtime::Runtime::new().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let wrapper = dir.path().join("py-spy");
    std::fs::write(
        &wrapper,
        format!(
            "#!/bin/sh\nexec {} --reuid=65534 --regid=65534 --clear-groups {} \"$@\"\n",
            setpriv.display(),
            py_spy.display()
        ),
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755)).unwrap();
    let sched = FakeScheduler::start("idle");
    let mut cfg = config(wrapper);
    cfg.dumps_per_window = 1;
    let src = StackSource::new(cfg, &rules()).unwrap();
    let targets = [StackTarget {
        pid: sched.proc.pid(),
        stack: Some("sglang".into()),
        component: None,
        whole_window: true,
    }];
    let w = rt.block_on(src.capture_window(&targets, &SystemClock));
    assert_eq!(w.status.status, Status::Degraded, "{:?}", w.status);
    let reason = w.status.reason.unwrap();
    assert!(
        reason.contains("CAP_SYS_PTRACE") && reason.contains("kernel.yama.ptrace_scope"),
        "{reason}"
    );
    let e = w.captures[0].error.as_deref().unwrap();
    assert!(e.to_lowercase().contains("permission denied"), "{e}");
    assert_not_stopped(sched.proc.pid());
}

/// Main-thread states of `pid` over one window of the lab (3 dumps).
fn lab_window(src: &StackSource, rt: &tokio::runtime::Runtime, pid: u32) -> Vec<ThreadState> {
    let targets = [StackTarget {
        pid: pid as i32,
        stack: Some("sglang".into()),
        component: None,
        whole_window: true,
    }];
    let w = rt.block_on(src.capture_window(&targets, &SystemClock));
    assert_eq!(w.status.status, Status::Ok, "{:?}", w.status);
    let states = main_thread_states(&w, pid as i32);
    assert_not_stopped(pid as i32);
    states
}

/// The issue's "done means" on the lab: wedged by "accepted and forgotten", the decode
/// scheduler's main thread is idle/polling (never running a batch) in every dump, and the
/// prefill side is idle too; with a spinning all-reduce it is in the NCCL collective.
#[test]
fn lab_accepted_and_forgotten_and_spinning_collective() {
    let _lab = lab::shared();
    let Some(py_spy) = py_spy() else { return };
    let rt = tokio::runtime::Runtime::new().unwrap();
    let src = StackSource::new(config(py_spy), &rules()).unwrap();
    let calm = [ThreadState::Idle, ThreadState::PdQueuePolling];

    let lab = lab::Lab::up(
        &lab::LabOptions::pd().decode_env("SGLANG_DECODE_PREALLOC_SPLIT_TOKENS", "100"),
    )
    .expect("lab up");
    // A long per-request timeout: agents that gave up would start new, short (served) chats.
    let _load = lab.load_background(4, 4, 60.0).expect("load");
    // Wait (bounded) until every agent's request sits forgotten at decode: 4 HTTP requests
    // active there and its token counter flat for 2 s (no stream left running). A fixed
    // sleep is too short on a loaded machine.
    let metrics_url = lab
        .decode()
        .metrics_url
        .clone()
        .expect("decode metrics url");
    let deadline = std::time::Instant::now() + Duration::from_secs(90);
    let mut last_tokens = -1.0;
    let mut flat_since = std::time::Instant::now();
    loop {
        let text = lab::http_get(&metrics_url, Duration::from_secs(2))
            .map(|(_, t)| t)
            .unwrap_or_default();
        let active: f64 = text
            .lines()
            .filter(|l| l.starts_with("sglang:http_requests_active{") && l.contains("chat"))
            .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
            .sum();
        let tokens = text
            .lines()
            .filter(|l| l.starts_with("sglang:generation_tokens_total"))
            .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
            .sum::<f64>();
        if tokens != last_tokens {
            last_tokens = tokens;
            flat_since = std::time::Instant::now();
        }
        if active >= 4.0 && flat_since.elapsed() >= Duration::from_secs(2) {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "agents never all hung at decode: active {active}, tokens {tokens}"
        );
        std::thread::sleep(Duration::from_millis(250));
    }
    let decode = lab.decode().scheduler_pids[0];
    let states = lab_window(&src, &rt, decode);
    assert!(
        states.iter().all(|s| calm.contains(s)),
        "wedged decode scheduler: {states:?}"
    );
    let prefill = lab.prefill().scheduler_pids[0];
    let states = lab_window(&src, &rt, prefill);
    assert!(
        states.iter().all(|s| calm.contains(s)),
        "prefill scheduler: {states:?}"
    );
    drop(_load);
    drop(lab);

    let lab =
        lab::Lab::up(&lab::LabOptions::pd().decode_env("LAB_FAULT_SPIN", "1")).expect("lab up");
    let _load = lab.load_background(2, 1, 4.0).expect("load");
    let decode = lab.decode().scheduler_pids[0];
    let deadline = Instant::now() + Duration::from_secs(10);
    let states = loop {
        let states = lab_window(&src, &rt, decode);
        if states.iter().all(|s| *s == ThreadState::NcclCollective) || Instant::now() > deadline {
            break states;
        }
    };
    assert!(
        states.iter().all(|s| *s == ThreadState::NcclCollective),
        "spinning decode scheduler: {states:?}"
    );
}

#[test]
fn bad_stack_rules_in_probe_files_are_named() {
    let _lab = lab::shared();
    let path = Path::new("extra/my-rules.toml");
    let mut set = ProbeSet::default();
    let e = set
        .add_text(
            path,
            "[[stack_rule]]\nname = \"x\"\nstate = \"idle\"\nany_frame = [\"(oops\"]\n",
        )
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("extra/my-rules.toml") && e.contains("stack_rule x: bad frame pattern"),
        "{e}"
    );
    let e = set
        .add_text(
            path,
            "[[stack_rule]]\nname = \"y\"\nstate = \"idle\"\nany_frames = [\"a\"]\n",
        )
        .unwrap_err()
        .to_string();
    assert!(e.contains("any_frames"), "unknown key named: {e}");
    let e = set
        .add_text(
            path,
            "[[stack_rule]]\nname = \"z\"\nstate = \"sleepy\"\nany_frame = [\"a\"]\n",
        )
        .unwrap_err()
        .to_string();
    assert!(e.contains("unknown state \"sleepy\""), "{e}");
    // The built-in tables load, and cover every state but `unknown`.
    let rules = rules();
    for state in ThreadState::KNOWN {
        if state != ThreadState::Unknown {
            assert!(
                rules.iter().any(|r| state == r.state.as_str()),
                "no rule for {state}"
            );
        }
    }
}

/// A fake "py-spy" (a shell script) in `dir`, executable.
fn fake_py_spy(dir: &Path, name: &str, body: &str) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let p = dir.join(name);
    std::fs::write(&p, format!("#!/bin/sh\n{body}\n")).unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    p
}

fn pid_alive(pid: &str) -> bool {
    // A zombie is dead for our purpose (it holds no memory and runs nothing).
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
        !s.rsplit(')')
            .next()
            .unwrap_or("")
            .trim_start()
            .starts_with('Z')
    })
}

#[test]
fn huge_py_spy_output_is_capped_and_the_py_spy_killed() {
    let _lab = lab::shared();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().display();
    // A Python target: the source only runs py-spy on Python processes.
    let target = Proc(
        Command::new("python3")
            .args(["-c", "import time; time.sleep(60)"])
            .spawn()
            .expect("python3"),
    );
    // python3 may be a shim script that execs the interpreter a moment later.
    let deadline = Instant::now() + Duration::from_secs(20);
    while !std::fs::read_link(format!("/proc/{}/exe", target.pid()))
        .is_ok_and(|e| e.to_string_lossy().contains("python"))
    {
        assert!(Instant::now() < deadline, "python3 did not start");
        std::thread::sleep(Duration::from_millis(50));
    }
    let targets = [StackTarget {
        pid: target.pid(),
        stack: Some("sglang".into()),
        component: None,
        whole_window: false,
    }];
    // 500 MB on stdout, 300 MB on stderr: each would be held whole before the cap.
    let cases = [
        (
            "stdout",
            "yes '[{\"thread_name\": \"x\"}]' | head -c 500000000",
        ),
        (
            "stderr",
            "yes 'Error: noise' | head -c 300000000 >&2; exit 1",
        ),
    ];
    for (stream, body) in cases {
        let script = format!("echo $$ > {d}/{stream}.pid\n{body}");
        let mut cfg = config(fake_py_spy(dir.path(), stream, &script));
        cfg.dumps_per_window = 1;
        // Generous: the cap, not the timeout, must end it.
        cfg.timeout = Duration::from_secs(60);
        let src = StackSource::new(cfg, &rules()).unwrap();
        let w = rt.block_on(src.capture_window(&targets, &SystemClock));
        let e = w.captures[0].error.clone().unwrap_or_default();
        assert!(
            e.contains(&format!("to {stream} and was killed")),
            "{stream}: {e:.300} {:.300?}",
            w.captures
        );
        let reason = w.status.reason.clone().unwrap_or_default();
        assert_eq!(w.status.status, Status::Degraded, "{reason:.300}");
        assert!(
            e.len() < 1000 && reason.len() < 1000,
            "{stream}: reasons are short"
        );
        let pid = std::fs::read_to_string(dir.path().join(format!("{stream}.pid"))).unwrap();
        assert!(
            !pid_alive(pid.trim()),
            "{stream}: the fake py-spy still runs"
        );
    }
}

#[test]
fn parse_dump_takes_bytes_and_rejects_garbage_without_panicking() {
    let _lab = lab::shared();
    use wedgewatch::sources::stacks::parse_dump;
    let ok = br#"[{"thread_name":"MainThread","os_thread_id":7,"frames":[{"name":"f","filename":"a.py","line":3}]}]"#;
    let t = parse_dump(ok).unwrap();
    assert_eq!((t.len(), t[0].tid, t[0].frames[0].line), (1, 7, 3));
    for bad in [&b"\xff\xfe"[..], b"", b"[", b"{}", b"[{\"frames\": 3}]"] {
        assert!(parse_dump(bad).is_err(), "{bad:?}");
    }
}

/// The source reads a target's `exe` and `maps` through its `ProcFs`: in a fixture tree, a
/// node process with no libpython mapped is skipped as not Python before py-spy runs (and a
/// process whose maps show libpython is not), which the kernel's `/proc` could not show.
#[test]
fn not_python_is_read_through_the_configured_procfs() {
    let _lab = lab::shared();
    let dir = tempfile::tempdir().unwrap();
    let write_proc = |pid: i32, exe: &str, maps: &str| {
        let p = dir.path().join(pid.to_string());
        std::fs::create_dir_all(&p).unwrap();
        std::os::unix::fs::symlink(exe, p.join("exe")).unwrap();
        std::fs::write(p.join("maps"), maps).unwrap();
    };
    write_proc(
        4101,
        "/usr/bin/node",
        "00400000-00401000 r-xp 00000000 08:01 1 /usr/bin/node\n",
    );
    write_proc(
        4102,
        "/opt/uwsgi",
        "7f000000-7f001000 r-xp 00000000 08:01 2 /usr/lib/libpython3.11.so.1.0\n",
    );
    let cfg = StacksConfig {
        // Never run for the skipped pid; for the other one it fails (not a py-spy), which is
        // not what this test looks at.
        py_spy: Some(PathBuf::from("/bin/false")),
        dumps_per_window: 1,
        ..StacksConfig::from_env()
    };
    let src = StackSource::new(cfg, &rules())
        .unwrap()
        .with_proc(wedgewatch::sys::ProcFs::new(dir.path()));
    let targets: Vec<StackTarget> = [4101, 4102]
        .into_iter()
        .map(|pid| StackTarget {
            pid,
            stack: Some("sglang".into()),
            component: None,
            whole_window: false,
        })
        .collect();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let w = rt.block_on(src.capture_once(&targets, &SystemClock));
    let node = w.captures.iter().find(|c| c.pid == 4101).unwrap();
    let skipped = node.skipped.as_deref().unwrap_or_default();
    assert!(
        skipped.contains("not a Python process (exe /usr/bin/node"),
        "{skipped:?}"
    );
    let uwsgi = w.captures.iter().find(|c| c.pid == 4102).unwrap();
    assert!(uwsgi.skipped.is_none(), "libpython mapped: {uwsgi:?}");
}
