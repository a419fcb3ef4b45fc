//! The `snapshot` and `json` answers, both ends. `snapshot`: the daemon builds the parts under the model's lock and
//! serializes them to bytes once, after the lock is released (no JSON tree of the parts in
//! between); a client reads the parts straight from those bytes (no tree of the whole
//! answer, no copy of it). `json`: the daemon assembles and redacts the snapshot itself and
//! the client prints its bytes.

use super::{lock, Shared, DAEMON_SCHEMA};
use crate::clock::{thread_cpu_ms, Millis};
use crate::error::{Error, Result};
use crate::model::{Finding, RawFiles, Snapshot, SnapshotParts, SourceKind, SNAPSHOT_SCHEMA};
use crate::sampler::SourceStats;
use crate::snapshot::AssembleOptions;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Mutex;
use std::time::Instant;

/// Facts about the daemon that answered.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct DaemonFacts {
    pub pid: u32,
    pub started_ms: Millis,
    pub baselines: usize,
}

/// `{schema, parts, sampler, daemon}`: the answer to `snapshot [SECONDS]`.
#[derive(Debug, Serialize)]
pub struct SnapshotAnswer<'a> {
    pub schema: &'static str,
    pub parts: &'a SnapshotParts,
    pub sampler: &'a BTreeMap<SourceKind, SourceStats>,
    pub daemon: DaemonFacts,
}

/// The parts at `now` (of the last `window_ms`, default the model's window) with the raw
/// payloads `raw` says, built under the model's lock, which is released before the caller
/// serializes them.
pub fn parts_now(
    shared: &Mutex<Shared>,
    window_ms: Option<i64>,
    now: Millis,
    raw: RawFiles,
) -> (SnapshotParts, DaemonFacts) {
    let asked = Instant::now();
    let sh = lock(shared);
    let (locked, cpu) = (Instant::now(), thread_cpu_ms());
    let parts = crate::pipeline::parts_for(&super::windowed(&sh.model, window_ms), now, raw);
    tracing::debug!(
        lock_wait_ms = ms(locked - asked),
        parts_ms = ms(locked.elapsed()),
        parts_cpu_ms = thread_cpu_ms() - cpu,
        requests = parts.requests.len(),
        "snapshot parts built"
    );
    let facts = DaemonFacts {
        pid: std::process::id(),
        started_ms: sh.started_ms,
        baselines: sh.baselines.len(),
    };
    (parts, facts)
}

/// The answer's bytes (one JSON line without its newline): the parts serialized once, outside
/// the model's lock.
pub fn snapshot_bytes(
    shared: &Mutex<Shared>,
    sampler: &BTreeMap<SourceKind, SourceStats>,
    window_ms: Option<i64>,
    now: Millis,
) -> Vec<u8> {
    // The client may write a bundle from them: every raw file.
    let (parts, daemon) = parts_now(shared, window_ms, now, RawFiles::All);
    let answer = SnapshotAnswer {
        schema: DAEMON_SCHEMA,
        parts: &parts,
        sampler,
        daemon,
    };
    let cpu = thread_cpu_ms();
    let bytes = or_error(serde_json::to_vec(&answer));
    let serialize_cpu_ms = thread_cpu_ms() - cpu;
    tracing::debug!(
        serialize_cpu_ms,
        bytes = bytes.len(),
        "snapshot parts serialized"
    );
    bytes
}

/// The snapshot at `now` (`json [SECONDS]`): the parts built under the model's lock, then,
/// outside it, assembled and redacted once, here, as `wedgewatch snapshot --json` would
/// (this node's identity included: the daemon runs on the node it watches).
pub fn snapshot_now(shared: &Mutex<Shared>, window_ms: Option<i64>, now: Millis) -> Snapshot {
    let (mut parts, _) = parts_now(shared, window_ms, now, RawFiles::WithoutSockets);
    parts.node = Some(crate::sys::node::this_node());
    let (t, cpu) = (Instant::now(), thread_cpu_ms());
    let s = crate::snapshot::assemble(parts, &AssembleOptions::default());
    tracing::debug!(
        assemble_ms = ms(t.elapsed()),
        assemble_cpu_ms = thread_cpu_ms() - cpu,
        "snapshot assembled"
    );
    s
}

/// The answer to `json`: the snapshot pretty-printed, as the CLI prints it (one answer, not
/// one line: the client reads to the end).
pub fn snapshot_json_bytes(shared: &Mutex<Shared>, window_ms: Option<i64>, now: Millis) -> Vec<u8> {
    let snapshot = snapshot_now(shared, window_ms, now);
    let cpu = thread_cpu_ms();
    let bytes = or_error(serde_json::to_vec_pretty(&snapshot));
    let serialize_cpu_ms = thread_cpu_ms() - cpu;
    tracing::debug!(serialize_cpu_ms, bytes = bytes.len(), "snapshot serialized");
    bytes
}

/// A snapshot served by the daemon: its bytes as they are printed, and its findings (for
/// `--fail-on`).
#[derive(Debug)]
pub struct ServedSnapshot {
    pub bytes: Vec<u8>,
    pub findings: Vec<Finding>,
}

/// What a client checks of a `json` answer: a whole `wedgewatch.snapshot/1` document (a
/// truncated or foreign answer is never printed), or the daemon's error.
#[derive(Debug, Deserialize)]
struct Checked {
    #[serde(default)]
    schema: Option<String>,
    #[serde(default)]
    error: Option<String>,
    #[serde(default)]
    findings: Vec<Finding>,
}

/// The snapshot in the bytes the daemon at `socket` answered to `json`. The whole answer is
/// parsed (skipping all but the findings), so only a complete document is printed.
pub fn check_snapshot_bytes(mut bytes: Vec<u8>, socket: &Path) -> Result<ServedSnapshot> {
    let c: Checked = serde_json::from_slice(&bytes)?;
    let at = socket.display();
    match (c.schema.as_deref(), c.error) {
        (_, Some(e)) => Err(Error::Other(format!("daemon at {at}: {e}"))),
        (Some(SNAPSHOT_SCHEMA), None) => {
            if bytes.last() == Some(&b'\n') {
                bytes.pop();
            }
            Ok(ServedSnapshot {
                bytes,
                findings: c.findings,
            })
        }
        (other, None) => Err(Error::Other(format!(
            "daemon at {at}: answered schema {other:?}, not {SNAPSHOT_SCHEMA:?}"
        ))),
    }
}

/// Serialized bytes, or the daemon's error answer saying why not.
fn or_error(bytes: serde_json::Result<Vec<u8>>) -> Vec<u8> {
    bytes.unwrap_or_else(|e| super::error_bytes(&e.to_string()))
}

fn ms(d: std::time::Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// What a client reads of a `snapshot` answer: the parts, or the daemon's error. The other
/// fields are skipped by the parser, not built.
#[derive(Debug, Deserialize)]
struct PartsOnly {
    #[serde(default)]
    parts: Option<SnapshotParts>,
    #[serde(default)]
    error: Option<String>,
}

/// The snapshot parts of the bytes the daemon at `socket` answered to `snapshot`.
pub fn parts_from_bytes(bytes: &[u8], socket: &Path) -> Result<SnapshotParts> {
    let a: PartsOnly = serde_json::from_slice(bytes)?;
    match (a.parts, a.error) {
        (_, Some(e)) => Err(Error::Other(format!("daemon at {}: {e}", socket.display()))),
        (Some(p), None) => Ok(p),
        (None, None) => Err(Error::Other("daemon answer has no parts".into())),
    }
}
