//! The snapshot/diff contract (`wedgewatch.snapshot/1`, `wedgewatch.diff/1`). Fields may be
//! added; none of the contract's may change meaning without a new schema version.

use super::finding_kind::FindingKind;
use super::sample::SourceStatus;
use super::thread_state::ThreadState;
use super::topology::{Edge, Role};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

pub const SNAPSHOT_SCHEMA: &str = "wedgewatch.snapshot/1";
pub const DIFF_SCHEMA: &str = "wedgewatch.diff/1";
pub const REDACTED: &str = "<redacted>";

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Snapshot {
    pub schema: String,
    pub taken_at: String,
    pub window_ms: f64,
    pub sources: BTreeMap<String, SourceStatus>,
    pub components: Vec<SnapComponent>,
    pub requests: Vec<Request>,
    pub gpus: Vec<SnapGpu>,
    pub threads: Vec<SnapThread>,
    pub findings: Vec<Finding>,
    /// Added fields (allowed by the contract).
    #[serde(default)]
    pub edges: Vec<Edge>,
    /// Whether secrets were redacted (false only with `--no-redact`).
    #[serde(default = "yes")]
    pub redacted: bool,
    #[serde(default)]
    pub config_changed: Vec<Change>,
    #[serde(default)]
    pub tool: BTreeMap<String, String>,
    /// Host-wide versions for a bug report: `wedgewatch`, `kernel`, `nvidia_driver`, `cuda`
    /// (absent when not known, e.g. no NVML).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub versions: BTreeMap<String, String>,
    /// Requests as their clients sent them, each across its hops, with the correlator's
    /// verdict.
    #[serde(default)]
    pub logical_requests: Vec<LogicalRequest>,
    /// Added: the node it was taken on and its clocks (absent from merged snapshots, whose
    /// nodes are in `fleet`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<super::node::NodeIdentity>,
    /// Added: client sockets of components to servers not on this node (what `merge`
    /// joins across nodes).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub connections: Vec<super::node::SnapConnection>,
    /// Added: traffic on the components' channels: connections that are not requests.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub channels: Vec<super::ChannelFlow>,
    /// Added: present in merged snapshots only: the nodes, their clock skew, the hops
    /// joined across them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fleet: Option<super::fleet::FleetInfo>,
    /// Added: finished requests left out of `requests`/`logical_requests` on a busy node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub elided: Option<Elided>,
    /// Added: the changes, restarts and first stuck requests on one time line, and the
    /// suspect (`model::cause`); absent when there is neither a change nor a stuck request.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cause: Option<super::cause::Cause>,
}

/// What a snapshot left out to stay small on a busy node: finished logical requests beyond
/// the newest [`Elided::kept_done`], with their legs (exchanges).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Elided {
    /// Finished (`done`) logical requests not listed.
    pub done_requests: u64,
    /// Their exchanges (legs), not listed in `requests`.
    pub exchanges: u64,
    /// Finished logical requests that are listed (the newest).
    pub kept_done: u64,
}

fn yes() -> bool {
    true
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SnapComponent {
    pub id: String,
    pub role: Role,
    pub stack: String,
    pub pids: Vec<i32>,
    pub main_pid: Option<i32>,
    pub listen: Vec<String>,
    pub started_at: Option<String>,
    pub cmdline: Vec<String>,
    pub env: BTreeMap<String, String>,
    pub gpus: Vec<u32>,
    #[serde(default)]
    pub parent: Option<String>,
    #[serde(default)]
    pub title: Option<String>,
    #[serde(default)]
    pub exe: Option<String>,
    /// Process identity `pid:start_ticks` of the main process, to spot restarts.
    #[serde(default)]
    pub identity: Option<String>,
    /// Per-process facts (state, threads, fds, cpu, rss, nspid, field errors).
    #[serde(default)]
    pub processes: Vec<serde_json::Value>,
    /// Socket counts by state.
    #[serde(default)]
    pub sockets: BTreeMap<String, u32>,
    /// Selected metrics (logical name -> value) and rates (`<name>_rate`).
    #[serde(default)]
    pub metrics: BTreeMap<String, f64>,
    /// GPU activity verdict (`working`, `idle`, `spinning`, `unknown`).
    #[serde(default)]
    pub gpu_activity: Option<String>,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// Installed versions read from package metadata on disk (`sglang`, `torch`, `python`,
    /// ...); see `sources::versions`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub versions: BTreeMap<String, String>,
    /// Names of the variables of `env` its stack profile marks relevant (`relevant_env`):
    /// what a report shows of the environment besides the changes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub relevant_env: Vec<String>,
    /// Added: inode of its network namespace when not wedgewatch's own (a container).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub netns: Option<u64>,
    /// Added: the container it runs in, named from its cgroup (`docker 3726184226f5`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container: Option<String>,
    /// Added: listen addresses that carry no requests, and what for (`model::channel`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub channels: Vec<super::Channel>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RequestState {
    WaitingFirstByte,
    Streaming,
    Stalled,
    Done,
    Idle,
    Closed,
}

impl RequestState {
    pub fn as_str(self) -> &'static str {
        match self {
            RequestState::WaitingFirstByte => "waiting_first_byte",
            RequestState::Streaming => "streaming",
            RequestState::Stalled => "stalled",
            RequestState::Done => "done",
            RequestState::Idle => "idle",
            RequestState::Closed => "closed",
        }
    }

    /// Still held open: waiting for its first byte, streaming, or stalled.
    pub fn is_open(self) -> bool {
        matches!(
            self,
            RequestState::WaitingFirstByte | RequestState::Streaming | RequestState::Stalled
        )
    }
}

/// One HTTP exchange on one TCP connection, as seen at the server side of a hop.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Request {
    pub id: String,
    /// Component serving it (the server side of the connection).
    pub component: String,
    pub client: String,
    pub server: String,
    pub state: RequestState,
    pub age_ms: f64,
    pub bytes_in: u64,
    pub bytes_out: u64,
    pub idle_out_ms: f64,
    pub links: Vec<String>,
    #[serde(default)]
    pub role: Option<Role>,
    /// Component on the client side, when known.
    #[serde(default)]
    pub client_component: Option<String>,
    /// Confidence of the links (0..1).
    #[serde(default)]
    pub link_confidence: Option<f64>,
    #[serde(default)]
    pub started_at: Option<String>,
    /// The logical request this exchange is a leg of (`r17`); None for idle connections.
    #[serde(default)]
    pub request: Option<String>,
    /// This exchange as a leg of its logical request (`r17@decode`).
    #[serde(default)]
    pub leg: Option<String>,
}

/// The correlator's verdict on a logical request, with the configured thresholds. The
/// detectors, the report and the TUI read it; none of them judges a request again.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// Accepted and forgotten, stalled mid-stream, or stuck in a KV transfer ([`StuckKind`]).
    Stuck,
    /// Waiting for its first response byte, not (yet) stuck; `waiting_reason` says which rule
    /// kept it out.
    Waiting,
    /// Being answered (streaming), or open while its hop is working.
    Active,
    /// Answered, or its connection closed.
    Done,
}

impl Verdict {
    /// The verdict of a request none of whose legs is stuck, from its legs' states.
    pub fn of_unstuck(states: impl IntoIterator<Item = RequestState>) -> Verdict {
        let mut open = states.into_iter().filter(|s| s.is_open()).peekable();
        if open.peek().is_none() {
            Verdict::Done
        } else if open.all(|s| s == RequestState::WaitingFirstByte) {
            Verdict::Waiting
        } else {
            Verdict::Active
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Stuck => "stuck",
            Verdict::Waiting => "waiting",
            Verdict::Active => "active",
            Verdict::Done => "done",
        }
    }
}

/// Why a request waiting for its first byte is not judged stuck: the correlator's rule that
/// kept it out, so no output gives a reason the evidence contradicts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WaitReason {
    /// Younger than `wedged_after_ms` at its deepest waiting hop.
    Young,
    /// The socket table is stale: how long it waits is not known.
    SocketsStale,
    /// It waits at a proxy or router with other requests open downstream (its own link may
    /// have been missed).
    DownstreamOpen,
    /// At an engine that shows work (its counters moved since it arrived) and that answered
    /// no later request before it: queued, not forgotten.
    BusyEngine,
    /// At an engine whose GPU spins (`busy_without_progress` reports it).
    GpuSpinning,
    /// At an engine that counts no open inference request, from a client outside the
    /// stack: not an inference request.
    NotInference,
}

impl WaitReason {
    /// The reason in words, for the report and the TUI.
    pub fn text(self) -> &'static str {
        match self {
            WaitReason::Young => "young: not yet waiting for the wedge threshold",
            WaitReason::SocketsStale => "the socket table is stale: its wait is not known",
            WaitReason::DownstreamOpen => {
                "its hop still has other requests open downstream, so it is not blamed there"
            }
            WaitReason::BusyEngine => {
                "queued at a busy engine: it works, and answered no later request first"
            }
            WaitReason::GpuSpinning => "its engine's GPU spins (busy_without_progress)",
            WaitReason::NotInference => {
                "from outside the stack at an engine with no open inference request"
            }
        }
    }
}

/// How a stuck request is stuck.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StuckKind {
    /// No response byte (`wedged_request`).
    NoResponse,
    /// The response started, then stopped (`stalled_stream`).
    StreamStalled,
    /// PD decode waits for its KV cache, the transfer from prefill silent
    /// (`kv_transfer_stalled`).
    KvTransfer,
}

impl StuckKind {
    /// Which of a request's stuck legs is blamed: the smallest key. No response before a
    /// stalled stream, then the deepest hop (the hops above only wait for it).
    pub fn blame_key(self, role: super::Role) -> (StuckKind, std::cmp::Reverse<u8>) {
        (self, std::cmp::Reverse(role.depth()))
    }
}

/// One request as its client sent it, spanning its hops (proxy -> router -> prefill +
/// decode); each hop's exchange is a leg.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LogicalRequest {
    /// Stable while the request is in history: `r` and the number of its first leg.
    pub id: String,
    /// Exchange ids of its legs (`requests[].id`), the entry hop first.
    pub legs: Vec<String>,
    pub verdict: Verdict,
    /// Component where it entered the stack (its first leg's).
    pub component: String,
    /// Age of its first leg, in ms.
    pub age_ms: f64,
    /// Health checks, scrapes and load probes (requests too small to be inference requests):
    /// never stuck.
    #[serde(default)]
    pub probe: bool,
    /// When stuck: the leg it is stuck at (`r17@decode`), its component and role.
    #[serde(default)]
    pub stuck_leg: Option<String>,
    #[serde(default)]
    pub stuck_at: Option<String>,
    #[serde(default)]
    pub stuck_role: Option<Role>,
    #[serde(default)]
    pub stuck_kind: Option<StuckKind>,
    /// Added: when waiting, why it is not judged stuck, and the leg it waits at.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waiting_reason: Option<WaitReason>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waiting_leg: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SnapGpuProcess {
    pub pid: i64,
    pub used_mem_bytes: Option<u64>,
    #[serde(default)]
    pub sm_util_pct: Option<u32>,
    #[serde(default)]
    pub component: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SnapGpu {
    pub index: u32,
    pub name: String,
    pub util_pct: Option<f64>,
    pub power_w: Option<f64>,
    pub processes: Vec<SnapGpuProcess>,
    #[serde(default)]
    pub uuid: Option<String>,
    #[serde(default)]
    pub mem_used_bytes: Option<u64>,
    #[serde(default)]
    pub activity: Option<String>,
    /// The enforced power limit: the top of the power sparkline.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub power_limit_w: Option<f64>,
    /// Total memory: the top of the memory sparkline.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mem_total_bytes: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SnapThread {
    pub pid: i32,
    pub tid: i32,
    pub name: Option<String>,
    pub state: ThreadState,
    pub frames: Vec<String>,
    #[serde(default)]
    pub component: Option<String>,
    /// The classified state in each dump of the window, oldest first.
    #[serde(default)]
    pub states_over_window: Vec<ThreadState>,
    /// The stack rule that decided `state` in the newest dump (`collective.all_reduce`
    /// names the collective); absent when no rule matched.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rule: Option<String>,
    /// The frame that rule matched (`all_reduce (torch/distributed/distributed_c10d.py:3075)`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decided_by: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Severity {
    Info,
    Warning,
    Critical,
}

impl Severity {
    pub fn as_str(self) -> &'static str {
        match self {
            Severity::Info => "info",
            Severity::Warning => "warning",
            Severity::Critical => "critical",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Evidence {
    pub source: String,
    pub detail: String,
}

impl Evidence {
    pub fn new(source: impl Into<String>, detail: impl Into<String>) -> Self {
        Evidence {
            source: source.into(),
            detail: detail.into(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Finding {
    /// Serialized as the contract's snake_case string (`"wedged_request"`, ...).
    pub kind: FindingKind,
    pub severity: Severity,
    pub component: Option<String>,
    pub role: Option<Role>,
    pub summary: String,
    pub requests: Vec<String>,
    pub evidence: Vec<Evidence>,
    /// Why this matters and what to do next.
    #[serde(default)]
    pub explanation: Option<String>,
}

/// One difference between two snapshots (the diff contract).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Change {
    pub component: String,
    pub role: Role,
    /// `env`, `cmdline`, `version`, `config`, `topology`, `process`.
    pub field: String,
    pub key: Option<String>,
    pub before: Option<String>,
    pub after: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DiffReport {
    pub schema: String,
    pub changes: Vec<Change>,
    #[serde(default)]
    pub before_taken_at: Option<String>,
    #[serde(default)]
    pub after_taken_at: Option<String>,
}
