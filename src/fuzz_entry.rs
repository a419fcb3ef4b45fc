//! Entry points over raw bytes for the fuzz targets (`fuzz/fuzz_targets/*.rs`) and for the
//! corpus replay test (`tests/fuzz_corpora.rs`), so the test replays exactly what was fuzzed.
//!
//! Each function feeds hostile bytes to one parser the way wedgewatch meets them in the
//! field, and throws the result away: the only property checked is "no panic, bounded
//! time". Each is a thin adapter; when a parser's signature changes, only its adapter does.

use crate::correlate::Model;
use crate::daemon::{self, Shared};
use crate::detect::Thresholds;
use crate::model::{CaptureMode, StackCapture};
use crate::probes::ProbeSet;
use crate::record::Recording;
use crate::sampler::StatsHandle;
use crate::sources::stacks::{self, RuleSet};
use crate::{http, prom};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
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
];

/// A Prometheus exposition as scraped; the first byte says whether the body was cut at the
/// size cap (a cut body drops its partial last line).
pub fn prom(data: &[u8]) {
    let (truncated, body) = match data.split_first() {
        Some((flag, rest)) => (flag & 1 == 1, rest),
        None => (false, data),
    };
    let _ = prom::parse_bytes(body, truncated);
}

/// The bytes an HTTP server sent, handled as `http::get` handles what it read.
pub fn http_response(data: &[u8]) {
    if let Some(h) = http::find_header_end(data) {
        let _ = http::parse_status(data);
        let _ = data
            .get(..h)
            .and_then(|head| http::header_value(head, "content-length"))
            .and_then(|v| v.trim().parse::<usize>().ok());
    }
    let body = http::split_body(data).unwrap_or_default();
    if http::is_chunked(data) {
        let _ = http::dechunk(&body);
    }
}

/// `py-spy dump --json` output: parsed, classified by the built-in stack rules, and
/// summarised as a window of two identical dumps.
pub fn pyspy_json(data: &[u8]) {
    let Ok(threads) = stacks::parse_pyspy_json(&String::from_utf8_lossy(data)) else {
        return;
    };
    let classified: Vec<_> = threads
        .into_iter()
        .map(|mut t| {
            let (state, rule) = builtin_rules().classify(Some("sglang"), &t);
            (t.state, t.rule) = (state, rule);
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

/// A recording file (plain or gzip-framed), read record by record as `--from` reads it.
/// The reader takes a path, so the bytes go through a scratch file.
pub fn recording(data: &[u8]) {
    let path = scratch_path();
    if std::fs::write(&path, data).is_err() {
        return;
    }
    let rec = Recording {
        files: vec![path.clone()],
    };
    let mut it = rec.records();
    for _ in it.by_ref() {}
    let _ = std::fs::remove_file(&path);
}

/// A file name of its own for each call (the replay test runs targets in parallel).
fn scratch_path() -> PathBuf {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let dir = Path::new("/dev/shm");
    let dir = if dir.is_dir() {
        dir.to_path_buf()
    } else {
        std::env::temp_dir()
    };
    dir.join(format!("wedgewatch-fuzz-{}-{n}.rec", std::process::id()))
}

/// Longest request line the daemon reads (its `MAX_REQUEST`).
const MAX_REQUEST: usize = 256;

/// What a client writes to the daemon's socket: the first line of at most 256 bytes, which
/// must be UTF-8, answered from an empty model.
pub fn daemon_request(data: &[u8]) {
    let head = data.get(..MAX_REQUEST).unwrap_or(data);
    let line = match head.iter().position(|&b| b == b'\n') {
        Some(i) => &head[..=i],
        None => head,
    };
    let Ok(line) = std::str::from_utf8(line) else {
        return;
    };
    let cfg = daemon::DaemonConfig::new(PathBuf::from("/nonexistent"));
    let mut model = Model::new(cfg.thresholds.clone());
    model.history_ms = cfg.history_ms;
    model.window_ms = cfg.window_ms;
    let shared = Mutex::new(Shared {
        model,
        baselines: Vec::new(),
        latest_facts: None,
        started_ms: 1_700_000_000_000,
    });
    let stats = StatsHandle::default();
    let answer = daemon::respond(line.trim(), &shared, &stats, 1_700_000_060_000);
    let _ = serde_json::to_vec(&answer);
}
