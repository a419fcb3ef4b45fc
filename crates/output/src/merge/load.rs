//! Merge's inputs: snapshots from files (`snapshot --json` output) or bundles (directories
//! written by `snapshot -o`), or read from a node's transport (`fleet snapshot`).

use crate::clock::Millis;
use crate::model::Snapshot;
use crate::snapshot::{self, ParseBudget};
use std::path::Path;

/// One node's snapshot and where it came from.
#[derive(Debug, Clone)]
pub struct NodeInput {
    /// Where it came from, for messages (`a.json`, `bundle-b/`, `node b via ssh`).
    pub source: String,
    pub snapshot: Snapshot,
    /// The node's name when the caller knows it better than the snapshot (`fleet
    /// snapshot --nodes`); else the snapshot's `node.name`, else the file's name.
    pub name: Option<String>,
    /// When the collector started and finished reading it, on the collector's clock.
    pub collected: Option<Collected>,
}

/// The collector's clock around one node's snapshot (`fleet snapshot`): the node's own
/// clock reading is between the two.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Collected {
    pub started_ms: Millis,
    pub ended_ms: Millis,
}

/// Why a merge input is refused.
#[derive(Debug, thiserror::Error)]
pub enum MergeError {
    #[error("nothing to merge: give at least one snapshot")]
    NoInput,
    #[error("{input}: {message}")]
    Load { input: String, message: String },
    #[error("{a} and {b} are two snapshots of the same node {name:?} (same machine-id, boot-id and addresses): merge one snapshot per node")]
    SameNode { a: String, b: String, name: String },
    #[error("{a} and {b} are one snapshot twice (same time taken, components and processes): merge one snapshot per node")]
    SameSnapshot { a: String, b: String },
    #[error("{input}: a merged snapshot (of {nodes} nodes) cannot be merged again; merge the nodes' own snapshots")]
    AlreadyMerged { input: String, nodes: usize },
}

/// Reads one snapshot file or bundle directory, under the budget of all the merge's
/// inputs (`snapshot::bounds`).
pub fn load(path: &Path, budget: &ParseBudget) -> Result<NodeInput, MergeError> {
    let source = path.display().to_string();
    let snap = snapshot::read_snapshot_within(path, budget).map_err(|e| MergeError::Load {
        input: source.clone(),
        message: strip_path(&e.to_string(), &source),
    })?;
    Ok(NodeInput {
        source,
        snapshot: snap,
        name: None,
        collected: None,
    })
}

/// The library's error names the path already; said once is enough.
fn strip_path(msg: &str, path: &str) -> String {
    msg.strip_prefix(path)
        .and_then(|m| m.strip_prefix(':'))
        .map(|m| m.trim_start().to_string())
        .filter(|m| !m.is_empty())
        .unwrap_or_else(|| msg.to_string())
}

/// A name for a node from its source when its snapshot names none:
/// the file's or directory's name without extension, reduced to name characters.
pub fn name_from_source(source: &str) -> String {
    let p = Path::new(source);
    let stem = p
        .file_stem()
        .map(|s| s.to_string_lossy().to_string())
        .unwrap_or_default();
    let stem = if stem == "snapshot" {
        p.parent()
            .and_then(|d| d.file_name())
            .map(|s| s.to_string_lossy().to_string())
            .unwrap_or(stem)
    } else {
        stem
    };
    let name: String = stem
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_') {
                c
            } else {
                '_'
            }
        })
        .take(63)
        .collect();
    if name.is_empty() {
        "node".to_string()
    } else {
        name
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_come_from_files_and_bundles() {
        assert_eq!(name_from_source("/tmp/node-a.json"), "node-a");
        assert_eq!(name_from_source("bundles/b/snapshot.json"), "b");
        assert_eq!(name_from_source("bundle-c"), "bundle-c");
        assert_eq!(name_from_source("we ird$.json"), "we_ird_");
    }
}
