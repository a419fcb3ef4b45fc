//! What a snapshot is assembled from: the correlator's per-component extras and the
//! findings, before redaction and assembly (`snapshot::assemble`). Model-layer types so the
//! correlator can fill them in without depending on the outputs.

use super::{
    Change, Finding, LogicalRequest, ProcessFacts, Request, SnapGpu, SnapThread, SourceKind,
    SourceStatus, Topology,
};
use crate::clock::Millis;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Per-component extras computed by the correlator.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ComponentExtras {
    /// Socket counts by TCP state name.
    pub sockets: BTreeMap<String, u32>,
    /// Selected metrics and their rates.
    pub metrics: BTreeMap<String, f64>,
    /// GPU activity verdict: `working`, `idle`, `spinning`, `unknown`.
    pub gpu_activity: Option<String>,
}

/// Which raw payloads a snapshot's parts carry: a bundle writes them as its raw files; a
/// snapshot printed as JSON needs no socket table, the costliest of them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RawFiles {
    /// Every raw payload (the bundle's `raw/` files).
    All,
    /// All but the socket table. The others stay: the snapshot reads the GPU's versions, and
    /// the redactor learns secrets from the metrics' labels.
    WithoutSockets,
}

/// Everything a snapshot is made of, before redaction and assembly.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct SnapshotParts {
    pub taken_at_ms: Millis,
    pub window_ms: u64,
    pub sources: BTreeMap<SourceKind, SourceStatus>,
    pub topology: Topology,
    /// Latest facts of every process of the topology.
    pub processes: Vec<ProcessFacts>,
    pub requests: Vec<Request>,
    /// Logical requests with their verdicts (`correlate::requests`).
    #[serde(default)]
    pub logical_requests: Vec<LogicalRequest>,
    pub gpus: Vec<SnapGpu>,
    pub threads: Vec<SnapThread>,
    pub findings: Vec<Finding>,
    /// Keyed by component id.
    pub extras: BTreeMap<String, ComponentExtras>,
    pub config_changed: Vec<Change>,
    /// The node it is taken on (set by whoever samples or replays; None in tests).
    #[serde(default)]
    pub node: Option<super::NodeIdentity>,
    /// Client sockets to servers not on this node (`correlate::parts`).
    #[serde(default)]
    pub connections: Vec<super::SnapConnection>,
    /// Traffic on the components' channels (`correlate::channels`).
    #[serde(default)]
    pub channels: Vec<super::ChannelFlow>,
    /// Finished requests left out on a busy node (`correlate::parts`).
    #[serde(default)]
    pub elided: Option<super::snapshot::Elided>,
    /// Raw per-source payloads (JSON) for the bundle's raw files, keyed by file stem.
    pub raw: BTreeMap<String, serde_json::Value>,
}
