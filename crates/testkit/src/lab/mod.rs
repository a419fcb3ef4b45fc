//! Test fixture for the lab stack (`tests/lab/`): proxy -> real sglang router -> lab SGLang
//! engines (PD: prefill + decode, or one regular engine), each engine with `sglang::scheduler`
//! and `sglang::detokenizer` children on fake GPUs (fake NVML state files).
//!
//! Use it from an integration test with
//!
//! ```ignore
//! use wedgewatch_testkit::lab;
//!
//! let lab = lab::Lab::up(&lab::LabOptions::pd().decode_env("SGLANG_DECODE_PREALLOC_SPLIT_TOKENS", "100"))?;
//! let report = lab.load(3, 4, 6.0)?;            // harness JSON (serde_json::Value)
//! let decode = lab.decode();                    // pids, ports, urls, scheduler pids
//! // ... point wedgewatch at lab.info.entry_url / the pids / lab.nvml_dir() ...
//! // Drop runs `lab.py down` (also when the test panics) and checks nothing is left.
//! ```
//!
//! * A lab is its keeper's process tree ([`Lab::root_pid`]): a test's wedgewatch run with
//!   `--within` it watches that lab alone, and such tests run side by side ([`Lab::up`]
//!   holds the stacks [`shared`]). A test whose wedgewatch discovers every stack on the
//!   machine takes [`exclusive`] first (`let _lab = lab::exclusive();`): the tests of its
//!   file run side by side, apart from every other test that starts a stack.
//! * Every lab gets its own temporary run directory (lab.json, logs/, nvml/, state/) and free
//!   ports, so labs in parallel test threads do not collide. Set `WEDGEWATCH_LAB_KEEP=1` to
//!   keep the run directory (its path is printed) for reading the component logs.
//! * The Python side needs `tests/lab/.venv` (`python3 tests/lab/lab.py setup`, idempotent;
//!   [`Lab::up`] runs it). Override the venv with `WEDGEWATCH_LAB_VENV=/path/to/venv`.
//! * The fake NVML library (other helper) reads `FAKE_NVML_DIR`; point it at
//!   [`Lab::nvml_dir`].

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde_json::Value;

mod hold;
mod keeper;
pub use crate::repo_root;
pub use hold::{exclusive, shared, Hold};
pub use keeper::Keeper;

/// `tests/lab/lab.py`.
pub fn lab_py() -> PathBuf {
    repo_root().join("tests/lab/lab.py")
}

/// The lab venv: `$WEDGEWATCH_LAB_VENV` or `tests/lab/.venv`.
pub fn venv_dir() -> PathBuf {
    std::env::var_os("WEDGEWATCH_LAB_VENV")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join("tests/lab/.venv"))
}

/// A program inside the lab venv, e.g. `venv_bin("py-spy")`, `venv_bin("python")`.
pub fn venv_bin(name: &str) -> PathBuf {
    venv_dir().join("bin").join(name)
}

/// Run `lab.py setup` (creates the venv on first use; fast when already done).
pub fn ensure_venv() -> Result<(), String> {
    let out = Command::new("python3")
        .arg(lab_py())
        .arg("setup")
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run python3 lab.py setup: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "lab.py setup failed: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(())
}

/// PD (prefill + decode behind the router) or one regular engine.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Mode {
    #[default]
    Pd,
    Regular,
}

/// What to start. Env vars are set on the named component only (that is how faults are
/// switched on; see `docs/lab.md`).
#[derive(Clone, Debug, Default)]
pub struct LabOptions {
    pub mode: Mode,
    pub decode_env: Vec<(String, String)>,
    pub prefill_env: Vec<(String, String)>,
    /// Regular mode's single engine.
    pub engine_env: Vec<(String, String)>,
    pub router_env: Vec<(String, String)>,
    pub proxy_env: Vec<(String, String)>,
    /// Seconds per decode step (default 0.03 in the engines).
    pub token_interval: Option<f64>,
    /// Start the router with `--api-key KEY` (lab.py `--router-api-key`).
    pub router_api_key: Option<String>,
    /// Schedulers per engine (lab.py `--tp-size`; default 1).
    pub tp_size: Option<u32>,
    /// lab.py `--controls`: the engines honour the controls' prompt directives and cap their
    /// running requests, the router its admissions ([`Lab::controls`]).
    pub controls: bool,
}

impl LabOptions {
    pub fn pd() -> Self {
        Self::default()
    }
    pub fn regular() -> Self {
        Self {
            mode: Mode::Regular,
            ..Self::default()
        }
    }
    pub fn decode_env(mut self, k: &str, v: &str) -> Self {
        self.decode_env.push((k.into(), v.into()));
        self
    }
    pub fn prefill_env(mut self, k: &str, v: &str) -> Self {
        self.prefill_env.push((k.into(), v.into()));
        self
    }
    pub fn engine_env(mut self, k: &str, v: &str) -> Self {
        self.engine_env.push((k.into(), v.into()));
        self
    }
    pub fn proxy_env(mut self, k: &str, v: &str) -> Self {
        self.proxy_env.push((k.into(), v.into()));
        self
    }
    pub fn router_env(mut self, k: &str, v: &str) -> Self {
        self.router_env.push((k.into(), v.into()));
        self
    }
    pub fn token_interval(mut self, seconds: f64) -> Self {
        self.token_interval = Some(seconds);
        self
    }
    pub fn router_api_key(mut self, key: &str) -> Self {
        self.router_api_key = Some(key.into());
        self
    }
    /// Every engine runs `n` schedulers (`sglang::scheduler_TP0..n-1`), one fake GPU each.
    pub fn tp_size(mut self, n: u32) -> Self {
        self.tp_size = Some(n);
        self
    }
    /// Ready for [`Lab::controls`] (lab.py `up --controls`).
    pub fn controls(mut self) -> Self {
        self.controls = true;
        self
    }
}

/// One started component as recorded in lab.json.
#[derive(Clone, Debug)]
pub struct Component {
    pub name: String,
    /// `prefill` | `decode` | `regular` | `router` | `proxy`
    pub role: String,
    pub pid: u32,
    pub pgid: u32,
    pub port: u16,
    pub url: String,
    /// Engines: `<url>/metrics`; router: its Prometheus exporter.
    pub metrics_url: Option<String>,
    /// Engines: the `sglang::scheduler*` children.
    pub scheduler_pids: Vec<u32>,
    pub detokenizer_pid: Option<u32>,
    /// Engines: every child (pid, title/cmdline) including multiprocessing's resource tracker.
    pub children: Vec<(u32, String)>,
    /// Engines: the fake GPU index its (first) scheduler owns (prefill 0, decode 1, regular 0;
    /// with `--tp-size N`: prefill 0, decode N).
    pub gpu: Option<u32>,
    /// Engines: the fake GPUs of its schedulers in TP rank order (`[gpu]` when TP is 1).
    pub gpus: Vec<u32>,
    /// Prefill: the bootstrap port given to the router.
    pub bootstrap_port: Option<u16>,
    /// Router: Prometheus port.
    pub prometheus_port: Option<u16>,
    /// Extra env the component was started with (faults live here).
    pub env: BTreeMap<String, String>,
    pub log: PathBuf,
}

/// lab.json, parsed.
#[derive(Clone, Debug)]
pub struct LabInfo {
    pub mode: String,
    pub run_dir: PathBuf,
    pub nvml_dir: PathBuf,
    pub model_path: PathBuf,
    /// The proxy: where clients (the harness) connect.
    pub entry_url: String,
    pub router_url: String,
    pub components: BTreeMap<String, Component>,
    pub raw: Value,
}

fn u32_of(v: &Value) -> Option<u32> {
    v.as_u64().and_then(|x| u32::try_from(x).ok())
}
fn u16_of(v: &Value) -> Option<u16> {
    v.as_u64().and_then(|x| u16::try_from(x).ok())
}
fn str_of(v: &Value) -> String {
    v.as_str().unwrap_or_default().to_string()
}

impl LabInfo {
    fn empty() -> LabInfo {
        LabInfo {
            mode: String::new(),
            run_dir: PathBuf::new(),
            nvml_dir: PathBuf::new(),
            model_path: PathBuf::new(),
            entry_url: String::new(),
            router_url: String::new(),
            components: BTreeMap::new(),
            raw: Value::Null,
        }
    }

    pub fn parse(raw: Value) -> Result<LabInfo, String> {
        let mut components = BTreeMap::new();
        let comps = raw["components"]
            .as_object()
            .ok_or("lab.json: no components")?;
        for (name, c) in comps {
            let children = c["children"]
                .as_array()
                .map(|a| {
                    a.iter()
                        .filter_map(|k| Some((u32_of(&k["pid"])?, str_of(&k["title"]))))
                        .collect()
                })
                .unwrap_or_default();
            let env = c["env"]
                .as_object()
                .map(|m| m.iter().map(|(k, v)| (k.clone(), str_of(v))).collect())
                .unwrap_or_default();
            components.insert(
                name.clone(),
                Component {
                    name: name.clone(),
                    role: str_of(&c["role"]),
                    pid: u32_of(&c["pid"]).ok_or(format!("lab.json: {name} has no pid"))?,
                    pgid: u32_of(&c["pgid"]).unwrap_or(0),
                    port: u16_of(&c["port"]).ok_or(format!("lab.json: {name} has no port"))?,
                    url: str_of(&c["url"]),
                    metrics_url: c["metrics_url"].as_str().map(String::from),
                    scheduler_pids: c["scheduler_pids"]
                        .as_array()
                        .map(|a| a.iter().filter_map(u32_of).collect())
                        .unwrap_or_default(),
                    detokenizer_pid: u32_of(&c["detokenizer_pid"]),
                    children,
                    gpu: u32_of(&c["gpu"]),
                    gpus: match c["gpus"].as_array() {
                        Some(a) => a.iter().filter_map(u32_of).collect(),
                        None => u32_of(&c["gpu"]).into_iter().collect(),
                    },
                    bootstrap_port: u16_of(&c["bootstrap_port"]),
                    prometheus_port: u16_of(&c["prometheus_port"]),
                    env,
                    log: PathBuf::from(str_of(&c["log"])),
                },
            );
        }
        Ok(LabInfo {
            mode: str_of(&raw["mode"]),
            run_dir: PathBuf::from(str_of(&raw["run_dir"])),
            nvml_dir: PathBuf::from(str_of(&raw["nvml_dir"])),
            model_path: PathBuf::from(str_of(&raw["model_path"])),
            entry_url: str_of(&raw["entry_url"]),
            router_url: str_of(&raw["router_url"]),
            components,
            raw,
        })
    }

    /// Every pid the lab recorded: component leaders and their children.
    pub fn all_pids(&self) -> Vec<u32> {
        let mut v = Vec::new();
        for c in self.components.values() {
            v.push(c.pid);
            v.extend(c.children.iter().map(|(p, _)| *p));
        }
        v
    }
}

/// A running lab. Dropping it runs `lab.py down`.
pub struct Lab {
    run_dir: Option<tempfile::TempDir>,
    run_path: PathBuf,
    pub info: LabInfo,
    /// Every pid ever recorded (restarts add new ones), for the "nothing left" check.
    pub seen_pids: Vec<u32>,
    down_done: bool,
    /// The lab's parent: every command that starts or stops its processes runs under it.
    keeper: Mutex<Keeper>,
    /// Held until the lab is down (dropped after `Drop::drop` ran `down`).
    _hold: Hold,
}

fn lab_cmd(args: &[&str]) -> Command {
    let mut c = Command::new("python3");
    c.arg(lab_py()).args(args).stdin(Stdio::null());
    if let Some(v) = std::env::var_os("WEDGEWATCH_LAB_VENV") {
        c.env("WEDGEWATCH_LAB_VENV", v);
    }
    c
}

fn env_args(flag: &str, env: &[(String, String)], out: &mut Vec<String>) {
    for (k, v) in env {
        out.push(flag.to_string());
        out.push(format!("{k}={v}"));
    }
}

impl Lab {
    /// Start a lab (venv setup, engines, router, proxy) under its keeper and wait until it
    /// is ready. Holds the machine's stacks [`shared`] while the lab is up: a test that
    /// watches every stack takes [`exclusive`] first.
    #[track_caller]
    pub fn up(opts: &LabOptions) -> Result<Lab, String> {
        let hold = shared();
        ensure_venv()?;
        let keeper = Keeper::start(&repo_root().join("tests/lab"))?;
        let dir = tempfile::Builder::new()
            .prefix("wedgewatch-lab-")
            .tempdir()
            .map_err(|e| format!("tempdir: {e}"))?;
        let run_path = dir.path().to_path_buf();
        let mut args: Vec<String> = vec![
            "up".into(),
            "--run-dir".into(),
            run_path.display().to_string(),
            "--mode".into(),
            match opts.mode {
                Mode::Pd => "pd".into(),
                Mode::Regular => "regular".into(),
            },
        ];
        if let Some(t) = opts.token_interval {
            args.push("--token-interval".into());
            args.push(t.to_string());
        }
        env_args("--decode-env", &opts.decode_env, &mut args);
        env_args("--prefill-env", &opts.prefill_env, &mut args);
        env_args("--engine-env", &opts.engine_env, &mut args);
        env_args("--router-env", &opts.router_env, &mut args);
        env_args("--proxy-env", &opts.proxy_env, &mut args);
        if let Some(k) = &opts.router_api_key {
            args.push("--router-api-key".into());
            args.push(k.clone());
        }
        if let Some(n) = opts.tp_size {
            args.push("--tp-size".into());
            args.push(n.to_string());
        }
        if opts.controls {
            args.push("--controls".into());
        }
        let argv: Vec<&str> = args.iter().map(String::as_str).collect();
        let mut lab = Lab {
            run_dir: Some(dir),
            run_path,
            info: LabInfo::empty(),
            seen_pids: Vec::new(),
            down_done: false,
            keeper: Mutex::new(keeper),
            _hold: hold,
        };
        // From here on, Drop runs `down` even if `up` failed half way (lab.py records pids
        // before waiting for readiness, and also cleans up itself on failure).
        lab.run_lab(&argv)?;
        lab.reload()?;
        Ok(lab)
    }

    /// The root of the lab's process tree (its keeper; restarted components are adopted
    /// too): `wedgewatch --within` this watches this lab alone.
    pub fn root_pid(&self) -> u32 {
        self.keeper.lock().unwrap_or_else(|p| p.into_inner()).pid()
    }

    /// `python3 lab.py ARGS` under the lab's keeper: its stdout, or an error with its stderr.
    fn run_lab(&self, args: &[&str]) -> Result<String, String> {
        let mut argv = vec!["python3".to_string(), lab_py().display().to_string()];
        argv.extend(args.iter().map(|a| a.to_string()));
        self.keeper
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .run(&argv)
            .map_err(|e| format!("lab.py: {e}"))
    }

    /// Re-read lab.json (after a restart).
    pub fn reload(&mut self) -> Result<(), String> {
        let text = std::fs::read_to_string(self.run_path.join("lab.json"))
            .map_err(|e| format!("read lab.json: {e}"))?;
        let raw: Value = serde_json::from_str(&text).map_err(|e| format!("lab.json: {e}"))?;
        self.info = LabInfo::parse(raw)?;
        for p in self.info.all_pids() {
            if !self.seen_pids.contains(&p) {
                self.seen_pids.push(p);
            }
        }
        Ok(())
    }

    pub fn run_dir(&self) -> &Path {
        &self.run_path
    }
    pub fn nvml_dir(&self) -> &Path {
        &self.info.nvml_dir
    }
    pub fn venv_bin(name: &str) -> PathBuf {
        venv_bin(name)
    }

    /// A component by name (`prefill`, `decode`, `engine`, `router`, `proxy`); panics with
    /// the known names if absent (test code).
    pub fn component(&self, name: &str) -> &Component {
        match self.info.components.get(name) {
            Some(c) => c,
            None => panic!(
                "lab has no component {name:?}; have {:?}",
                self.info.components.keys().collect::<Vec<_>>()
            ),
        }
    }
    pub fn prefill(&self) -> &Component {
        self.component("prefill")
    }
    pub fn decode(&self) -> &Component {
        self.component("decode")
    }
    pub fn engine(&self) -> &Component {
        self.component("engine")
    }
    pub fn router(&self) -> &Component {
        self.component("router")
    }
    pub fn proxy(&self) -> &Component {
        self.component("proxy")
    }

    fn load_args(&self, agents: u32, rounds: u32, timeout_s: f64, max_tokens: u32) -> Vec<String> {
        vec![
            "load".into(),
            "--run-dir".into(),
            self.run_path.display().to_string(),
            "--agents".into(),
            agents.to_string(),
            "--rounds".into(),
            rounds.to_string(),
            "--timeout".into(),
            timeout_s.to_string(),
            "--max-tokens".into(),
            max_tokens.to_string(),
        ]
    }

    /// Run the multi-agent harness to completion (bounded by rounds * timeout + 5 s) and
    /// return its JSON report.
    pub fn load(&self, agents: u32, rounds: u32, timeout_s: f64) -> Result<Value, String> {
        self.load_background(agents, rounds, timeout_s)?.wait()
    }

    /// Start the harness in the background (e.g. to inspect a hang while it is happening).
    /// Replies are 12 tokens (the harness default).
    pub fn load_background(
        &self,
        agents: u32,
        rounds: u32,
        timeout_s: f64,
    ) -> Result<LoadRun, String> {
        self.load_background_with(agents, rounds, timeout_s, 12)
    }

    /// [`Lab::load_background`] with a chosen reply length (`max_tokens`).
    pub fn load_background_with(
        &self,
        agents: u32,
        rounds: u32,
        timeout_s: f64,
        max_tokens: u32,
    ) -> Result<LoadRun, String> {
        let args = self.load_args(agents, rounds, timeout_s, max_tokens);
        let child = lab_cmd(&args.iter().map(String::as_str).collect::<Vec<_>>())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("spawn harness: {e}"))?;
        Ok(LoadRun {
            child: Some(child),
            bound: Duration::from_secs_f64(f64::from(rounds) * timeout_s + 15.0),
            started: Instant::now(),
        })
    }

    /// The harness's steady mode in the background: `agents` concurrent streams, request
    /// after request (a new connection each) for `secs` seconds, `max_tokens` a reply; its
    /// report has `completed_requests`, `requests_per_s`, `hung_requests`, ...
    pub fn steady_load(&self, agents: u32, secs: f64, max_tokens: u32) -> Result<LoadRun, String> {
        self.steady_load_args(agents, secs, max_tokens, &[])
    }

    /// [`Lab::steady_load`] that also counts aloud: every `every_s` seconds the harness
    /// writes its completed requests and streamed chunks so far to stderr, read with
    /// [`LoadRun::progress`].
    pub fn steady_load_progress(
        &self,
        agents: u32,
        secs: f64,
        max_tokens: u32,
        every_s: f64,
    ) -> Result<LoadRun, String> {
        self.steady_load_args(
            agents,
            secs,
            max_tokens,
            &["--progress".into(), every_s.to_string()],
        )
    }

    fn steady_load_args(
        &self,
        agents: u32,
        secs: f64,
        max_tokens: u32,
        extra: &[String],
    ) -> Result<LoadRun, String> {
        let mut args = self.load_args(agents, 4, 30.0, max_tokens);
        args.extend(["--duration".into(), secs.to_string()]);
        args.extend(extra.iter().cloned());
        let child = lab_cmd(&args.iter().map(String::as_str).collect::<Vec<_>>())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("spawn harness: {e}"))?;
        Ok(LoadRun {
            child: Some(child),
            bound: Duration::from_secs_f64(secs + 60.0),
            started: Instant::now(),
        })
    }

    /// `lab.py controls` in the background (a regular lab up with
    /// [`LabOptions::controls`]): the slow but healthy requests, all at once, about 65 s;
    /// [`LoadRun::wait`] gives their JSON report (`tests/lab/controls.py`).
    pub fn controls(&self) -> Result<LoadRun, String> {
        let rd = self.run_path.display().to_string();
        let child = lab_cmd(&["controls", "--run-dir", &rd])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("spawn controls: {e}"))?;
        Ok(LoadRun {
            child: Some(child),
            // Its longest control is 60 s of prefill; its own timeouts are 150 s.
            bound: Duration::from_secs(240),
            started: Instant::now(),
        })
    }

    /// Restart one component (stopped by recorded pid/process group, started again with
    /// the same command) with env vars set; see [`Lab::restart_unset`] to remove some.
    pub fn restart(&mut self, component: &str, env: &[(&str, &str)]) -> Result<(), String> {
        let mut args: Vec<String> = vec![
            "restart".into(),
            "--run-dir".into(),
            self.run_path.display().to_string(),
            component.into(),
        ];
        for (k, v) in env {
            args.push("--env".into());
            args.push(format!("{k}={v}"));
        }
        self.run_lab(&args.iter().map(String::as_str).collect::<Vec<_>>())?;
        self.reload()
    }

    /// Restart one component with some env vars removed.
    pub fn restart_unset(&mut self, component: &str, keys: &[&str]) -> Result<(), String> {
        let mut args: Vec<String> = vec![
            "restart".into(),
            "--run-dir".into(),
            self.run_path.display().to_string(),
            component.into(),
        ];
        for k in keys {
            args.push("--unset".into());
            args.push((*k).into());
        }
        self.run_lab(&args.iter().map(String::as_str).collect::<Vec<_>>())?;
        self.reload()
    }

    /// `lab.py inject FAULT` (named faults, or `clear`).
    pub fn inject(&mut self, fault: &str) -> Result<(), String> {
        let rd = self.run_path.display().to_string();
        self.run_lab(&["inject", "--run-dir", &rd, fault])?;
        self.reload()
    }

    /// `lab.py status` as JSON.
    pub fn status(&self) -> Result<Value, String> {
        let rd = self.run_path.display().to_string();
        let out = self.run_lab(&["status", "--run-dir", &rd])?;
        serde_json::from_str(&out).map_err(|e| format!("status JSON: {e}"))
    }

    /// Stop everything (idempotent). Errors if a recorded process survives.
    pub fn down(&mut self) -> Result<(), String> {
        if self.down_done {
            return Ok(());
        }
        self.down_done = true;
        let rd = self.run_path.display().to_string();
        if !self.run_path.join("lab.json").exists() {
            return Ok(()); // `up` failed before recording anything
        }
        self.run_lab(&["down", "--run-dir", &rd]).map(|_| ())
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        if let Err(e) = self.down() {
            eprintln!("lab down failed: {e}");
        }
        if std::env::var_os("WEDGEWATCH_LAB_KEEP").is_some() {
            if let Some(d) = self.run_dir.take() {
                eprintln!("keeping lab run dir {}", d.keep().display());
            }
        }
    }
}

/// A harness run in the background; dropping it kills the harness.
pub struct LoadRun {
    child: Option<Child>,
    bound: Duration,
    started: Instant,
}

impl LoadRun {
    /// The JSON report if the run has ended (`None`: still running); an error once it ran
    /// past its bound (then it is killed) or its output is not JSON.
    pub fn try_report(&mut self) -> Result<Option<Value>, String> {
        let child = self.child.as_mut().ok_or("already waited")?;
        match child.try_wait() {
            Ok(Some(_)) => {}
            Ok(None) if self.started.elapsed() > self.bound => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("did not finish within {:?}", self.bound));
            }
            Ok(None) => return Ok(None),
            Err(e) => return Err(format!("wait: {e}")),
        }
        let mut out = String::new();
        if let Some(mut s) = child.stdout.take() {
            let _ = s.read_to_string(&mut out);
        }
        self.child = None;
        serde_json::from_str(out.trim())
            .map(Some)
            .map_err(|e| format!("output is not JSON ({e}): {out}"))
    }

    /// Wait (bounded) for the harness JSON report.
    pub fn wait(mut self) -> Result<Value, String> {
        let mut child = self.child.take().ok_or("already waited")?;
        loop {
            match child.try_wait() {
                Ok(Some(_)) => break,
                Ok(None) if self.started.elapsed() > self.bound => {
                    let _ = child.kill();
                    let _ = child.wait();
                    return Err(format!("harness did not finish within {:?}", self.bound));
                }
                Ok(None) => std::thread::sleep(Duration::from_millis(50)),
                Err(e) => return Err(format!("harness wait: {e}")),
            }
        }
        let mut out = String::new();
        let mut err = String::new();
        if let Some(mut s) = child.stdout.take() {
            let _ = s.read_to_string(&mut out);
        }
        if let Some(mut s) = child.stderr.take() {
            let _ = s.read_to_string(&mut err);
        }
        serde_json::from_str(out.trim())
            .map_err(|e| format!("harness output is not JSON ({e}): {out}\nstderr: {err}"))
    }
}

/// One `--progress` line of the harness: seconds since its start, requests completed and
/// chunks streamed so far.
#[derive(Clone, Copy, Debug)]
pub struct Progress {
    pub t: f64,
    pub completed: u64,
    pub chunks: u64,
}

impl LoadRun {
    /// The harness's progress lines as they come (blocking on each); `None` once taken. The
    /// report still comes from [`LoadRun::wait`].
    pub fn progress(&mut self) -> Option<impl Iterator<Item = Progress>> {
        use std::io::BufRead;
        let err = self.child.as_mut()?.stderr.take()?;
        Some(
            std::io::BufReader::new(err)
                .lines()
                .map_while(Result::ok)
                .filter_map(|l| {
                    let v: Value = serde_json::from_str(&l).ok()?;
                    Some(Progress {
                        t: v["t"].as_f64()?,
                        completed: v["completed"].as_u64()?,
                        chunks: v["chunks"].as_u64()?,
                    })
                }),
        )
    }
}

impl Drop for LoadRun {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Minimal HTTP/1.0 GET on 127.0.0.1 (no client crate in dev-dependencies): status and body.
/// Bounded by `timeout` for connect, write and each read.
pub fn http_get(url: &str, timeout: Duration) -> Result<(u16, String), String> {
    let rest = url
        .strip_prefix("http://")
        .ok_or(format!("not an http URL: {url}"))?;
    let (hostport, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    let addr = hostport
        .parse::<std::net::SocketAddr>()
        .map_err(|e| format!("{hostport}: {e}"))?;
    let mut s = TcpStream::connect_timeout(&addr, timeout).map_err(|e| format!("{url}: {e}"))?;
    s.set_read_timeout(Some(timeout))
        .map_err(|e| e.to_string())?;
    s.set_write_timeout(Some(timeout))
        .map_err(|e| e.to_string())?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: {hostport}\r\n\r\n").map_err(|e| e.to_string())?;
    let deadline = Instant::now() + timeout;
    let mut buf = Vec::new();
    let mut chunk = [0u8; 16384];
    loop {
        if Instant::now() > deadline {
            return Err(format!("{url}: timed out after {timeout:?}"));
        }
        match s.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(e) => return Err(format!("{url}: {e}")),
        }
    }
    let text = String::from_utf8_lossy(&buf).into_owned();
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or(format!("{url}: malformed response"))?;
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or(format!("{url}: no status"))?;
    Ok((status, body.to_string()))
}

/// The value of the first Prometheus sample named `name` whose label set contains every
/// `k="v"` in `labels`.
pub fn metric_value(exposition: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    exposition.lines().find_map(|line| {
        if line.starts_with('#') {
            return None;
        }
        let (series, value) = line.rsplit_once(' ')?;
        let (n, lbl) = match series.find('{') {
            Some(i) => (&series[..i], &series[i..]),
            None => (series, ""),
        };
        if n != name {
            return None;
        }
        if labels
            .iter()
            .all(|(k, v)| lbl.contains(&format!("{k}=\"{v}\"")))
        {
            value.parse().ok()
        } else {
            None
        }
    })
}

/// Parse a fake NVML state file (`key=value` lines).
pub fn read_gpu_state(nvml_dir: &Path, index: u32) -> BTreeMap<String, String> {
    std::fs::read_to_string(nvml_dir.join(format!("gpu{index}")))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// True while `pid` exists and is not a zombie.
pub fn pid_alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(s) => match s.rfind(')') {
            Some(i) => !matches!(s[i + 2..].chars().next(), Some('Z') | Some('X')),
            None => false,
        },
        Err(_) => false,
    }
}
