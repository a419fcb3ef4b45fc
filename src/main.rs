//! The `wedgewatch` command line: a thin front over the library.
//!
//! Verbs: `snapshot`, `diff`, `doctor` (more land beside them: `daemon`, `record`, `tui`,
//! `demo`, `export`). Global options apply to every verb.

use anyhow::{bail, Context};
use clap::{Args, Parser, Subcommand};
use std::io::IsTerminal;
use std::path::PathBuf;
use std::time::Duration;
use wedgewatch::clock::{Clock, SystemClock};
use wedgewatch::discover::{self, DiscoverOptions};
use wedgewatch::model::Topology;
use wedgewatch::probes::ProbeSet;
use wedgewatch::snapshot::{self, AssembleOptions, SnapshotParts};
use wedgewatch::sources::processes::{self, ProcessesSource};
use wedgewatch::{diff, doctor};

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
}

#[derive(Debug, Subcommand)]
enum Verb {
    /// Sample the stack and write a snapshot (JSON + Markdown bundle).
    Snapshot(SnapshotArgs),
    /// What changed between two snapshots (env, cmdline, versions, topology, restarts).
    Diff(DiffArgs),
    /// What can be sampled here and why not.
    Doctor,
}

#[derive(Debug, Args)]
struct SnapshotArgs {
    /// Print the snapshot JSON to stdout.
    #[arg(long)]
    json: bool,
    /// Write the bundle (snapshot.json, report.md, raw/) to DIR, atomically.
    #[arg(short = 'o', long = "output", value_name = "DIR")]
    output: Option<PathBuf>,
    /// Sampling window in seconds.
    #[arg(long, value_name = "SECS", default_value_t = 3.0)]
    window: f64,
    /// Compare with this earlier snapshot and report what changed (config_changed).
    #[arg(long, value_name = "FILE")]
    baseline: Option<PathBuf>,
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
        Ok(code) => std::process::exit(code),
        Err(e) => {
            eprintln!("wedgewatch: {e:#}");
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
        None => {
            eprintln!("wedgewatch: the live view is not in this build yet; try `wedgewatch snapshot --json`, `wedgewatch doctor` or `wedgewatch --help`");
            Ok(2)
        }
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
        ..DiscoverOptions::default()
    }
}

/// Everything the snapshot is made of. Today: topology + process facts, other sources marked
/// "not sampled in this build". When the sampler/correlator lands, this is the one call to
/// replace (it returns the correlator's `SnapshotParts` for the window).
fn collect_parts(
    g: &Global,
    topology: Topology,
    _window: Duration,
) -> anyhow::Result<SnapshotParts> {
    let source = ProcessesSource::new(g.proc_root.clone());
    let (facts, status) = source.collect(&processes::topology_pids(&topology));
    Ok(snapshot::process_only_parts(
        topology,
        facts,
        status,
        SystemClock.now_ms(),
    ))
}

fn cmd_snapshot(g: &Global, a: SnapshotArgs) -> anyhow::Result<i32> {
    if !a.json && a.output.is_none() {
        bail!("say where the snapshot goes: --json (stdout) and/or -o DIR (bundle)");
    }
    if !(a.window.is_finite() && a.window >= 0.0 && a.window <= 3600.0) {
        bail!("--window must be between 0 and 3600 seconds");
    }
    let probes = load_probes(g)?;
    let topology = discover::discover(&probes, &discover_options(g))?;
    let mut parts = collect_parts(g, topology, Duration::from_secs_f64(a.window))?;
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
            .extend(diff::findings_from_changes(&d.changes));
        parts.config_changed = d.changes;
    }
    let bundle = snapshot::assemble_bundle(parts, &opts);
    if let Some(dir) = &a.output {
        snapshot::write_bundle(&bundle.snapshot, &bundle.raw, dir)
            .with_context(|| format!("writing the bundle to {}", dir.display()))?;
        eprintln!("wedgewatch: bundle written to {}", dir.display());
    }
    if a.json {
        println!("{}", serde_json::to_string_pretty(&bundle.snapshot)?);
    }
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
            discover: discover_options(g),
        },
    );
    print!("{}", report.render());
    Ok(if report.fatal() { 1 } else { 0 })
}
