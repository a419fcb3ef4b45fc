//! `wedgewatch demo`: brings up the built-in lab stack (proxy -> real SGLang router (PD) ->
//! prefill + decode engines on fake GPUs), runs the agents healthy, restarts the decode engine
//! with the tuning variable (the change since noon), lets the agents hang, and opens the UI on
//! it with the daemon's baseline. Quitting tears the lab down. The demo watches its own lab
//! only (the lab is its process tree, `adopt`), not another stack on the same host.

use super::adopt;
use super::duration;
use super::exit::code;
use super::options::Sampling;
use super::progress;
use super::snapshot::is_stdout;
use super::tui::{need_terminal, watch_socket, InProcessDaemon};
use anyhow::{bail, Context};
use clap::Args;
use std::io::{IsTerminal, Write};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};
use wedgewatch::attach::AttachOptions;
use wedgewatch::daemon;
use wedgewatch::model::{FindingKind, Snapshot};
use wedgewatch::snapshot::{self, AssembleOptions};

/// The decode engine's added variable: the one change since the known-good state.
pub const TUNING_VAR: &str = "SGLANG_DECODE_PREALLOC_SPLIT_TOKENS";
const TUNING_VALUE: &str = "100";

const EXAMPLES: &str = "\
Examples:
  wedgewatch demo                           # the live UI on the wedged lab; q quits and tears down
  wedgewatch demo --no-tui -o bundle/       # no terminal: wait for the wedge, write the bundle
  wedgewatch demo --no-tui --for 3m --json  # the snapshot JSON on stdout

Exit status: 0 the wedge was found (--no-tui) or the UI quit, 1 not found within --for,
2 usage error (or no terminal without --no-tui), 3 could not sample at all.";

#[derive(Debug, Args)]
#[command(after_help = EXAMPLES)]
pub struct DemoArgs {
    /// The lab's control script (default: the one in this source tree).
    #[arg(long, value_name = "PATH")]
    lab: Option<PathBuf>,
    /// Agents in the harness.
    #[arg(long, default_value_t = 3)]
    agents: u32,
    /// Run without the UI: wait until the wedge is found (at most --for), write the snapshot
    /// bundle to -o DIR (or print its JSON), tear down, exit 0 if found, 1 if not.
    #[arg(long)]
    no_tui: bool,
    /// With --no-tui: the bundle directory (`-`: the snapshot JSON on stdout).
    #[arg(short = 'o', long = "output", value_name = "DIR", requires = "no_tui")]
    output: Option<PathBuf>,
    /// With --no-tui: print the snapshot JSON to stdout (the default without -o).
    #[arg(long, requires = "no_tui")]
    json: bool,
    /// With --no-tui: how long to wait for the wedge (90s, 5m; a bare number is seconds).
    #[arg(long = "for", value_name = "DURATION", default_value = "120s",
          value_parser = duration::at_most(Duration::from_secs(3600)))]
    wait: Duration,
    #[command(flatten)]
    sampling: Sampling,
}

fn default_lab() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/lab/lab.py"))
}

/// The lab stack and the harness; torn down on drop, whatever happened.
struct LabGuard {
    lab: PathBuf,
    run_dir: PathBuf,
    harness: Option<Child>,
}

impl LabGuard {
    fn lab_cmd(&self) -> Command {
        let mut c = Command::new("python3");
        c.arg(&self.lab);
        c
    }

    /// `lab.py load`: `agents` agents chatting for `rounds` rounds, `timeout` s per request.
    fn load_cmd(&self, agents: u32, rounds: u32, timeout: u32) -> Command {
        let mut c = self.lab_cmd();
        c.args(["load", "--run-dir"]).arg(&self.run_dir).args([
            "--agents",
            &agents.to_string(),
            "--rounds",
            &rounds.to_string(),
            "--timeout",
            &timeout.to_string(),
        ]);
        c
    }
}

impl Drop for LabGuard {
    fn drop(&mut self) {
        if let Some(mut h) = self.harness.take() {
            let _ = h.kill();
            let _ = h.wait();
        }
        tear_down(&self.lab, &self.run_dir);
    }
}

fn tear_down(lab: &Path, run_dir: &Path) {
    // Not eprintln!: it panics when the terminal is gone, which is one way we get here.
    let _ = writeln!(std::io::stderr(), "wedgewatch demo: tearing the lab down");
    // Detached from the terminal: after a hang-up it is gone (writes fail with EIO, which
    // would end the lab's script mid-way) and its process group may still be signalled.
    // A stderr that is not a terminal (a log file) gets the lab's messages.
    let lab_stderr = if std::io::stderr().is_terminal() {
        Stdio::null()
    } else {
        Stdio::inherit()
    };
    let down = Command::new("python3")
        .arg(lab)
        .args(["down", "--run-dir"])
        .arg(run_dir)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(lab_stderr)
        .process_group(0)
        .spawn();
    // Bounded: the demo must end even if the teardown hangs.
    if let Ok(mut down) = down {
        let deadline = Instant::now() + Duration::from_secs(30);
        while matches!(down.try_wait(), Ok(None)) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = down.kill();
        let _ = down.wait();
    }
    let _ = std::fs::remove_dir_all(run_dir);
}

static INTERRUPTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_interrupt(_: libc::c_int) {
    INTERRUPTED.store(true, Ordering::SeqCst);
}

/// Ctrl-C during set-up or a --no-tui wait must still tear the lab down: turn SIGINT,
/// SIGTERM and SIGHUP into a flag the steps check. SIGHUP too because a killed terminal
/// sends it more than once (tmux to the pane's group, the kernel when the pty closes): a
/// late one arriving after the UI put back the handlers it found would otherwise end the
/// demo by default action before the teardown starts, leaving the lab running.
fn catch_interrupts() {
    use nix::sys::signal::{sigaction, SaFlags, SigAction, SigHandler, SigSet, Signal};
    let act = SigAction::new(
        SigHandler::Handler(on_interrupt),
        SaFlags::empty(),
        SigSet::empty(),
    );
    for sig in [Signal::SIGINT, Signal::SIGTERM, Signal::SIGHUP] {
        // SAFETY: the handler only stores into an atomic, which is async-signal-safe.
        let _ = unsafe { sigaction(sig, &act) };
    }
}

fn check_interrupted() -> anyhow::Result<()> {
    if INTERRUPTED.load(Ordering::SeqCst) {
        bail!("interrupted");
    }
    Ok(())
}

/// A demo step: progress, shown on a terminal only (and not with --quiet).
fn step(msg: &str) {
    progress::step("wedgewatch demo", msg);
}

fn run_lab(cmd: &mut Command, what: &str) -> anyhow::Result<String> {
    let out = cmd
        .stderr(Stdio::inherit())
        .output()
        .with_context(|| format!("running the lab ({what})"))?;
    if !out.status.success() {
        bail!("the lab failed to {what} ({})", out.status);
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

pub fn cmd_demo(top: Sampling, mut a: DemoArgs) -> anyhow::Result<i32> {
    let g = Sampling::merge(top, std::mem::take(&mut a.sampling));
    if !a.no_tui {
        // before the lab comes up, not after
        need_terminal("`wedgewatch demo --no-tui`")?;
    }
    let lab = a.lab.clone().unwrap_or_else(default_lab);
    if !lab.exists() {
        bail!(
            "the lab is not at {} (run the demo from a wedgewatch checkout, or pass --lab)",
            lab.display()
        );
    }
    catch_interrupts();
    step("preparing the lab's Python environment (first use installs the real SGLang router, py-spy, aiohttp from PyPI)");
    run_lab(Command::new("python3").arg(&lab).arg("setup"), "set up")?;
    check_interrupted()?;

    let run_dir = std::env::temp_dir().join(format!("wedgewatch-demo-{}", std::process::id()));
    let mut guard = LabGuard {
        lab: lab.clone(),
        run_dir: run_dir.clone(),
        harness: None,
    };
    step("starting proxy -> sglang router (PD) -> prefill + decode engines on fake GPUs");
    let own_tree = adopt::adopt_orphans();
    let up = run_lab(
        guard.lab_cmd().args(["up", "--run-dir"]).arg(&run_dir),
        "start",
    )?;
    let info: serde_json::Value =
        serde_json::from_str(up.trim()).context("reading the lab's lab.json")?;
    check_interrupted()?;

    let mut opts = lab_attach_options(&g, &info)?;
    if own_tree {
        opts.within.push(nix::unistd::getpid().as_raw());
    }
    step("attaching wedgewatch (baseline of the healthy stack taken now)");
    let th = opts.thresholds.clone();
    let session = InProcessDaemon::start(&opts, th, 2_000)?;
    wedge(&mut guard, a.agents)?;
    adopt::reap_dead(&opts.proc_root, &adopt::lab_pids(&info));

    let assemble = g.assemble();
    if a.no_tui {
        return wait_for_wedge(&session.socket, &assemble, &a);
    }
    open_ui(session, guard, assemble)
}

/// The sampling options pointed at the lab's fake GPUs and its py-spy.
fn lab_attach_options(g: &Sampling, info: &serde_json::Value) -> anyhow::Result<AttachOptions> {
    // The lab's GPUs are a fake libnvidia-ml.so reading the schedulers' state files; point
    // NVML and py-spy at the lab's (no threads run yet, so setting the env is safe).
    if let Some(dir) = info.get("nvml_dir").and_then(|v| v.as_str()) {
        std::env::set_var("FAKE_NVML_DIR", dir);
    }
    let mut opts = g.attach_options()?;
    if opts.nvml_lib.is_none() && !env!("FAKE_NVML_PATH").is_empty() {
        opts.nvml_lib = Some(PathBuf::from(env!("FAKE_NVML_PATH")));
    }
    if opts.py_spy.is_none() {
        if let Some(venv) = info.get("venv").and_then(|v| v.as_str()) {
            let p = Path::new(venv).join("bin/py-spy");
            if p.exists() {
                opts.py_spy = Some(p);
            }
        }
    }
    Ok(opts)
}

/// Healthy rounds, the change since noon, then the agents that will hang.
fn wedge(guard: &mut LabGuard, agents: u32) -> anyhow::Result<()> {
    step(&format!("running {agents} agents healthy for 2 rounds"));
    let healthy = run_lab(&mut guard.load_cmd(agents, 2, 30), "run the healthy load")?;
    step(&format!("healthy rounds: {}", summarize_load(&healthy)));
    check_interrupted()?;

    step(&format!(
        "the change since noon: restarting the decode engine with {TUNING_VAR}={TUNING_VALUE}"
    ));
    run_lab(
        guard
            .lab_cmd()
            .args(["restart", "--run-dir"])
            .arg(&guard.run_dir)
            .args(["decode", "--env", &format!("{TUNING_VAR}={TUNING_VALUE}")]),
        "restart the decode engine",
    )?;
    check_interrupted()?;

    step("agents chatting again; they will hang after a few rounds");
    guard.harness = Some(
        guard
            .load_cmd(agents, 12, 900)
            .args(["--total-timeout", "1000"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("starting the harness")?,
    );
    Ok(())
}

/// The UI on the wedged lab, until the user quits; the lab is torn down after.
fn open_ui(
    session: InProcessDaemon,
    guard: LabGuard,
    assemble: AssembleOptions,
) -> anyhow::Result<i32> {
    // A killed terminal ends the UI by process exit (see the TUI's hang-up watchdog), where
    // `guard` never drops: tear the lab down from there too.
    let harness_pid = guard
        .harness
        .as_ref()
        .and_then(|h| i32::try_from(h.id()).ok());
    let (lab_path, lab_run_dir) = (guard.lab.clone(), guard.run_dir.clone());
    wedgewatch::tui::on_forced_exit(move || {
        if let Some(pid) = harness_pid {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
        tear_down(&lab_path, &lab_run_dir);
    });
    step("opening the UI: the wedge shows within a minute (press ? for keys, q to quit)");
    std::thread::sleep(Duration::from_millis(500));
    let code = watch_socket(&session.socket, assemble)?;
    drop(session);
    drop(guard);
    Ok(code)
}

fn summarize_load(json: &str) -> String {
    let v: serde_json::Value = match serde_json::from_str(json.trim()) {
        Ok(v) => v,
        Err(_) => return "(no report)".into(),
    };
    let agents = v
        .get("agents")
        .and_then(|a| a.as_array())
        .cloned()
        .unwrap_or_default();
    let rounds: Vec<String> = agents
        .iter()
        .map(|a| {
            a.get("rounds_completed")
                .and_then(|r| r.as_u64())
                .map(|r| r.to_string())
                .unwrap_or_else(|| "?".into())
        })
        .collect();
    format!(
        "{} agents, rounds completed: [{}]",
        agents.len(),
        rounds.join(", ")
    )
}

/// `--no-tui`: poll the daemon until a wedged_request finding appears, then write it.
fn wait_for_wedge(socket: &Path, assemble: &AssembleOptions, a: &DemoArgs) -> anyhow::Result<i32> {
    let deadline = Instant::now() + a.wait;
    let mut last: Option<Snapshot> = None;
    let found = loop {
        check_interrupted()?;
        if let Ok(parts) = daemon::query_blocking(socket, "snapshot", 5000)
            .and_then(|v| daemon::parts_from_answer(&v))
        {
            let snap = snapshot::assemble(parts, assemble);
            let wedged = snap
                .findings
                .iter()
                .any(|f| f.kind == FindingKind::WedgedRequest);
            let changed = snap
                .findings
                .iter()
                .any(|f| f.kind == FindingKind::ConfigChanged);
            last = Some(snap);
            if wedged && changed {
                break true;
            }
        }
        if Instant::now() >= deadline {
            break false;
        }
        std::thread::sleep(Duration::from_millis(1000));
    };
    let snap = match last {
        Some(s) => s,
        None => bail!("the daemon never answered"),
    };
    let dir = a.output.as_deref().filter(|p| !is_stdout(p));
    if let Some(dir) = dir {
        snapshot::write_bundle(&snap, &Default::default(), dir, snapshot::Overwrite::Refuse)?;
        progress::note(&format!("bundle written to {}", dir.display()));
    }
    if dir.is_none() || a.json {
        println!("{}", serde_json::to_string_pretty(&snap)?);
    }
    progress::note(if found {
        "demo: the wedge was found"
    } else {
        "demo: no wedged_request + config_changed within the wait"
    });
    // the demo succeeds when it shows the wedge: 1 is "not shown"
    Ok(if found { code::OK } else { 1 })
}
