//! Entry points over raw bytes for the fuzz targets (`fuzz/fuzz_targets/*.rs`) and for the
//! corpus replay test (`tests/fuzz_corpora.rs`), so the test replays exactly what was fuzzed.
//!
//! Each function feeds hostile bytes to one parser the way wedgewatch meets them in the
//! field, and throws the result away: the only property checked is "no panic, bounded
//! time". Each is a thin adapter; when a parser's signature changes, only its adapter does.

use crate::correlate::Correlator;
use crate::daemon::{self, Shared};
use crate::detect::Thresholds;
use crate::model::{CaptureMode, StackCapture};
use crate::probes::ProbeSet;
use crate::prom;
use crate::record::{read_records, ReadLimits};
use crate::sampler::StatsHandle;
use crate::sources::stacks::{self, RuleSet};
use crate::sys::http;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

/// One entry point: bytes in, nothing out (a panic or a hang is the failure).
pub type Entry = fn(&[u8]);

/// Every target, by the name of its fuzz target and corpus directory.
pub const TARGETS: &[(&str, Entry)] = &[
    ("prom", prom),
    ("http_response", http_response),
    ("pyspy_json", pyspy_json),
    ("probe_toml", probe_toml),
    ("thresholds_toml", thresholds_toml),
    ("recording", recording),
    ("daemon_request", daemon_request),
    ("metrics_request", metrics_request),
    ("snapshot", snapshot),
    ("bundle", bundle),
];

/// A Prometheus exposition as scraped; the first byte says whether the body was cut at the
/// size cap (a cut body drops its partial last line). Parsed twice: with small limits and a
/// `wanted` set, as the metrics source parses (cuts, raw sample, label bytes), and in full.
pub fn prom(data: &[u8]) {
    let (truncated, body) = match data.split_first() {
        Some((flag, rest)) => (flag & 1 == 1, rest),
        None => (false, data),
    };
    let limits = prom::ParseLimits {
        max_series: 64,
        raw_sample: 8,
        max_label_bytes: 256,
    };
    let wanted = |name: &str| name.starts_with("sglang:") || name.starts_with("vllm:");
    let _ = prom::parse_limited(body, truncated, &limits, &wanted);
    let _ = prom::parse_bytes(body, truncated);
}

/// The bytes an HTTP server sent, read as `http::get` reads them (a small cap, so the cut
/// paths are reached too).
pub fn http_response(data: &[u8]) {
    let _ = http::parse_response(data, 4096);
}

/// `py-spy dump --json` output: parsed, classified by the built-in stack rules, and
/// summarised as a window of two identical dumps.
pub fn pyspy_json(data: &[u8]) {
    let Ok(threads) = stacks::parse_dump(data) else {
        return;
    };
    let classified: Vec<_> = threads
        .into_iter()
        .map(|mut t| {
            builtin_rules().classify(Some("sglang"), &t).apply(&mut t);
            t
        })
        .collect();
    let capture = |t_ms| StackCapture {
        pid: 1,
        t_ms,
        mode: CaptureMode::Nonblocking,
        error: None,
        skipped: None,
        warnings: Vec::new(),
        threads: classified.clone(),
    };
    let _ = stacks::summarize_window(&[capture(0), capture(1000)]);
}

/// The stack rules of the built-in probes, compiled once.
fn builtin_rules() -> &'static RuleSet {
    static RULES: OnceLock<RuleSet> = OnceLock::new();
    RULES.get_or_init(|| {
        ProbeSet::builtin()
            .and_then(|p| RuleSet::new(&p.stack_rules))
            .unwrap_or_default()
    })
}

/// A probe file from a `--probes` directory.
pub fn probe_toml(data: &[u8]) {
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = ProbeSet::default().add_text(Path::new("fuzz.toml"), text);
    }
}

/// A `--thresholds` file.
pub fn thresholds_toml(data: &[u8]) {
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = Thresholds::from_toml(text);
    }
}

/// A recording (plain or gzip-framed) from a stranger, read record by record as `--from`
/// reads it, under small limits so the skip paths are reached too.
pub fn recording(data: &[u8]) {
    let limits = ReadLimits {
        max_line_bytes: 16 << 10,
        max_line_values: 4096,
    };
    if let Ok(mut records) = read_records(data, limits) {
        for _ in records.by_ref() {}
        let _ = records.stats();
    }
}

/// What a client writes to the daemon's socket: the first line, parsed as the daemon parses
/// it and, when it is a request, answered from an empty model.
pub fn daemon_request(data: &[u8]) {
    let line = match data.iter().position(|&b| b == b'\n') {
        Some(i) => &data[..i],
        None => data,
    };
    let Ok(req) = daemon::protocol::parse_request(line) else {
        return;
    };
    let cfg = daemon::DaemonConfig::new(PathBuf::from("/nonexistent"));
    let mut model = Correlator::new(cfg.thresholds.clone());
    model.history_ms = cfg.history_ms;
    model.window_ms = cfg.window_ms;
    let shared = Mutex::new(Shared::new(model, 1_700_000_000_000));
    let stats = StatsHandle::default();
    let answer = daemon::respond(&req, &shared, &stats, 1_700_000_060_000);
    let _ = serde_json::to_vec(&answer);
}

/// What a scraper (or anyone) sends the exporter (`--metrics-listen`): the request head,
/// read as the listener reads it ([`daemon::exporter::Head`], in arriving pieces until it is
/// done; the first byte sets the piece size, as a network would cut it) and routed as the
/// listener routes it; a `GET /metrics` is answered from an empty daemon.
pub fn metrics_request(data: &[u8]) {
    let Some((&cut, data)) = data.split_first() else {
        return;
    };
    let mut head = daemon::exporter::Head::default();
    for chunk in data.chunks(usize::from(cut).max(1)) {
        if head.done() {
            break;
        }
        head.push(chunk);
    }
    if head.route() == daemon::exporter::Route::Metrics {
        let published = daemon::exporter::Published::default();
        let _ = daemon::exporter::scrape(&published, &StatsHandle::default(), 1_700_000_000_000);
    }
}

/// A snapshot from a file, a bundle or a node's transport: counted against the parse
/// budget, parsed, rendered as report.md and merged (as `report`, `merge` and `fleet
/// snapshot` do with what they read).
pub fn snapshot(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(snap) = crate::snapshot::parse_snapshot(text, Path::new("fuzz.json")) else {
        return;
    };
    let _ = crate::report::render(&snap);
    let input = crate::merge::NodeInput {
        source: "fuzz.json".into(),
        snapshot: snap,
        name: None,
        collected: None,
    };
    let _ = crate::merge::merge(vec![input], Vec::new());
}

/// A bundle directory as `report DIR` reads it and `snapshot -o DIR --force` inspects it.
/// The first byte says what `snapshot.json` (low two bits) and the manifest (next two) are
/// on disk: a file, a link to one, a FIFO nobody writes, a directory; the rest, split at
/// the first NUL, is the manifest's text and the snapshot's. A hang (a FIFO waited on) or a
/// panic is the failure.
pub fn bundle(data: &[u8]) {
    let Some((&kind, rest)) = data.split_first() else {
        return;
    };
    let mut parts = rest.splitn(2, |b| *b == 0);
    let manifest = parts.next().unwrap_or_default();
    let snap = parts.next().unwrap_or_default();
    let Some(dir) = scratch_dir() else {
        return;
    };
    plant(&dir, "snapshot.json", kind & 3, snap);
    plant(&dir, crate::snapshot::MANIFEST, (kind >> 2) & 3, manifest);
    let _ = crate::snapshot::read_snapshot(&dir);
    let _ = crate::snapshot::check_bundle_target(&dir, crate::snapshot::Overwrite::PreviousBundle);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A fresh private directory for one [`bundle`] input.
fn scratch_dir() -> Option<PathBuf> {
    use std::os::unix::fs::DirBuilderExt;
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    let n = N.fetch_add(1, Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("wedgewatch-fuzz-{}-{n}", std::process::id()));
    std::fs::DirBuilder::new().mode(0o700).create(&dir).ok()?;
    Some(dir)
}

/// `name` in `dir` as `kind` says (see [`bundle`]), holding `bytes` where it can.
fn plant(dir: &Path, name: &str, kind: u8, bytes: &[u8]) {
    let path = dir.join(name);
    let _ = match kind {
        0 => std::fs::write(&path, bytes),
        1 => {
            let target = dir.join(format!("target-{name}"));
            std::fs::write(&target, bytes).and_then(|()| std::os::unix::fs::symlink(target, &path))
        }
        2 => nix::unistd::mkfifo(&path, nix::sys::stat::Mode::from_bits_truncate(0o600))
            .map_err(std::io::Error::from),
        _ => std::fs::create_dir(&path),
    };
}
