//! Python stacks through py-spy, one subprocess per pid, classified by probe rules.
//!
//! Why a subprocess per pid: `py-spy dump --subprocesses --json` drops children and aborts on
//! a non-Python child, so every Python process of the topology gets its own `py-spy dump`,
//! run in parallel with bounded concurrency, each under a hard timeout that kills py-spy's
//! whole process group. Periodic sampling never pauses the target (`--nonblocking`);
//! `--native` (which pauses it) only runs when the configuration asks for it.
//!
//! One dump is a guess: [`StackSource::capture_window`] takes several dumps a few hundred ms
//! apart, and [`summarize_window`] says which threads sat in the same state in every dump.

use crate::children::Spawned;
use crate::clock::Clock;
use crate::error::{Error, Result};
use crate::model::{
    CaptureMode, Frame, Payload, Role, Sample, SourceKind, SourceStatus, StackCapture, ThreadStack,
    Topology,
};
use crate::sources::{BoxFuture, Source};
use regex::Regex;
use serde::Deserialize;
use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::AsyncReadExt;

/// The states a rule may assign (and `unknown` when no rule matches).
pub const STATES: &[&str] = &[
    STATE_IDLE,
    STATE_RUNNING_BATCH,
    STATE_WAITING_GPU_RESULT,
    STATE_NCCL_COLLECTIVE,
    STATE_GLOO_COLLECTIVE,
    STATE_PD_QUEUE_POLLING,
    STATE_STUCK_OUTSIDE_LOOP,
    STATE_COLLECTIVE,
    STATE_P2P_WAIT,
    STATE_WAITING_WORKERS,
    STATE_STARTUP,
    STATE_SHUTDOWN,
    STATE_HELPER_IDLE,
    STATE_UNKNOWN,
];
pub const STATE_IDLE: &str = "idle";
pub const STATE_RUNNING_BATCH: &str = "running_batch";
pub const STATE_WAITING_GPU_RESULT: &str = "waiting_gpu_result";
pub const STATE_NCCL_COLLECTIVE: &str = "nccl_collective";
pub const STATE_GLOO_COLLECTIVE: &str = "gloo_collective";
/// PD queue polling, including waiting on a KV transfer.
pub const STATE_PD_QUEUE_POLLING: &str = "pd_queue_polling";
/// A serving process's main thread whose frames contain none of its stack's loop functions.
pub const STATE_STUCK_OUTSIDE_LOOP: &str = "stuck_outside_loop";
/// Inside a torch.distributed collective whose backend the frames do not show; the rule's
/// name says which collective (`collective.all_reduce`).
pub const STATE_COLLECTIVE: &str = "collective";
/// Waiting in a point-to-point receive/send (pipeline-parallel stage hand-off).
pub const STATE_P2P_WAIT: &str = "p2p_wait";
/// An engine core waiting for its workers' output (vLLM shared-memory broadcast queue).
pub const STATE_WAITING_WORKERS: &str = "waiting_workers";
/// Start-up: loading, profiling memory, compiling or warming up the model.
pub const STATE_STARTUP: &str = "startup";
/// The main thread left its loop and is shutting down (`threading._shutdown`).
pub const STATE_SHUTDOWN: &str = "shutdown";
/// A helper thread (tqdm monitor, a queue or socket poller) waiting for work.
pub const STATE_HELPER_IDLE: &str = "helper_idle";
pub const STATE_UNKNOWN: &str = "unknown";

/// Maps a thread's frames to a state. Lives in `probes/*.toml` as `[[stack_rule]]`.
///
/// A frame pattern is `NAME` or `NAME@FILE`: `NAME` is a regex matched against the whole
/// function name, both as py-spy reports it (3.11+: qualified, `Scheduler.run_batch`) and
/// its last dotted part (`run_batch`); `FILE` is a regex searched in the frame's file path.
/// A rule matches when at least one frame anywhere in the stack matches `any_frame` (if
/// given), one of the `innermost_depth` innermost Python frames (or a native frame among or
/// inside them) matches `innermost` (if given), and no frame matches `not_frame`. Among matching rules the highest `priority` wins (ties: file order).
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct StackRule {
    /// Rule id, shown as the reason of a classification (`sglang.running_batch`).
    pub name: String,
    /// One of [`STATES`].
    pub state: String,
    /// Only for components of this stack (`sglang`, `vllm`); absent: any stack.
    #[serde(default)]
    pub stack: Option<String>,
    #[serde(default)]
    pub priority: i32,
    #[serde(default)]
    pub any_frame: Vec<String>,
    #[serde(default)]
    pub innermost: Vec<String>,
    #[serde(default = "default_innermost_depth")]
    pub innermost_depth: usize,
    #[serde(default)]
    pub not_frame: Vec<String>,
    /// What the state means for the on-call engineer.
    #[serde(default)]
    pub explain: Option<String>,
}

fn default_innermost_depth() -> usize {
    1
}

#[derive(Debug, Clone)]
struct FramePattern {
    name: Regex,
    file: Option<Regex>,
}

impl FramePattern {
    fn parse(rule: &str, text: &str) -> Result<FramePattern> {
        let (name, file) = match text.split_once('@') {
            Some((n, f)) => (n, Some(f)),
            None => (text, None),
        };
        let bad = |e: regex::Error| {
            Error::Other(format!(
                "stack_rule {rule}: bad frame pattern {text:?}: {e}"
            ))
        };
        Ok(FramePattern {
            name: Regex::new(&format!("^(?:{name})$")).map_err(bad)?,
            file: file.map(Regex::new).transpose().map_err(bad)?,
        })
    }

    fn matches(&self, frame: &Frame) -> bool {
        let short = frame.name.rsplit('.').next().unwrap_or(&frame.name);
        (self.name.is_match(&frame.name) || self.name.is_match(short))
            && self.file.as_ref().is_none_or(|f| f.is_match(&frame.file))
    }
}

#[derive(Debug, Clone)]
struct CompiledRule {
    rule: StackRule,
    any_frame: Vec<FramePattern>,
    innermost: Vec<FramePattern>,
    not_frame: Vec<FramePattern>,
}

impl CompiledRule {
    fn matches(&self, frames: &[Frame]) -> bool {
        let any = |pats: &[FramePattern], fs: &[Frame]| {
            fs.iter().any(|f| pats.iter().any(|p| p.matches(f)))
        };
        if !self.any_frame.is_empty() && !any(&self.any_frame, frames) {
            return false;
        }
        if !self.innermost.is_empty() {
            let window = innermost_window(frames, self.rule.innermost_depth);
            if !any(&self.innermost, &frames[..window]) {
                return false;
            }
        }
        !any(&self.not_frame, frames)
    }
}

/// A native frame (`py-spy --native`: libc, libtorch, an address): no Python file, no line.
fn is_native(f: &Frame) -> bool {
    f.line == 0 && !f.file.ends_with(".py")
}

/// How many innermost frames `innermost` looks at: the `depth` innermost Python frames and
/// every native frame among or inside them (so `--native` dumps match like Python-only ones).
fn innermost_window(frames: &[Frame], depth: usize) -> usize {
    let depth = depth.max(1);
    let mut python = 0;
    for (i, f) in frames.iter().enumerate() {
        if !is_native(f) {
            python += 1;
            if python == depth {
                return i + 1;
            }
        }
    }
    frames.len()
}

/// Stack rules compiled once (regexes checked, sorted by priority).
#[derive(Debug, Clone, Default)]
pub struct RuleSet {
    rules: Vec<CompiledRule>,
}

impl RuleSet {
    /// Compiles rules; a bad regex, an unknown state or a rule without any frame condition is
    /// an error naming the rule.
    pub fn new(rules: &[StackRule]) -> Result<RuleSet> {
        let mut compiled = Vec::with_capacity(rules.len());
        for r in rules {
            if !STATES.contains(&r.state.as_str()) {
                return Err(Error::Other(format!(
                    "stack_rule {}: unknown state {:?} (known: {})",
                    r.name,
                    r.state,
                    STATES.join(", ")
                )));
            }
            if r.any_frame.is_empty() && r.innermost.is_empty() {
                return Err(Error::Other(format!(
                    "stack_rule {}: needs any_frame or innermost",
                    r.name
                )));
            }
            let pats = |v: &[String]| -> Result<Vec<FramePattern>> {
                v.iter().map(|p| FramePattern::parse(&r.name, p)).collect()
            };
            compiled.push(CompiledRule {
                any_frame: pats(&r.any_frame)?,
                innermost: pats(&r.innermost)?,
                not_frame: pats(&r.not_frame)?,
                rule: r.clone(),
            });
        }
        // Stable: equal priorities keep file order.
        compiled.sort_by_key(|c| std::cmp::Reverse(c.rule.priority));
        Ok(RuleSet { rules: compiled })
    }

    /// The state of one thread and the rule that decided it (`unknown`, None: no rule).
    /// `stack` restricts to rules for that stack (plus stack-less rules); None: all rules.
    pub fn classify(&self, stack: Option<&str>, thread: &ThreadStack) -> (String, Option<String>) {
        for c in &self.rules {
            if let (Some(want), Some(have)) = (c.rule.stack.as_deref(), stack) {
                if want != have {
                    continue;
                }
            }
            if c.matches(&thread.frames) {
                return (c.rule.state.clone(), Some(c.rule.name.clone()));
            }
        }
        (STATE_UNKNOWN.to_string(), None)
    }

    /// The rule's explanation, for reports.
    pub fn explain(&self, rule_name: &str) -> Option<&str> {
        self.rules
            .iter()
            .find(|c| c.rule.name == rule_name)
            .and_then(|c| c.rule.explain.as_deref())
    }

    pub fn len(&self) -> usize {
        self.rules.len()
    }

    pub fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }
}

/// Classifies one thread with every rule (any stack). Compiles the rules on each call: use
/// [`RuleSet`] in loops. Bad rules classify nothing (`unknown`).
pub fn classify(rules: &[StackRule], thread: &ThreadStack) -> (String, Option<String>) {
    match RuleSet::new(rules) {
        Ok(set) => set.classify(None, thread),
        Err(_) => (STATE_UNKNOWN.to_string(), None),
    }
}

// ---------------------------------------------------------------------------------------
// py-spy JSON (its own module; re-exported here, where callers have always found it)

pub use crate::sources::pyspy_json::{parse_dump, parse_pyspy_json, MAX_FRAMES, MAX_THREADS};

// ---------------------------------------------------------------------------------------
// configuration and py-spy discovery

/// Environment variable naming the py-spy binary.
pub const PY_SPY_ENV: &str = "WEDGEWATCH_PY_SPY";

/// How the stacks source runs py-spy.
#[derive(Debug, Clone)]
pub struct StacksConfig {
    /// Explicit py-spy binary; wins over everything else.
    pub py_spy: Option<PathBuf>,
    /// `$WEDGEWATCH_PY_SPY`, captured by [`StacksConfig::from_env`].
    pub py_spy_env: Option<PathBuf>,
    /// Directories searched for `py-spy` (`$PATH`, captured by `from_env`).
    pub search_path: Option<OsString>,
    /// Dumps per window (one dump is a guess; agreeing dumps are evidence).
    pub dumps_per_window: u32,
    /// Spacing between the starts of two dumps of a window.
    pub dump_interval: Duration,
    /// Hard timeout of one `py-spy dump --nonblocking`.
    pub timeout: Duration,
    /// At most this many py-spy processes at once.
    pub concurrency: usize,
    /// `--native`: pauses the target. Only on explicit request.
    pub native: bool,
    /// Hard timeout of one `--native` dump (slower: it unwinds native stacks).
    pub native_timeout: Duration,
    /// Upper bound on pids sampled per dump; the rest are reported as skipped.
    pub max_pids: usize,
    /// Time budget of one window: no further dump starts when the next one would end past
    /// it, so a loaded machine gets fewer dumps (said in the status) instead of a window
    /// the sampler's timeout throws away whole. Keep it under the sampler's stacks timeout (8 s).
    pub window_budget: Duration,
}

impl StacksConfig {
    /// Defaults, with py-spy looked up through `$WEDGEWATCH_PY_SPY` and `$PATH`.
    pub fn from_env() -> StacksConfig {
        StacksConfig {
            py_spy: None,
            py_spy_env: std::env::var_os(PY_SPY_ENV)
                .filter(|v| !v.is_empty())
                .map(PathBuf::from),
            search_path: std::env::var_os("PATH"),
            dumps_per_window: 3,
            dump_interval: Duration::from_millis(300),
            timeout: Duration::from_secs(2),
            concurrency: 4,
            native: false,
            native_timeout: Duration::from_secs(5),
            max_pids: 64,
            window_budget: Duration::from_millis(6_000),
        }
    }

    /// Which py-spy to run, or why there is none (with the install hint).
    pub fn resolve_py_spy(&self) -> std::result::Result<PathBuf, String> {
        for (origin, p) in [("--py-spy", &self.py_spy), (PY_SPY_ENV, &self.py_spy_env)] {
            if let Some(p) = p {
                return if is_executable(p) {
                    Ok(p.clone())
                } else {
                    Err(format!(
                        "py-spy not found: {origin}={} is not an executable file \
                         (install with `pip install py-spy`)",
                        p.display()
                    ))
                };
            }
        }
        if let Some(path) = &self.search_path {
            for dir in std::env::split_paths(path) {
                let cand = dir.join("py-spy");
                if is_executable(&cand) {
                    return Ok(cand);
                }
            }
        }
        Err(format!(
            "py-spy not found in PATH (install with `pip install py-spy`, or point {PY_SPY_ENV} \
             at the binary)"
        ))
    }
}

impl Default for StacksConfig {
    fn default() -> Self {
        StacksConfig::from_env()
    }
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// One process to dump, with the stack kind of its component (selects the rules).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StackTarget {
    pub pid: i32,
    pub stack: Option<String>,
    pub component: Option<String>,
    /// Dumped on every round of a window, not only the first. Schedulers: their state
    /// across the window ("idle in 18/18 dumps") is the wedge evidence. For the others
    /// (HTTP front ends, proxies, detokenizers) one dump a window shows where they are, at
    /// a third of py-spy's cost and of the reads of the target.
    pub whole_window: bool,
}

/// Every process of the topology that may run Python (all roles but `client`), once each.
pub fn targets_from_topology(topo: &Topology) -> Vec<StackTarget> {
    let mut seen = BTreeSet::new();
    let mut out = Vec::new();
    for c in &topo.components {
        if c.role == Role::Client {
            continue;
        }
        for &pid in &c.pids {
            if seen.insert(pid) {
                // The most specific component owns the pid (a scheduler before its engine).
                let owner = topo.component_of_pid(pid).unwrap_or(c);
                out.push(StackTarget {
                    pid,
                    stack: Some(owner.stack.clone()),
                    component: Some(owner.id.clone()),
                    whole_window: owner.role == Role::Scheduler,
                });
            }
        }
    }
    out
}

// ---------------------------------------------------------------------------------------
// one dump of one pid

/// Why a process is not Python, from `/proc` alone (None: looks like Python or unknown).
fn not_python_reason(pid: i32) -> Option<String> {
    let exe = std::fs::read_link(format!("/proc/{pid}/exe")).ok()?;
    let base = exe.file_name()?.to_string_lossy().to_string();
    if base.contains("python") || base.starts_with("pypy") {
        return None;
    }
    // An embedded interpreter (uwsgi, a custom launcher) still maps libpython.
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).ok()?;
    if maps.contains("libpython") {
        return None;
    }
    Some(format!(
        "not a Python process (exe {}, no libpython mapped)",
        exe.display()
    ))
}

/// [`not_python_reason`] of each pid, in order, each under a deadline: reading `maps` takes
/// the target's mmap lock, which a wedged process may hold forever. A blocked read skips the
/// pid (py-spy would block on the same lock).
async fn not_python_reasons(pids: Vec<i32>) -> Vec<Option<String>> {
    let n = pids.len();
    let items = pids
        .into_iter()
        .map(|p| (PathBuf::from(format!("/proc/{p}")), p))
        .collect();
    let run = move || {
        crate::deadline::map(items, NOT_PYTHON_DEADLINE, NOT_PYTHON_DEADLINE * 4, |&p| {
            not_python_reason(p)
        })
    };
    match tokio::task::spawn_blocking(run).await {
        Ok(rs) => rs.into_iter().map(|r| r.unwrap_or_else(Some)).collect(),
        Err(_) => vec![None; n],
    }
}

/// Longest wait for one process's `exe` and `maps` (normally well under a millisecond).
const NOT_PYTHON_DEADLINE: Duration = Duration::from_millis(300);

fn ptrace_hint() -> String {
    let scope = std::fs::read_to_string("/proc/sys/kernel/yama/ptrace_scope")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "absent".into());
    format!(
        "permission denied attaching with ptrace: run as the target's user or root with \
         CAP_SYS_PTRACE (containers: --cap-add SYS_PTRACE), or lower kernel.yama.ptrace_scope \
         (now {scope})"
    )
}

/// What a failed py-spy run means.
#[derive(Debug, Clone, PartialEq, Eq)]
enum DumpFailure {
    NotPython(String),
    Exited(String),
    Permission(String),
    Timeout(String),
    /// `--nonblocking` read the target while it changed (py-spy: "Failed to get stack
    /// traces"): worth one immediate retry.
    Race(String),
    Other(String),
}

fn interpret_failure(pid: i32, stderr: &str, code: Option<i32>) -> DumpFailure {
    let first = excerpt(stderr);
    let lower = stderr.to_lowercase();
    let alive = Path::new(&format!("/proc/{pid}")).exists();
    if lower.contains("failed to find python version") {
        DumpFailure::NotPython(format!("not a Python process (py-spy: {first})"))
    } else if !alive || lower.contains("no such process") {
        DumpFailure::Exited(format!("process exited during the dump (py-spy: {first})"))
    } else if lower.contains("permission denied") || lower.contains("operation not permitted") {
        DumpFailure::Permission(format!("{} (py-spy: {first})", ptrace_hint()))
    } else if lower.contains("failed to get stack traces") {
        DumpFailure::Race(format!(
            "py-spy read the process while it changed, twice (py-spy: {first})"
        ))
    } else {
        DumpFailure::Other(format!(
            "py-spy exited with {}: {first}",
            code.map_or("a signal".to_string(), |c| format!("code {c}"))
        ))
    }
}

struct DumpOutcome {
    threads: Vec<ThreadStack>,
    failure: Option<DumpFailure>,
}

/// py-spy's JSON for one process is a few MB even with hundreds of deep threads; more is not
/// a stack dump, and reading it whole would cost us its size in memory.
pub const MAX_PY_SPY_STDOUT: usize = 16 << 20;
/// py-spy's errors are a few lines; more is noise we must not carry into a snapshot.
pub const MAX_PY_SPY_STDERR: usize = 64 << 10;
/// How much of py-spy's error output a status quotes.
const EXCERPT_CHARS: usize = 200;

/// The start of `text` on one line, at most [`EXCERPT_CHARS`] characters.
fn excerpt(text: &str) -> String {
    let one_line: String = text
        .lines()
        .filter(|l| !l.trim().is_empty())
        .take(2)
        .collect::<Vec<_>>()
        .join(" / ");
    let mut out: String = one_line.chars().take(EXCERPT_CHARS).collect();
    if out.len() < one_line.len() {
        out.push_str("...");
    }
    out
}

/// Reads at most `cap` bytes; true when there was more (the rest is left unread).
async fn read_capped<R>(r: Option<&mut R>, cap: usize) -> (Vec<u8>, bool)
where
    R: tokio::io::AsyncRead + Unpin,
{
    let mut buf = Vec::new();
    if let Some(r) = r {
        let limit = u64::try_from(cap).unwrap_or(u64::MAX).saturating_add(1);
        let _ = r.take(limit).read_to_end(&mut buf).await;
    }
    let over = buf.len() > cap;
    buf.truncate(cap);
    (buf, over)
}

/// What one py-spy run printed, each stream capped, and how it ended.
struct Captured {
    out: Vec<u8>,
    err: Vec<u8>,
    /// The stream that went over its cap (the child was killed then).
    overflow: Option<(&'static str, usize)>,
    status: std::io::Result<std::process::ExitStatus>,
}

/// Reads both streams of `child` (each capped: past its cap the group is killed at once,
/// not when the timeout comes) and reaps it.
async fn capture(child: &mut tokio::process::Child, group: &Spawned) -> Captured {
    let mut stdout = child.stdout.take();
    let mut stderr = child.stderr.take();
    // Past its cap a stream is left unread and the group killed: the other stream then ends.
    let capped = |name: &'static str, cap: usize, (buf, over): (Vec<u8>, bool)| {
        if over {
            group.kill();
        }
        (buf, over.then_some((name, cap)))
    };
    let ((out, o1), (err, o2)) = tokio::join!(
        async {
            let r = read_capped(stdout.as_mut(), MAX_PY_SPY_STDOUT).await;
            capped("stdout", MAX_PY_SPY_STDOUT, r)
        },
        async {
            let r = read_capped(stderr.as_mut(), MAX_PY_SPY_STDERR).await;
            capped("stderr", MAX_PY_SPY_STDERR, r)
        },
    );
    Captured {
        out,
        err,
        overflow: o1.or(o2),
        status: child.wait().await,
    }
}

/// The py-spy command line for one dump.
fn py_spy_command(py_spy: &Path, pid: i32, native: bool) -> tokio::process::Command {
    let mut cmd = tokio::process::Command::new(py_spy);
    cmd.arg("dump").arg("--json");
    if native {
        cmd.arg("--native");
    } else {
        cmd.arg("--nonblocking");
    }
    cmd.arg("--pid")
        .arg(pid.to_string())
        // Backtraces in py-spy's error output would only make them harder to read.
        .env_remove("RUST_BACKTRACE")
        .env_remove("RUST_LIB_BACKTRACE")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    crate::children::die_with_parent(&mut cmd);
    cmd
}

/// Runs one `py-spy dump` in its own process group under a hard timeout; on timeout the
/// whole group is killed (py-spy stops ptrace on exit, so the target resumes).
async fn run_py_spy(py_spy: &Path, pid: i32, native: bool, timeout: Duration) -> DumpOutcome {
    let fail = |f| DumpOutcome {
        threads: Vec::new(),
        failure: Some(f),
    };
    let mut child = match py_spy_command(py_spy, pid, native).spawn() {
        Ok(c) => c,
        Err(e) => {
            return fail(DumpFailure::Other(format!(
                "cannot run {}: {e}",
                py_spy.display()
            )))
        }
    };
    let Some(pgid) = child.id().and_then(|id| i32::try_from(id).ok()) else {
        return fail(DumpFailure::Other(
            "py-spy exited before it could be tracked".into(),
        ));
    };
    // Killed on every early exit of this function, by a timeout or by the future being
    // dropped (a signal, the end of a window).
    let mut group = Spawned::register(pgid);
    let Ok(c) = tokio::time::timeout(timeout, capture(&mut child, &group)).await else {
        group.kill();
        return fail(DumpFailure::Timeout(format!(
            "py-spy did not finish within {} ms and was killed",
            timeout.as_millis()
        )));
    };
    group.reaped();
    interpret_run(pid, c)
}

/// What a finished py-spy run means.
fn interpret_run(pid: i32, c: Captured) -> DumpOutcome {
    let fail = |f| DumpOutcome {
        threads: Vec::new(),
        failure: Some(f),
    };
    let stderr = String::from_utf8_lossy(&c.err);
    if let Some((stream, cap)) = c.overflow {
        let shown = if stream == "stdout" {
            String::from_utf8_lossy(&c.out[..c.out.len().min(EXCERPT_CHARS)]).into_owned()
        } else {
            stderr.to_string()
        };
        return fail(DumpFailure::Other(format!(
            "py-spy wrote more than {} KiB to {stream} and was killed (starts: {})",
            cap >> 10,
            excerpt(&shown)
        )));
    }
    match c.status {
        Ok(s) if s.success() => match parse_dump(&c.out) {
            Ok(threads) => DumpOutcome {
                threads,
                failure: None,
            },
            Err(e) => fail(DumpFailure::Other(format!(
                "unreadable py-spy output: {}",
                excerpt(&e.to_string())
            ))),
        },
        Ok(s) => fail(interpret_failure(pid, &stderr, s.code())),
        Err(e) => fail(DumpFailure::Other(format!("waiting for py-spy: {e}"))),
    }
}

// ---------------------------------------------------------------------------------------
// the source

/// Stacks captured over one window, and how complete they are.
#[derive(Debug, Clone, PartialEq)]
pub struct StackWindow {
    pub status: SourceStatus,
    pub captures: Vec<StackCapture>,
}

/// The stacks source: py-spy dumps of every Python process, classified by probe rules.
#[derive(Debug, Clone)]
pub struct StackSource {
    cfg: StacksConfig,
    rules: Arc<RuleSet>,
}

impl StackSource {
    pub fn new(cfg: StacksConfig, rules: &[StackRule]) -> Result<StackSource> {
        Ok(StackSource {
            cfg,
            rules: Arc::new(RuleSet::new(rules)?),
        })
    }

    pub fn config(&self) -> &StacksConfig {
        &self.cfg
    }

    pub fn rules(&self) -> &RuleSet {
        &self.rules
    }

    /// One dump of each target, in parallel (at most `concurrency` py-spy at once).
    pub async fn capture_once(&self, targets: &[StackTarget], clock: &dyn Clock) -> StackWindow {
        let py_spy = match self.cfg.resolve_py_spy() {
            Ok(p) => p,
            Err(reason) => {
                return StackWindow {
                    status: SourceStatus::unavailable(reason),
                    captures: Vec::new(),
                }
            }
        };
        let (mode, timeout) = if self.cfg.native {
            (CaptureMode::Native, self.cfg.native_timeout)
        } else {
            (CaptureMode::Nonblocking, self.cfg.timeout)
        };
        let sem = Arc::new(tokio::sync::Semaphore::new(self.cfg.concurrency.max(1)));
        let mut set = tokio::task::JoinSet::new();
        let mut captures = Vec::new();
        let max = self.cfg.max_pids.max(1);
        let checked = not_python_reasons(targets.iter().take(max).map(|t| t.pid).collect()).await;
        for (i, target) in targets.iter().enumerate() {
            let t_ms = clock.now_ms();
            if i >= max {
                captures.push(skipped(target.pid, t_ms, mode, "over the max_pids limit"));
                continue;
            }
            if let Some(reason) = checked.get(i).cloned().flatten() {
                captures.push(skipped(target.pid, t_ms, mode, &reason));
                continue;
            }
            let sem = Arc::clone(&sem);
            let rules = Arc::clone(&self.rules);
            let py_spy = py_spy.clone();
            let target = target.clone();
            set.spawn(async move {
                let _permit = sem.acquire_owned().await.ok();
                let native = mode == CaptureMode::Native;
                let mut out = run_py_spy(&py_spy, target.pid, native, timeout).await;
                if matches!(out.failure, Some(DumpFailure::Race(_))) {
                    // Reading without pausing races the interpreter now and then (a frame
                    // freed mid-read); the next read almost always succeeds.
                    out = run_py_spy(&py_spy, target.pid, native, timeout).await;
                }
                (target, t_ms, out, rules)
            });
        }
        let mut failures = Vec::new();
        while let Some(joined) = set.join_next().await {
            let Ok((target, t_ms, out, rules)) = joined else {
                continue;
            };
            let mut cap = StackCapture {
                pid: target.pid,
                t_ms,
                mode,
                error: None,
                skipped: None,
                warnings: Vec::new(),
                threads: Vec::new(),
            };
            if mode == CaptureMode::Native {
                cap.warnings
                    .push("--native: the target was paused while its stacks were read".into());
            }
            match out.failure {
                None => {
                    cap.threads = out.threads;
                    for th in &mut cap.threads {
                        let (state, rule) = rules.classify(target.stack.as_deref(), th);
                        th.state = state;
                        th.rule = rule;
                        if th.tid == 0 {
                            cap.warnings
                                .push(format!("thread {:?} without an OS thread id", th.name));
                        }
                    }
                    if cap.threads.is_empty() {
                        cap.warnings.push("py-spy returned no threads".into());
                    }
                    if cap.threads.len() >= MAX_THREADS {
                        cap.warnings
                            .push(format!("only the first {MAX_THREADS} threads are kept"));
                    }
                }
                Some(DumpFailure::NotPython(r)) => cap.skipped = Some(r),
                Some(DumpFailure::Exited(r)) => cap.error = Some(r),
                Some(
                    f @ (DumpFailure::Permission(_)
                    | DumpFailure::Timeout(_)
                    | DumpFailure::Race(_)
                    | DumpFailure::Other(_)),
                ) => {
                    let r = match &f {
                        DumpFailure::Permission(r)
                        | DumpFailure::Timeout(r)
                        | DumpFailure::Race(r)
                        | DumpFailure::Other(r) => r.clone(),
                        _ => String::new(),
                    };
                    failures.push((target.pid, f));
                    cap.error = Some(r);
                }
            }
            captures.push(cap);
        }
        captures.sort_by_key(|c| c.pid);
        StackWindow {
            status: failure_status(&failures),
            captures,
        }
    }

    /// `dumps_per_window` dumps, `dump_interval` apart: every target in the first round,
    /// the `whole_window` ones in the others.
    pub async fn capture_window(&self, targets: &[StackTarget], clock: &dyn Clock) -> StackWindow {
        let rounds = self.cfg.dumps_per_window.max(1);
        let mut status = SourceStatus::ok();
        let mut captures = Vec::new();
        let window_started = Instant::now();
        let repeated: Vec<StackTarget> =
            targets.iter().filter(|t| t.whole_window).cloned().collect();
        for round in 0..rounds {
            let started = Instant::now();
            let this_round = if round == 0 { targets } else { &repeated[..] };
            if this_round.is_empty() {
                break;
            }
            let w = self.capture_once(this_round, clock).await;
            let unavailable = w.status.status == crate::model::Status::Unavailable;
            status = status.worst(w.status);
            captures.extend(w.captures);
            if unavailable {
                break;
            }
            // Another dump (and its spacing) would overrun the budget: stop with what we
            // have, and say so.
            let one = started.elapsed().max(self.cfg.dump_interval);
            if round + 1 < rounds && window_started.elapsed() + one > self.cfg.window_budget {
                status = status.worst(SourceStatus::degraded(format!(
                    "{} of {rounds} dumps: one dump of {} processes took {} ms (window budget {} ms)",
                    round + 1,
                    targets.len(),
                    started.elapsed().as_millis(),
                    self.cfg.window_budget.as_millis()
                )));
                break;
            }
            if round + 1 < rounds {
                if let Some(rest) = self.cfg.dump_interval.checked_sub(started.elapsed()) {
                    tokio::time::sleep(rest).await;
                }
            }
        }
        StackWindow { status, captures }
    }
}

fn skipped(pid: i32, t_ms: i64, mode: CaptureMode, reason: &str) -> StackCapture {
    StackCapture {
        pid,
        t_ms,
        mode,
        error: None,
        skipped: Some(reason.to_string()),
        warnings: Vec::new(),
        threads: Vec::new(),
    }
}

/// Exited pids and non-Python pids do not degrade the source; permission problems,
/// timeouts and other py-spy failures do, each named once.
fn failure_status(failures: &[(i32, DumpFailure)]) -> SourceStatus {
    let mut status = SourceStatus::ok();
    let mut seen = BTreeSet::new();
    for (pid, f) in failures {
        let reason = match f {
            DumpFailure::Permission(_) => ptrace_hint(),
            DumpFailure::Timeout(r) | DumpFailure::Race(r) | DumpFailure::Other(r) => {
                format!("pid {pid}: {r}")
            }
            DumpFailure::NotPython(_) | DumpFailure::Exited(_) => continue,
        };
        if seen.insert(reason.clone()) {
            status = status.worst(SourceStatus::degraded(reason));
        }
    }
    status
}

impl Source for StackSource {
    fn kind(&self) -> SourceKind {
        SourceKind::Stacks
    }

    fn sample<'a>(&'a self, topo: &'a Topology, clock: &'a dyn Clock) -> BoxFuture<'a, Sample> {
        Box::pin(async move {
            let t_ms = clock.now_ms();
            let started = Instant::now();
            let targets = targets_from_topology(topo);
            let w = self.capture_window(&targets, clock).await;
            Sample {
                t_ms,
                status: w.status,
                took_ms: u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
                payload: Payload::Stacks(w.captures),
            }
        })
    }
}

// ---------------------------------------------------------------------------------------
// evidence across dumps

/// What one thread did across the dumps of a window.
#[derive(Debug, Clone, PartialEq)]
pub struct ThreadEvidence {
    pub pid: i32,
    pub tid: i32,
    pub name: Option<String>,
    /// Its state in each dump it appeared in, in time order.
    pub states: Vec<String>,
    /// Dumps of the pid that succeeded (the thread may be missing from some).
    pub dumps: usize,
    /// The state, when the thread was seen in every successful dump (at least 2) in the
    /// same state: evidence, not a guess.
    pub consistent_state: Option<String>,
    /// The innermost frame, when it was identical (function, file, line) in every dump:
    /// the thread did not move.
    pub same_innermost_frame: Option<String>,
}

/// Groups the captures of a window by thread and says which threads are consistently in
/// one state (see [`ThreadEvidence`]).
pub fn summarize_window(captures: &[StackCapture]) -> Vec<ThreadEvidence> {
    /// A thread's name and its stack in each dump, with the dump's time.
    type Sightings<'a> = (Option<String>, Vec<(i64, &'a ThreadStack)>);
    let mut dumps: BTreeMap<i32, usize> = BTreeMap::new();
    let mut by_thread: BTreeMap<(i32, i32), Sightings> = BTreeMap::new();
    for c in captures {
        if c.error.is_some() || c.skipped.is_some() {
            continue;
        }
        *dumps.entry(c.pid).or_default() += 1;
        for t in &c.threads {
            let e = by_thread
                .entry((c.pid, t.tid))
                .or_insert_with(|| (t.name.clone(), Vec::new()));
            e.1.push((c.t_ms, t));
        }
    }
    by_thread
        .into_iter()
        .map(|((pid, tid), (name, mut seen))| {
            seen.sort_by_key(|(t, _)| *t);
            let n = dumps.get(&pid).copied().unwrap_or(0);
            let states: Vec<String> = seen.iter().map(|(_, t)| t.state.clone()).collect();
            let every = seen.len() == n && n >= 2;
            let consistent_state =
                (every && states.windows(2).all(|w| w[0] == w[1])).then(|| states[0].clone());
            let inner: Vec<Option<&Frame>> = seen.iter().map(|(_, t)| t.frames.first()).collect();
            let same_innermost_frame = match inner.first() {
                Some(Some(f0)) if every && inner.iter().all(|f| *f == Some(*f0)) => {
                    Some(f0.render())
                }
                _ => None,
            };
            ThreadEvidence {
                pid,
                tid,
                name,
                states,
                dumps: n,
                consistent_state,
                same_innermost_frame,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn thread(frames: &[(&str, &str)]) -> ThreadStack {
        ThreadStack {
            tid: 1,
            name: Some("MainThread".into()),
            active: true,
            owns_gil: true,
            frames: frames
                .iter()
                .map(|(n, f)| Frame {
                    name: n.to_string(),
                    file: f.to_string(),
                    line: 1,
                })
                .collect(),
            state: STATE_UNKNOWN.into(),
            rule: None,
        }
    }

    fn rule(name: &str, state: &str, prio: i32, any: &[&str]) -> StackRule {
        StackRule {
            name: name.into(),
            state: state.into(),
            stack: None,
            priority: prio,
            any_frame: any.iter().map(|s| s.to_string()).collect(),
            innermost: vec![],
            innermost_depth: 1,
            not_frame: vec![],
            explain: None,
        }
    }

    #[test]
    fn qualified_and_bare_names_match_and_priority_wins() {
        let rules = vec![
            rule("a", STATE_RUNNING_BATCH, 10, &["run_batch"]),
            rule(
                "b",
                STATE_NCCL_COLLECTIVE,
                50,
                &["all_reduce@parallel_state\\.py$"],
            ),
        ];
        let t = thread(&[
            ("GroupCoordinator.all_reduce", "/x/parallel_state.py"),
            ("Scheduler.run_batch", "/x/scheduler.py"),
        ]);
        assert_eq!(
            classify(&rules, &t),
            (STATE_NCCL_COLLECTIVE.into(), Some("b".into()))
        );
        let t = thread(&[
            ("all_reduce", "/x/other.py"),
            ("Scheduler.run_batch", "/x/scheduler.py"),
        ]);
        assert_eq!(
            classify(&rules, &t),
            (STATE_RUNNING_BATCH.into(), Some("a".into()))
        );
        // Anchored: a longer name does not match.
        let t = thread(&[("run_batch_prebuilt_x", "/x/s.py")]);
        assert_eq!(classify(&rules, &t).0, STATE_UNKNOWN);
    }

    #[test]
    fn innermost_and_not_frame() {
        let mut r = rule("g", STATE_GLOO_COLLECTIVE, 10, &["broadcast_pyobj"]);
        r.innermost = vec![".*@distributed_c10d\\.py$".into()];
        r.innermost_depth = 2;
        let mut stuck = rule("s", STATE_STUCK_OUTSIDE_LOOP, 1, &["run_scheduler_process"]);
        stuck.not_frame = vec!["event_loop_.*".into()];
        let set = RuleSet::new(&[r, stuck]).unwrap();
        let t = thread(&[
            ("wrapper", "/t/c10d_logger.py"),
            ("broadcast", "/t/distributed_c10d.py"),
            ("broadcast_pyobj", "/s/utils.py"),
        ]);
        assert_eq!(set.classify(None, &t).0, STATE_GLOO_COLLECTIVE);
        let t = thread(&[
            ("x", "/a.py"),
            ("y", "/b.py"),
            ("broadcast", "/t/distributed_c10d.py"),
            ("broadcast_pyobj", "/s/utils.py"),
        ]);
        assert_eq!(set.classify(None, &t).0, STATE_UNKNOWN);
        let t = thread(&[("load_model", "/m.py"), ("run_scheduler_process", "/s.py")]);
        assert_eq!(set.classify(None, &t).0, STATE_STUCK_OUTSIDE_LOOP);
        let t = thread(&[
            ("evict", "/m.py"),
            ("event_loop_overlap", "/s.py"),
            ("run_scheduler_process", "/s.py"),
        ]);
        assert_eq!(set.classify(None, &t).0, STATE_UNKNOWN);
    }

    #[test]
    fn innermost_depth_counts_python_frames_and_sees_native_ones() {
        let mut r = rule("w", STATE_IDLE, 1, &[]);
        r.any_frame = vec![];
        r.innermost = vec!["wait@threading\\.py$".into()];
        r.innermost_depth = 1;
        let set = RuleSet::new(&[r]).unwrap();
        // py-spy --native: libc and the lock call sit inside the Python frame.
        let mut t = thread(&[
            ("0x7f00", "libc.so.6"),
            ("PyThread_acquire_lock_timed", "python3.12"),
            ("wait", "threading.py"),
            ("run", "tqdm/_monitor.py"),
        ]);
        for f in &mut t.frames[..2] {
            f.line = 0;
        }
        assert_eq!(set.classify(None, &t).0, STATE_IDLE);
        assert_eq!(innermost_window(&t.frames, 1), 3);
        assert_eq!(innermost_window(&t.frames, 99), 4);
    }

    #[test]
    fn bad_rules_are_named() {
        let e = RuleSet::new(&[rule("x", "napping", 0, &["a"])]).unwrap_err();
        assert!(e.to_string().contains("stack_rule x: unknown state"), "{e}");
        let e = RuleSet::new(&[rule("y", STATE_IDLE, 0, &["(unclosed"])]).unwrap_err();
        assert!(
            e.to_string().contains("stack_rule y: bad frame pattern"),
            "{e}"
        );
        let e = RuleSet::new(&[rule("z", STATE_IDLE, 0, &[])]).unwrap_err();
        assert!(e.to_string().contains("needs any_frame"), "{e}");
    }

    #[test]
    fn stack_filter() {
        let mut r = rule("v", STATE_IDLE, 0, &["run_busy_loop"]);
        r.stack = Some("vllm".into());
        let set = RuleSet::new(&[r]).unwrap();
        let t = thread(&[("EngineCoreProc.run_busy_loop", "/v/core.py")]);
        assert_eq!(set.classify(Some("vllm"), &t).0, STATE_IDLE);
        assert_eq!(set.classify(Some("sglang"), &t).0, STATE_UNKNOWN);
        assert_eq!(set.classify(None, &t).0, STATE_IDLE);
    }

    #[test]
    fn failures_are_interpreted() {
        let me = std::process::id() as i32;
        assert!(matches!(
            interpret_failure(
                me,
                "Error: Failed to find python version from target process",
                Some(1)
            ),
            DumpFailure::NotPython(_)
        ));
        assert!(matches!(
            interpret_failure(me, "Error: Permission denied (os error 13)", Some(1)),
            DumpFailure::Permission(r) if r.contains("CAP_SYS_PTRACE") && r.contains("ptrace_scope")
        ));
        assert!(matches!(
            interpret_failure(
                i32::MAX,
                "Error: Failed to get process executable name",
                Some(1)
            ),
            DumpFailure::Exited(_)
        ));
        assert!(matches!(
            interpret_failure(
                me,
                "Error: Failed to get stack traces\nCaused by: bad address",
                Some(1)
            ),
            DumpFailure::Race(_)
        ));
    }

    #[test]
    fn window_evidence() {
        let mut a = thread(&[("on_idle", "/s.py")]);
        a.state = STATE_IDLE.into();
        let mut b = a.clone();
        b.frames[0].line = 2;
        let cap = |t_ms, th: &ThreadStack| StackCapture {
            pid: 7,
            t_ms,
            mode: CaptureMode::Nonblocking,
            error: None,
            skipped: None,
            warnings: vec![],
            threads: vec![th.clone()],
        };
        let ev = summarize_window(&[cap(1, &a), cap(2, &a), cap(3, &b)]);
        assert_eq!(ev.len(), 1);
        assert_eq!(ev[0].consistent_state.as_deref(), Some(STATE_IDLE));
        assert_eq!(ev[0].same_innermost_frame, None);
        let ev = summarize_window(&[cap(1, &a), cap(2, &a)]);
        assert_eq!(
            ev[0].same_innermost_frame.as_deref(),
            Some("on_idle (/s.py:1)")
        );
        let ev = summarize_window(&[cap(1, &a)]);
        assert_eq!(ev[0].consistent_state, None, "one dump is a guess");
    }
}
