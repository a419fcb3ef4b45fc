//! Building the snapshot (contract) and writing the bundle atomically.
//!
//! The pipeline (`pipeline::parts`) hands over [`SnapshotParts`]; [`assemble`] joins them with the topology
//! and process facts into a [`Snapshot`], applying redaction. Nothing else builds snapshots.
//! [`write_bundle`] (in `bundle`) writes one to disk.

use crate::clock::Millis;
use crate::error::{Error, Result};
use crate::model::{
    Component, ProcessFacts, SnapComponent, Snapshot, SourceKind, SourceStatus, Topology,
    SNAPSHOT_SCHEMA,
};
use crate::redact::Redactor;
use std::collections::BTreeMap;
use std::path::Path;

pub mod bounds;
mod bundle;
pub mod node;
mod versions;
pub use bounds::ParseBudget;
use bounds::Refused;
pub use bundle::{check_bundle_target, write_bundle, Overwrite, MANIFEST};

// The parts a snapshot is assembled from are model types (the correlator fills them in).
pub use crate::model::{ComponentExtras, SnapshotParts};

/// How to assemble.
#[derive(Debug, Clone)]
pub struct AssembleOptions {
    /// Redact secrets (the default; `--no-redact` turns it off and the snapshot says so).
    pub redact: bool,
    /// Free-form facts about the tool run (`version`, `host`, ...).
    pub tool: BTreeMap<String, String>,
}

impl Default for AssembleOptions {
    fn default() -> Self {
        let mut tool = BTreeMap::new();
        tool.insert("name".into(), "wedgewatch".into());
        tool.insert("version".into(), env!("CARGO_PKG_VERSION").into());
        AssembleOptions { redact: true, tool }
    }
}

/// An assembled snapshot plus its raw per-source files, both already redacted.
#[derive(Debug, Clone)]
pub struct Bundle {
    pub snapshot: Snapshot,
    /// File stem -> JSON, written as `raw/<stem>.json`.
    pub raw: BTreeMap<String, serde_json::Value>,
    /// What was redacted (to scrub anything else printed, e.g. logs).
    pub redactor: Redactor,
}

/// Reason given for sources this build does not sample yet.
pub const NOT_SAMPLED: &str = "not sampled in this build";

/// Parts for a snapshot that has only topology and process facts (no sampler yet): the other
/// sources are `unavailable` with [`NOT_SAMPLED`].
pub fn process_only_parts(
    topology: Topology,
    processes: Vec<ProcessFacts>,
    processes_status: SourceStatus,
    taken_at_ms: Millis,
) -> SnapshotParts {
    let mut sources = BTreeMap::new();
    for k in SourceKind::ALL {
        sources.insert(k, SourceStatus::unavailable(NOT_SAMPLED));
    }
    sources.insert(SourceKind::Processes, processes_status);
    let mut raw = BTreeMap::new();
    if let Ok(v) = serde_json::to_value(&topology) {
        raw.insert("topology".to_string(), v);
    }
    SnapshotParts {
        taken_at_ms,
        window_ms: 0,
        sources,
        topology,
        processes,
        raw,
        ..SnapshotParts::default()
    }
}

/// Builds the contract snapshot from its parts (see [`assemble_bundle`]).
pub fn assemble(parts: SnapshotParts, opts: &AssembleOptions) -> Snapshot {
    assemble_bundle(parts, opts).snapshot
}

fn rfc(ms: Option<Millis>) -> Option<String> {
    ms.map(crate::clock::rfc3339)
}

/// Builds the snapshot and its raw files, redacting every value that looks like a secret
/// (structurally in env/cmdline, then by value everywhere else) unless `opts.redact` is off.
pub fn assemble_bundle(mut parts: SnapshotParts, opts: &AssembleOptions) -> Bundle {
    let facts: BTreeMap<i32, ProcessFacts> =
        parts.processes.iter().map(|f| (f.pid, f.clone())).collect();

    let components = parts
        .topology
        .components
        .iter()
        .map(|c| snap_component(c, &facts, &parts))
        .collect();

    let mut findings = std::mem::take(&mut parts.findings);
    findings.sort_by_key(|f| std::cmp::Reverse(f.severity));

    // The big parts (thousands of requests on a big node) move into the snapshot: the parts
    // are ours, nothing reads them after.
    let mut snapshot = Snapshot {
        schema: SNAPSHOT_SCHEMA.to_string(),
        taken_at: crate::clock::rfc3339(parts.taken_at_ms),
        window_ms: parts.window_ms as f64,
        sources: contract_sources(&parts),
        components,
        requests: std::mem::take(&mut parts.requests),
        logical_requests: std::mem::take(&mut parts.logical_requests),
        gpus: std::mem::take(&mut parts.gpus),
        threads: std::mem::take(&mut parts.threads),
        findings,
        edges: parts.topology.edges.clone(),
        redacted: opts.redact,
        config_changed: std::mem::take(&mut parts.config_changed),
        tool: opts.tool.clone(),
        versions: BTreeMap::new(),
        node: parts.node.take().map(|n| node::for_output(n, opts.redact)),
        connections: std::mem::take(&mut parts.connections),
        channels: std::mem::take(&mut parts.channels),
        fleet: None,
        elided: parts.elided,
        cause: None,
    };
    versions::fill(&mut snapshot, &parts);

    let mut raw = std::mem::take(&mut parts.raw);
    let facts_list: Vec<&ProcessFacts> = facts.values().collect();
    if let Ok(v) = serde_json::to_value(&facts_list) {
        raw.insert("processes".to_string(), v);
    }
    // The topology as discovered (profiles, labels, config edges) beside the contract's view.
    if !raw.contains_key("topology") {
        if let Ok(v) = serde_json::to_value(&parts.topology) {
            raw.insert("topology".to_string(), v);
        }
    }
    let mut redactor = Redactor::new();
    if opts.redact {
        redact_outputs(&mut redactor, &mut snapshot, &mut raw);
    }
    // from the redacted facts: it quotes the changed values
    snapshot.cause = crate::model::cause::of(&snapshot);
    Bundle {
        snapshot,
        raw,
        redactor,
    }
}

/// One component of the contract: its topology entry joined with its processes' facts
/// (arguments and environment where discovery found they survive a title) and the extras
/// the model computed for it.
fn snap_component(
    c: &Component,
    facts: &BTreeMap<i32, ProcessFacts>,
    parts: &SnapshotParts,
) -> SnapComponent {
    let main = c.main_pid.and_then(|p| facts.get(&p));
    let args = c.args_pid().and_then(|p| facts.get(&p));
    let env = c.env_pid().and_then(|p| facts.get(&p));
    let extras = parts.extras.get(&c.id).cloned().unwrap_or_default();
    let processes = c
        .pids
        .iter()
        .filter_map(|p| facts.get(p))
        .map(|f| {
            // the environment is reported once, at component level
            let mut f = f.clone();
            f.env = None;
            serde_json::to_value(f).unwrap_or(serde_json::Value::Null)
        })
        .collect();
    SnapComponent {
        id: c.id.clone(),
        role: c.role,
        stack: c.stack.clone(),
        pids: c.pids.clone(),
        main_pid: c.main_pid,
        listen: c.listen.clone(),
        started_at: rfc(main.and_then(|f| f.started_at_ms)),
        cmdline: args.and_then(|f| f.cmdline.clone()).unwrap_or_default(),
        env: env.and_then(|f| f.env.clone()).unwrap_or_default(),
        gpus: c.gpus.clone(),
        parent: c.parent.clone(),
        title: c.title.clone(),
        exe: main.and_then(|f| f.exe.clone()),
        identity: main.and_then(|f| f.start_ticks.map(|t| format!("{}:{t}", f.pid))),
        processes,
        sockets: extras.sockets,
        metrics: extras.metrics,
        gpu_activity: extras.gpu_activity,
        labels: c.labels.clone(),
        versions: BTreeMap::new(),
        relevant_env: Vec::new(),
        netns: c.netns,
        container: c.container.clone(),
        channels: c.channels.clone(),
    }
}

/// Every source's status by name; a source the parts do not mention was not sampled.
fn contract_sources(parts: &SnapshotParts) -> BTreeMap<String, SourceStatus> {
    SourceKind::ALL
        .into_iter()
        .map(|k| {
            let s = parts
                .sources
                .get(&k)
                .cloned()
                .unwrap_or_else(|| SourceStatus::unavailable("not sampled"));
            (k.as_str().to_string(), s)
        })
        .collect()
}

/// The one redaction pass of a bundle: learn from every part first (a secret named in the
/// raw process facts must also go from a thread name in the snapshot), then redact each.
pub(crate) fn redact_outputs(
    redactor: &mut Redactor,
    snapshot: &mut Snapshot,
    raw: &mut BTreeMap<String, serde_json::Value>,
) {
    // The exchanges and logical requests, most of a big node's snapshot, are redacted
    // typed: no JSON tree of them (`redact::typed`).
    let mut requests = std::mem::take(&mut snapshot.requests);
    let mut logical = std::mem::take(&mut snapshot.logical_requests);
    let mut snap = serde_json::to_value(&*snapshot).unwrap_or(serde_json::Value::Null);
    redactor.learn_json(&snap);
    raw.values().for_each(|v| redactor.learn_json(v));
    redactor.learn_requests(&requests, &logical);
    let known = redactor.secrets().count();
    redactor.redact_json(&mut snap);
    raw.values_mut().for_each(|v| redactor.redact_json(v));
    redactor.redact_requests(&mut requests, &mut logical);
    if redactor.secrets().count() != known {
        // learned while redacting (never expected: everything was learned first): scrub
        // every part again with all of it
        redactor.scrub_json(&mut snap);
        raw.values_mut().for_each(|v| redactor.scrub_json(v));
        redactor.redact_requests(&mut requests, &mut logical);
    }
    match serde_json::from_value::<Snapshot>(snap) {
        Ok(s) => *snapshot = s,
        // Our own types always round-trip; if one ever did not, publish no host facts
        // rather than unredacted ones.
        Err(_) => {
            snapshot.components.clear();
            snapshot.threads.clear();
            snapshot.config_changed.clear();
        }
    }
    snapshot.requests = requests;
    snapshot.logical_requests = logical;
}

/// The largest snapshot file read (`diff`, `--baseline`, `--replay`): a file from a
/// stranger may not take the memory it likes.
pub const MAX_SNAPSHOT_BYTES: u64 = 256 << 20;

/// The longest a snapshot file's open and read may take (a file on a hung network or FUSE
/// mount blocks in the kernel: the verb ends with an error instead).
pub const SNAPSHOT_READ_DEADLINE: std::time::Duration = std::time::Duration::from_secs(60);

/// The text of `path` when it is at most `cap` bytes (None: larger), opened by
/// [`crate::safe_fs::open_input`] and read under [`SNAPSHOT_READ_DEADLINE`].
fn read_capped(path: &Path, cap: u64) -> Result<Option<String>> {
    let p = path.to_path_buf();
    let read = move || crate::safe_fs::read_input_capped(&p, cap);
    let (bytes, more) =
        crate::deadline::call(path, SNAPSHOT_READ_DEADLINE, read).map_err(Error::Other)??;
    if more {
        return Ok(None);
    }
    String::from_utf8(bytes)
        .map(Some)
        .map_err(|_| Error::BadSnapshot {
            path: path.to_path_buf(),
            message: "not UTF-8 text".to_string(),
        })
}

/// Reads and checks a snapshot file (for `diff` and `--baseline`): a clear error naming the
/// file when it is not JSON, truncated, too big once parsed (`bounds`), or not a
/// `wedgewatch.snapshot/1`.
pub fn read_snapshot(path: &Path) -> Result<Snapshot> {
    read_snapshot_within(path, &ParseBudget::new())
}

/// [`read_snapshot`] under a budget shared with other snapshots (the inputs of a merge).
pub fn read_snapshot_within(path: &Path, budget: &ParseBudget) -> Result<Snapshot> {
    let bad = |message: String| Error::BadSnapshot {
        path: path.to_path_buf(),
        message,
    };
    let path_to_read = if crate::safe_fs::is_input_dir(path) {
        path.join("snapshot.json")
    } else {
        path.to_path_buf()
    };
    let text = read_capped(&path_to_read, MAX_SNAPSHOT_BYTES)?
        .ok_or_else(|| bad(format!("larger than {} MiB", MAX_SNAPSHOT_BYTES >> 20)))?;
    parse_snapshot_within(&text, path, budget)
}

/// Parses and checks a snapshot's text (`read_snapshot`, and `fleet snapshot`, which reads
/// each node's from its transport); `origin` names it in errors.
pub fn parse_snapshot(text: &str, origin: &Path) -> Result<Snapshot> {
    parse_snapshot_within(text, origin, &ParseBudget::new())
}

/// [`parse_snapshot`] under a shared budget: the text is counted first and refused past
/// it, then parsed straight into the contract's types (no JSON tree of it).
pub fn parse_snapshot_within(text: &str, origin: &Path, budget: &ParseBudget) -> Result<Snapshot> {
    let bad = |message: String| Error::BadSnapshot {
        path: origin.to_path_buf(),
        message,
    };
    let schema = budget.take(text).map_err(|r| match r {
        Refused::Truncated(e) => bad(format!("truncated JSON ({e})")),
        Refused::Invalid(e) => bad(format!("invalid JSON ({e})")),
        Refused::TooBig(e) => bad(format!(
            "too big to read: {e} (more than any snapshot wedgewatch writes)"
        )),
    })?;
    match schema.as_deref() {
        Some(SNAPSHOT_SCHEMA) => {}
        Some(other) => {
            return Err(bad(format!(
                "schema is {other:?}, expected {SNAPSHOT_SCHEMA:?}"
            )))
        }
        None => {
            return Err(bad(format!(
                "no \"schema\" field (expected {SNAPSHOT_SCHEMA:?})"
            )))
        }
    }
    serde_json::from_str(text).map_err(|e| bad(format!("does not match the contract: {e}")))
}
