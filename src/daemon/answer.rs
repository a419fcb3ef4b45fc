//! The `snapshot` answer, both ends: the daemon builds the parts under the model's lock and
//! serializes them to bytes once, after the lock is released (no JSON tree of the parts in
//! between); a client reads the parts straight from those bytes (no tree of the whole
//! answer, no copy of it).

use super::{lock, Shared, DAEMON_SCHEMA};
use crate::clock::Millis;
use crate::error::{Error, Result};
use crate::model::{SnapshotParts, SourceKind};
use crate::sampler::SourceStats;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Mutex;

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

/// The parts at `now` (of the last `window_ms`, default the model's window), built under the
/// model's lock, which is released before the caller serializes them.
pub fn parts_now(
    shared: &Mutex<Shared>,
    window_ms: Option<i64>,
    now: Millis,
) -> (SnapshotParts, DaemonFacts) {
    let sh = lock(shared);
    let parts = crate::pipeline::parts(&super::windowed(&sh.model, window_ms), now);
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
    let (parts, daemon) = parts_now(shared, window_ms, now);
    let answer = SnapshotAnswer {
        schema: DAEMON_SCHEMA,
        parts: &parts,
        sampler,
        daemon,
    };
    serde_json::to_vec(&answer).unwrap_or_else(|e| {
        serde_json::json!({ "error": e.to_string() })
            .to_string()
            .into_bytes()
    })
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
