//! The `wedgewatch` command line: a thin front over the library.
//!
//! Verbs: `tui` (the default), `snapshot`, `daemon`, `record`, `export`, `diff`, `doctor`,
//! `demo`. Global options apply to every verb. Everything that samples goes through
//! `wedgewatch::attach`, so every verb samples the same way.

#![deny(clippy::unwrap_used, clippy::expect_used)]

use anyhow::{bail, Context};
use clap::{Args, Parser, Subcommand};
use std::io::IsTerminal;
use std::path::Path;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use wedgewatch::attach::{self, AttachOptions};
use wedgewatch::clock::{Clock, SystemClock};
use wedgewatch::daemon::{self, Daemon, DaemonConfig};
use wedgewatch::detect::Thresholds;
use wedgewatch::discover::DiscoverOptions;
use wedgewatch::probes::ProbeSet;
use wedgewatch::record::{self, NotARecording, Recording};
use wedgewatch::snapshot::{self, AssembleOptions, SnapshotParts};
use wedgewatch::{diff, doctor, export};

mod cli;
use cli::{demo as cli_demo, exit as cli_exit, report as cli_report, tui as cli_tui};

/// How long a stopped daemon may take to wind down (socket removed, recording flushed).
const DAEMON_STOP: Duration = Duration::from_secs(2);

#[derive(Debug, Parser)]
#[command(
    name = "wedgewatch",
    version,
    about = "Attach to a running LLM inference stack (SGLang/vLLM) and find the requests that were accepted and forgotten"
)]
struct Cli {
    #[command(flatten)]
    global: Global,
    #[command(subcommand)]
    verb: Option<Verb>,
}

/// Options every verb understands.
#[derive(Debug, Args, Clone)]
struct Global {
    /// Extra probe profiles: every *.toml in DIR (repeatable).
    #[arg(long = "probes", value_name = "DIR", global = true)]
    probes: Vec<PathBuf>,
    /// Load this libnvidia-ml.so instead of the default one.
    #[arg(long, value_name = "PATH", env = "WEDGEWATCH_NVML_LIB", global = true)]
    nvml_lib: Option<PathBuf>,
    /// Add a process discovery missed (repeatable).
    #[arg(long = "pid", value_name = "PID", global = true)]
    pids: Vec<i32>,
    /// Add an HTTP endpoint discovery missed, e.g. http://127.0.0.1:8000 (repeatable).
    #[arg(long = "url", value_name = "URL", global = true)]
    urls: Vec<String>,
    /// procfs root (for fixture trees in tests).
    #[arg(
        long,
        value_name = "PATH",
        default_value = "/proc",
        global = true,
        hide = true
    )]
    proc_root: PathBuf,
    /// Do not redact secrets (the output says so).
    #[arg(long, global = true)]
    no_redact: bool,
    /// The py-spy binary to run (default: $WEDGEWATCH_PY_SPY, else PATH).
    #[arg(long, value_name = "PATH", global = true)]
    py_spy: Option<PathBuf>,
    /// Also capture native frames with py-spy --native. This PAUSES the targets while
    /// they are read; only use it when asked to.
    #[arg(long, global = true)]
    native: bool,
    /// Detector thresholds (TOML; missing keys keep their defaults, see docs/findings.md).
    #[arg(long, value_name = "FILE", global = true)]
    thresholds: Option<PathBuf>,
    /// Where the daemon keeps its recording, lock and socket (default: root:
    /// $STATE_DIRECTORY or /var/lib/wedgewatch, socket in /run/wedgewatch; others:
    /// $XDG_STATE_HOME/wedgewatch, socket in $XDG_RUNTIME_DIR/wedgewatch).
    #[arg(long, value_name = "DIR", global = true)]
    state_dir: Option<PathBuf>,
    /// Series kept per metrics scrape; an endpoint exporting more is cut there and the
    /// metrics source says so.
    #[arg(long, value_name = "N", default_value_t = 20_000,
          value_parser = clap::value_parser!(u32).range(1..=1_000_000), global = true)]
    max_series: u32,
    /// Environment variable holding a router's API key, for a router whose own arguments
    /// have no --api-key: read from the router's environment, else from this one (sent only
    /// to a router run by root or by you). Never written to any output.
    #[arg(long, value_name = "NAME", global = true)]
    router_key_env: Option<String>,
}

#[derive(Debug, Subcommand)]
enum Verb {
    /// The live terminal UI (also what `wedgewatch` alone runs).
    Tui(TuiArgs),
    /// Sample the stack and write a snapshot (JSON + Markdown bundle).
    Snapshot(SnapshotArgs),
    /// Sample continuously: bounded history, recording, baselines, live state on a socket.
    Daemon(DaemonArgs),
    /// Record samples to a file for a while, for replay elsewhere.
    Record(RecordArgs),
    /// Export the request timeline as Chrome trace-event JSON (opens in Perfetto).
    Export(ExportArgs),
    /// Bring up the built-in lab stack, wedge it like the incident, and open the UI on it.
    Demo(cli_demo::DemoArgs),
    /// What changed between two snapshots (env, cmdline, versions, topology, restarts).
    Diff(DiffArgs),
    /// What can be sampled here and why not.
    Doctor,
    /// Render report.md (or text, or the verdict as JSON) again from a snapshot or bundle.
    Report(cli_report::ReportArgs),
}

#[derive(Debug, Args)]
struct SnapshotArgs {
    /// Print the snapshot JSON to stdout.
    #[arg(long)]
    json: bool,
    /// Write the bundle (snapshot.json, report.md, raw/) to DIR, atomically. An existing
    /// non-empty DIR is refused.
    #[arg(short = 'o', long = "output", value_name = "DIR")]
    output: Option<PathBuf>,
    /// With -o: replace a previous bundle's own files in DIR (anything else there is kept).
    #[arg(long, requires = "output")]
    force: bool,
    /// Sampling window in seconds.
    #[arg(long, value_name = "SECS", default_value_t = 3.0)]
    window: f64,
    /// Compare with this earlier snapshot and report what changed (config_changed).
    #[arg(long, value_name = "FILE")]
    baseline: Option<PathBuf>,
    /// Replay a recording (from `record` or the daemon's recording dir) instead of sampling.
    #[arg(long, value_name = "FILE")]
    from: Option<PathBuf>,
    /// With --from: the time to look at (RFC 3339, epoch ms, or +SECONDS from the start).
    #[arg(long, value_name = "TIME", requires = "from")]
    at: Option<String>,
    /// Sample here even when a daemon is running.
    #[arg(long)]
    no_daemon: bool,
}

#[derive(Debug, Args)]
struct TuiArgs {
    /// Play a recording instead of watching live, or show a snapshot file or bundle
    /// directory as a still frame.
    #[arg(long, value_name = "FILE")]
    replay: Option<PathBuf>,
    /// Sample in-process even when a daemon is running.
    #[arg(long)]
    no_daemon: bool,
}

#[derive(Debug, Args)]
struct DaemonArgs {
    /// Keep history in memory only (no recording on disk).
    #[arg(long)]
    no_record: bool,
    /// Stop after this long (e.g. 90s, 10m); default: until SIGINT/SIGTERM.
    #[arg(long = "for", value_name = "DURATION")]
    run_for: Option<String>,
}

#[derive(Debug, Args)]
struct RecordArgs {
    /// The recording file to write.
    #[arg(short = 'o', long = "output", value_name = "FILE")]
    output: PathBuf,
    /// How long to record (e.g. 30s, 5m).
    #[arg(long = "for", value_name = "DURATION")]
    run_for: String,
}

#[derive(Debug, Args)]
struct ExportArgs {
    /// Write Chrome trace-event JSON here.
    #[arg(long, value_name = "FILE")]
    perfetto: PathBuf,
    /// From a snapshot file or bundle, or a recording; default: the running daemon, else
    /// a fresh sample of --window seconds.
    #[arg(long, value_name = "FILE")]
    from: Option<PathBuf>,
    /// Sampling window in seconds when sampling here.
    #[arg(long, value_name = "SECS", default_value_t = 3.0)]
    window: f64,
}

#[derive(Debug, Args)]
struct DiffArgs {
    /// The baseline snapshot (file or bundle directory).
    a: PathBuf,
    /// The later snapshot (file or bundle directory).
    b: PathBuf,
    /// Print `wedgewatch.diff/1` JSON.
    #[arg(long)]
    json: bool,
}

fn main() {
    let cli = Cli::parse();
    match run(cli) {
        Ok(code) => {
            wedgewatch::children::kill_all();
            std::process::exit(code)
        }
        Err(e) => {
            eprintln!(
                "wedgewatch: {}",
                wedgewatch::redact::log_line(&format!("{e:#}"))
            );
            std::process::exit(2);
        }
    }
}

fn run(cli: Cli) -> anyhow::Result<i32> {
    let g = cli.global;
    match cli.verb {
        Some(Verb::Snapshot(a)) => cmd_snapshot(&g, a),
        Some(Verb::Diff(a)) => cmd_diff(a),
        Some(Verb::Doctor) => cmd_doctor(&g),
        Some(Verb::Daemon(a)) => cmd_daemon(&g, a),
        Some(Verb::Record(a)) => cmd_record(&g, a),
        Some(Verb::Export(a)) => cmd_export(&g, a),
        Some(Verb::Tui(a)) => cli_tui::cmd_tui(&g, a),
        Some(Verb::Demo(a)) => cli_demo::cmd_demo(&g, a),
        Some(Verb::Report(a)) => cli_report::cmd_report(a),
        None => cli_tui::cmd_tui(
            &g,
            TuiArgs {
                replay: None,
                no_daemon: false,
            },
        ),
    }
}

fn load_probes(g: &Global) -> anyhow::Result<ProbeSet> {
    Ok(ProbeSet::load(&g.probes)?)
}

fn discover_options(g: &Global) -> DiscoverOptions {
    DiscoverOptions {
        proc_root: g.proc_root.clone(),
        extra_pids: g.pids.clone(),
        extra_urls: g.urls.clone(),
        router_key_env: g.router_key_env.clone(),
        ..DiscoverOptions::default()
    }
}

/// The options every sampling verb attaches with.
fn attach_options(g: &Global) -> anyhow::Result<AttachOptions> {
    let mut o = AttachOptions::new(load_probes(g)?);
    o.proc_root = g.proc_root.clone();
    o.extra_pids = g.pids.clone();
    o.extra_urls = g.urls.clone();
    o.nvml_lib = g.nvml_lib.clone();
    o.py_spy = g.py_spy.clone();
    o.native = g.native;
    o.thresholds = thresholds(g)?;
    o.max_series = g.max_series as usize;
    o.router_key_env = g.router_key_env.clone();
    Ok(o)
}

fn thresholds(g: &Global) -> anyhow::Result<Thresholds> {
    match &g.thresholds {
        None => Ok(Thresholds::default()),
        Some(p) => {
            let text = wedgewatch::config_check::read_config(p).context("reading thresholds")?;
            Thresholds::from_toml(&text).with_context(|| format!("thresholds {}", p.display()))
        }
    }
}

fn daemon_config(g: &Global) -> DaemonConfig {
    match &g.state_dir {
        Some(d) => DaemonConfig::new(d.clone()),
        None => DaemonConfig::default(),
    }
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        // More workers than cores: a worker blocked on the model lock must not starve sampling.
        .worker_threads(4)
        .enable_all()
        .build()
        .context("starting the async runtime")
}

/// `90`, `90s`, `5m`, `1h`, `250ms` -> milliseconds.
fn parse_duration_ms(s: &str) -> anyhow::Result<u64> {
    let s = s.trim();
    let (num, mult) = if let Some(n) = s.strip_suffix("ms") {
        (n, 1.0)
    } else if let Some(n) = s.strip_suffix('s') {
        (n, 1000.0)
    } else if let Some(n) = s.strip_suffix('m') {
        (n, 60_000.0)
    } else if let Some(n) = s.strip_suffix('h') {
        (n, 3_600_000.0)
    } else {
        (s, 1000.0)
    };
    let v: f64 = num
        .trim()
        .parse()
        .with_context(|| format!("bad duration {s:?}: expected e.g. 30s, 5m, 1h"))?;
    if !(v.is_finite() && v >= 0.0) {
        bail!("bad duration {s:?}");
    }
    Ok((v * mult) as u64)
}

/// Parts from a running daemon, if one answers on its socket.
fn parts_from_daemon(g: &Global) -> Option<SnapshotParts> {
    let cfg = daemon_config(g);
    if !cfg.socket_path.exists() {
        return None;
    }
    match daemon::query_blocking(&cfg.socket_path, "snapshot", 5000)
        .and_then(|v| daemon::parts_from_answer(&v))
    {
        Ok(p) => {
            eprintln!(
                "wedgewatch: using the daemon at {} (its history and baseline)",
                cfg.socket_path.display()
            );
            Some(p)
        }
        Err(e) => {
            let e = wedgewatch::redact::log_line(&e.to_string());
            eprintln!("wedgewatch: daemon not usable ({e}); sampling here instead");
            None
        }
    }
}

/// Parts replayed from a recording up to `at`.
fn parts_from_recording(
    path: &Path,
    at: Option<&str>,
    th: Thresholds,
) -> anyhow::Result<SnapshotParts> {
    let rec = Recording::open(path)?;
    let at_ms = match at {
        None => None,
        Some(a) => {
            let start = rec
                .records()
                .find_map(|r| r.ok().map(|r| r.t_ms()))
                .unwrap_or(0);
            Some(record::parse_at(a, start)?)
        }
    };
    let replayed = record::replay(&rec, at_ms, th)?;
    if let Some(skipped) = replayed.stats.summary() {
        eprintln!("wedgewatch: {}: {skipped}", path.display());
    }
    Ok(wedgewatch::pipeline::parts(&replayed.model, replayed.at_ms))
}

/// Samples here for the window.
fn parts_by_sampling(g: &Global, window: Duration) -> anyhow::Result<SnapshotParts> {
    let opts = attach_options(g)?;
    let model = cli_exit::block_on(attach::collect_window(
        &opts,
        window.as_millis() as u64,
        Arc::new(SystemClock),
    ))??;
    Ok(wedgewatch::pipeline::parts(&model, SystemClock.now_ms()))
}

fn cmd_snapshot(g: &Global, a: SnapshotArgs) -> anyhow::Result<i32> {
    if !a.json && a.output.is_none() {
        bail!("say where the snapshot goes: --json (stdout) and/or -o DIR (bundle)");
    }
    if !(a.window.is_finite() && a.window >= 0.0 && a.window <= 3600.0) {
        bail!("--window must be between 0 and 3600 seconds");
    }
    let overwrite = if a.force {
        snapshot::Overwrite::PreviousBundle
    } else {
        snapshot::Overwrite::Refuse
    };
    if let Some(dir) = &a.output {
        // refuse before sampling, not after
        snapshot::check_bundle_target(dir, overwrite)?;
    }
    let mut parts = match &a.from {
        Some(f) => parts_from_recording(f, a.at.as_deref(), thresholds(g)?)?,
        None => match (!a.no_daemon).then(|| parts_from_daemon(g)).flatten() {
            Some(p) => p,
            None => parts_by_sampling(g, Duration::from_secs_f64(a.window))?,
        },
    };
    let opts = AssembleOptions {
        redact: !g.no_redact,
        ..AssembleOptions::default()
    };
    if let Some(base) = &a.baseline {
        let before = snapshot::read_snapshot(base)?;
        // compare like with like: the baseline was redacted (or not) the same way
        let now = snapshot::assemble(parts.clone(), &opts);
        let d = diff::diff_snapshots(&before, &now);
        parts
            .findings
            .retain(|f| f.kind != wedgewatch::model::FindingKind::ConfigChanged);
        parts
            .findings
            .extend(wedgewatch::detect::config_changed(&d.changes));
        parts.config_changed = d.changes;
    }
    let bundle = snapshot::assemble_bundle(parts, &opts);
    if let Some(dir) = &a.output {
        snapshot::write_bundle(&bundle.snapshot, &bundle.raw, dir, overwrite)
            .with_context(|| format!("writing the bundle to {}", dir.display()))?;
        eprintln!("wedgewatch: bundle written to {}", dir.display());
    }
    if a.json {
        println!("{}", serde_json::to_string_pretty(&bundle.snapshot)?);
    }
    Ok(0)
}

/// Resolves on SIGINT/SIGTERM, or after `run_for` ms.
async fn stop_signal(run_for: Option<u64>) {
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    let timer = async {
        match run_for {
            Some(ms) => tokio::time::sleep(Duration::from_millis(ms)).await,
            None => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term => {}
        _ = timer => {}
    }
}

fn cmd_daemon(g: &Global, a: DaemonArgs) -> anyhow::Result<i32> {
    let opts = attach_options(g)?;
    let mut cfg = daemon_config(g);
    cfg.thresholds = opts.thresholds.clone();
    if a.no_record {
        cfg.rotation = None;
    }
    let run_for = a.run_for.as_deref().map(parse_duration_ms).transpose()?;
    let rt = runtime()?;
    let ran = rt.block_on(async {
        let mut d = Daemon::new(cfg.clone(), Arc::new(SystemClock), opts.discover_fn());
        for s in opts.sources()? {
            d.add_default_source(s);
        }
        let (tx, rx) = tokio::sync::watch::channel(false);
        eprintln!(
            "wedgewatch daemon: socket {}, recording {}",
            cfg.socket_path.display(),
            if cfg.rotation.is_some() {
                cfg.recording_dir().display().to_string()
            } else {
                "off".into()
            }
        );
        let mut task = tokio::spawn(d.run(rx));
        stop_signal(run_for).await;
        let _ = tx.send(true);
        // In-flight samples are cut short on stop; a daemon that still does not end
        // (a stuck write) is abandoned rather than waited for.
        match tokio::time::timeout(DAEMON_STOP, &mut task).await {
            Ok(joined) => joined.context("daemon task")??,
            Err(_) => {
                task.abort();
                eprintln!(
                    "wedgewatch daemon: did not stop within {} ms; abandoned",
                    DAEMON_STOP.as_millis()
                );
            }
        }
        anyhow::Ok(())
    });
    cli_exit::shut_down(rt);
    ran?;
    Ok(0)
}

fn cmd_record(g: &Global, a: RecordArgs) -> anyhow::Result<i32> {
    let opts = attach_options(g)?;
    let ms = parse_duration_ms(&a.run_for)?;
    let n = cli_exit::block_on(async {
        let topology = opts.discover().await?;
        let (_tx, rx) = tokio::sync::watch::channel(topology.clone());
        let sampler = opts.sampler(Arc::new(SystemClock), rx)?;
        let n = record::record_to_file(sampler, &a.output, ms, &topology, Arc::new(SystemClock))
            .await?;
        anyhow::Ok(n)
    })??;
    eprintln!("wedgewatch: recorded {n} samples to {}", a.output.display());
    Ok(0)
}

fn cmd_export(g: &Global, a: ExportArgs) -> anyhow::Result<i32> {
    let trace = match &a.from {
        // A recording is recognised by its first bytes: check that first, so a big
        // recording is never read whole as a would-be snapshot.
        Some(f) => match Recording::open(f) {
            Ok(_) => export::perfetto(&parts_from_recording(f, None, thresholds(g)?)?),
            Err(wedgewatch::error::Error::NotARecording {
                why: NotARecording::Snapshot | NotARecording::Json,
                ..
            }) => export::perfetto_snapshot(&snapshot::read_snapshot(f)?),
            Err(e) if f.is_dir() => match snapshot::read_snapshot(f) {
                Ok(snap) => export::perfetto_snapshot(&snap),
                Err(_) => return Err(e.into()),
            },
            Err(e) => return Err(e.into()),
        },
        None => {
            let parts = match parts_from_daemon(g) {
                Some(p) => p,
                None => parts_by_sampling(g, Duration::from_secs_f64(a.window.clamp(0.0, 3600.0)))?,
            };
            export::perfetto(&parts)
        }
    };
    std::fs::write(&a.perfetto, serde_json::to_vec(&trace)?)
        .with_context(|| format!("writing {}", a.perfetto.display()))?;
    eprintln!(
        "wedgewatch: trace written to {} (open it at ui.perfetto.dev)",
        a.perfetto.display()
    );
    Ok(0)
}

fn cmd_diff(a: DiffArgs) -> anyhow::Result<i32> {
    let before = snapshot::read_snapshot(&a.a)?;
    let after = snapshot::read_snapshot(&a.b)?;
    let d = diff::diff_snapshots(&before, &after);
    if a.json {
        println!("{}", serde_json::to_string_pretty(&d)?);
    } else {
        let color = std::io::stdout().is_terminal()
            && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
        print!("{}", diff::render_human(&d, color));
    }
    Ok(0)
}

fn cmd_doctor(g: &Global) -> anyhow::Result<i32> {
    let probes = load_probes(g)?;
    let report = doctor::run(
        &probes,
        &doctor::DoctorOptions {
            proc_root: g.proc_root.clone(),
            nvml_lib: g.nvml_lib.clone(),
            py_spy: g.py_spy.clone(),
            discover: discover_options(g),
        },
    );
    // doctor quotes host facts (paths, process names): no live control sequences
    print!("{}", wedgewatch::redact::control::text(&report.render()));
    Ok(if report.fatal() { 1 } else { 0 })
}
