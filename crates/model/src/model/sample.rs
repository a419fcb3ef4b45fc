//! What each source produces per tick. Samples are plain data (serde), written as-is into
//! recordings and replayed through the same correlator.

use super::thread_state::ThreadState;
use crate::clock::Millis;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The five sources of the snapshot contract.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SourceKind {
    Processes,
    Sockets,
    Stacks,
    Gpu,
    Metrics,
}

impl SourceKind {
    pub const ALL: [SourceKind; 5] = [
        SourceKind::Processes,
        SourceKind::Sockets,
        SourceKind::Stacks,
        SourceKind::Gpu,
        SourceKind::Metrics,
    ];
    pub fn as_str(self) -> &'static str {
        match self {
            SourceKind::Processes => "processes",
            SourceKind::Sockets => "sockets",
            SourceKind::Stacks => "stacks",
            SourceKind::Gpu => "gpu",
            SourceKind::Metrics => "metrics",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    Ok,
    Degraded,
    Unavailable,
}

/// A source's health: never a silent zero. `reason` says why it is not `ok`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SourceStatus {
    pub status: Status,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

impl SourceStatus {
    pub fn ok() -> Self {
        SourceStatus {
            status: Status::Ok,
            reason: None,
        }
    }
    pub fn degraded(reason: impl Into<String>) -> Self {
        SourceStatus {
            status: Status::Degraded,
            reason: Some(reason.into()),
        }
    }
    pub fn unavailable(reason: impl Into<String>) -> Self {
        SourceStatus {
            status: Status::Unavailable,
            reason: Some(reason.into()),
        }
    }
    /// Combines two statuses: the worse wins, reasons are joined.
    pub fn worst(self, other: SourceStatus) -> SourceStatus {
        if other.status > self.status {
            other
        } else if other.status == self.status && self.status != Status::Ok {
            let reason = match (self.reason, other.reason) {
                (Some(a), Some(b)) if a != b => Some(format!("{a}; {b}")),
                (a, b) => a.or(b),
            };
            SourceStatus {
                status: self.status,
                reason,
            }
        } else {
            self
        }
    }
}

/// One tick of one source.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Sample {
    pub t_ms: Millis,
    pub status: SourceStatus,
    /// How long the source took (wall clock).
    pub took_ms: u64,
    pub payload: Payload,
}

impl Sample {
    pub fn kind(&self) -> SourceKind {
        self.payload.kind()
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "source", content = "data", rename_all = "snake_case")]
pub enum Payload {
    Processes(Vec<ProcessFacts>),
    Sockets(SocketTable),
    Stacks(Vec<StackCapture>),
    Gpu(GpuReading),
    Metrics(Vec<MetricsScrape>),
}

impl Payload {
    pub fn kind(&self) -> SourceKind {
        match self {
            Payload::Processes(_) => SourceKind::Processes,
            Payload::Sockets(_) => SourceKind::Sockets,
            Payload::Stacks(_) => SourceKind::Stacks,
            Payload::Gpu(_) => SourceKind::Gpu,
            Payload::Metrics(_) => SourceKind::Metrics,
        }
    }
}

// ---------------------------------------------------------------------------------------
// processes

/// A field we could not read, and why (permission denied, vanished, truncated, ...).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FieldError {
    pub field: String,
    pub reason: String,
}

/// Facts about one process. Every field is optional; what could not be read is in `errors`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ProcessFacts {
    pub pid: i32,
    pub ppid: Option<i32>,
    /// `/proc/PID/comm` (what setproctitle also rewrites).
    pub comm: Option<String>,
    pub cmdline: Option<Vec<String>>,
    pub env: Option<BTreeMap<String, String>>,
    pub exe: Option<String>,
    /// Start time in clock ticks since boot (`/proc/PID/stat` field 22): with the pid, the
    /// process identity.
    pub start_ticks: Option<u64>,
    /// Start time, wall clock, epoch ms.
    pub started_at_ms: Option<Millis>,
    /// Single-letter state (R, S, D, T, Z, ...).
    pub state: Option<String>,
    pub threads: Option<Vec<ThreadInfo>>,
    pub fd_count: Option<u32>,
    /// utime + stime in ms.
    pub cpu_time_ms: Option<u64>,
    pub rss_bytes: Option<u64>,
    /// NSpid from `/proc/PID/status`: the pid in each nested PID namespace, outermost first.
    pub nspid: Option<Vec<i32>>,
    /// Inode of `/proc/PID/ns/net`, to group processes by network namespace.
    pub netns: Option<u64>,
    pub pidns: Option<u64>,
    pub errors: Vec<FieldError>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ThreadInfo {
    pub tid: i32,
    pub name: String,
}

// ---------------------------------------------------------------------------------------
// sockets

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum TcpState {
    Established,
    SynSent,
    SynRecv,
    FinWait1,
    FinWait2,
    TimeWait,
    Close,
    CloseWait,
    LastAck,
    Listen,
    Closing,
    Unknown,
}

impl TcpState {
    /// From the kernel's numeric state (include/net/tcp_states.h).
    pub fn from_kernel(n: u8) -> TcpState {
        match n {
            1 => TcpState::Established,
            2 => TcpState::SynSent,
            3 => TcpState::SynRecv,
            4 => TcpState::FinWait1,
            5 => TcpState::FinWait2,
            6 => TcpState::TimeWait,
            7 => TcpState::Close,
            8 => TcpState::CloseWait,
            9 => TcpState::LastAck,
            10 => TcpState::Listen,
            11 => TcpState::Closing,
            _ => TcpState::Unknown,
        }
    }
    pub fn as_str(self) -> &'static str {
        match self {
            TcpState::Established => "ESTABLISHED",
            TcpState::SynSent => "SYN_SENT",
            TcpState::SynRecv => "SYN_RECV",
            TcpState::FinWait1 => "FIN_WAIT1",
            TcpState::FinWait2 => "FIN_WAIT2",
            TcpState::TimeWait => "TIME_WAIT",
            TcpState::Close => "CLOSE",
            TcpState::CloseWait => "CLOSE_WAIT",
            TcpState::LastAck => "LAST_ACK",
            TcpState::Listen => "LISTEN",
            TcpState::Closing => "CLOSING",
            TcpState::Unknown => "UNKNOWN",
        }
    }
}

/// The subset of the kernel's `tcp_info` we use. Times are "ms ago" as the kernel reports.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TcpInfo {
    pub bytes_acked: u64,
    pub bytes_received: u64,
    pub bytes_sent: u64,
    pub last_data_sent_ms: u32,
    pub last_data_recv_ms: u32,
    pub last_ack_recv_ms: u32,
    pub rtt_us: u32,
    pub retransmits: u32,
    pub unacked: u32,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SocketEntry {
    /// `ip:port` (IPv6 as `[::1]:port`).
    pub local: String,
    pub remote: String,
    pub state: TcpState,
    pub rx_queue: u32,
    pub tx_queue: u32,
    pub inode: u64,
    pub uid: u32,
    /// Owning pid, from the inode -> pid map (None: not one of ours, or unreadable).
    pub pid: Option<i32>,
    /// Network namespace inode the socket was read in (None: the tool's own).
    pub netns: Option<u64>,
    /// None when read from `/proc/net/tcp` (other netns fallback) or TIME_WAIT.
    pub tcp_info: Option<TcpInfo>,
}

impl SocketEntry {
    pub fn local_port(&self) -> Option<u16> {
        super::addr::port_of(&self.local)
    }
    pub fn remote_port(&self) -> Option<u16> {
        super::addr::port_of(&self.remote)
    }
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SocketTable {
    pub sockets: Vec<SocketEntry>,
    /// Per-namespace notes (fallbacks used, permission problems).
    pub notes: Vec<String>,
}

// ---------------------------------------------------------------------------------------
// stacks

/// How a py-spy capture was taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CaptureMode {
    /// `--nonblocking`: the target is never paused (the default).
    Nonblocking,
    /// Plain `dump`: briefly pauses the target.
    Blocking,
    /// `--native`: pauses the target; only on explicit request.
    Native,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Frame {
    pub name: String,
    pub file: String,
    pub line: u32,
}

impl Frame {
    /// The contract's rendering: `function (file:line)`.
    pub fn render(&self) -> String {
        format!("{} ({}:{})", self.name, self.file, self.line)
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ThreadStack {
    /// OS thread id.
    pub tid: i32,
    pub name: Option<String>,
    pub active: bool,
    pub owns_gil: bool,
    /// Innermost first.
    pub frames: Vec<Frame>,
    /// Classified state from the probe rules (`idle`, `running_batch`, ...).
    pub state: ThreadState,
    /// Which rule classified it.
    pub rule: Option<String>,
    /// The frame that rule matched, rendered `function (file:line)`; absent when none did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decided_by: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StackCapture {
    pub pid: i32,
    pub t_ms: Millis,
    pub mode: CaptureMode,
    /// None when the capture succeeded.
    pub error: Option<String>,
    /// Skipped on purpose (not a Python process): why.
    pub skipped: Option<String>,
    pub warnings: Vec<String>,
    pub threads: Vec<ThreadStack>,
}

// ---------------------------------------------------------------------------------------
// gpu

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GpuProcess {
    /// Host pid as NVML reports it.
    pub pid: u32,
    pub used_mem_bytes: Option<u64>,
    /// SM utilization from the latest per-process sample; Some(0) when NVML had no new
    /// samples (NotFound), None when the query failed.
    pub sm_util_pct: Option<u32>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GpuDevice {
    pub index: u32,
    pub name: Option<String>,
    pub uuid: Option<String>,
    pub util_gpu_pct: Option<u32>,
    pub util_mem_pct: Option<u32>,
    pub power_mw: Option<u32>,
    /// Power limit (or a profile's idle/peak hint) to judge "idle power".
    pub power_limit_mw: Option<u32>,
    pub mem_used_bytes: Option<u64>,
    pub mem_total_bytes: Option<u64>,
    pub processes: Vec<GpuProcess>,
    /// Per-field errors (NotSupported, ...).
    pub errors: Vec<FieldError>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct GpuReading {
    pub driver_version: Option<String>,
    /// The CUDA version the driver supports (`12.4`), from NVML.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cuda_version: Option<String>,
    pub devices: Vec<GpuDevice>,
}

// ---------------------------------------------------------------------------------------
// metrics

/// One parsed Prometheus sample.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Series {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    /// Prometheus values may be NaN or infinite (an empty summary's quantiles); JSON has
    /// no such numbers, so those travel as the strings Prometheus itself writes.
    #[serde(with = "prom_value")]
    pub value: f64,
}

/// A float as a JSON number when finite, else `"NaN"`, `"+Inf"`, `"-Inf"`.
mod prom_value {
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(v: &f64, s: S) -> Result<S::Ok, S::Error> {
        if v.is_finite() {
            s.serialize_f64(*v)
        } else if v.is_nan() {
            s.serialize_str("NaN")
        } else if *v > 0.0 {
            s.serialize_str("+Inf")
        } else {
            s.serialize_str("-Inf")
        }
    }

    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Repr {
        Number(f64),
        Text(String),
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
        match Repr::deserialize(d)? {
            Repr::Number(v) => Ok(v),
            Repr::Text(t) => match t.as_str() {
                "NaN" => Ok(f64::NAN),
                "+Inf" => Ok(f64::INFINITY),
                "-Inf" => Ok(f64::NEG_INFINITY),
                other => Err(serde::de::Error::custom(format!(
                    "not a Prometheus value: {other:?}"
                ))),
            },
        }
    }
}

/// The outcome of one HTTP GET against a component endpoint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FetchOutcome {
    Ok,
    /// Connected (or not) but no complete answer within the timeout.
    Timeout,
    Refused,
    /// Body larger than the cap: truncated and parsed up to the cap.
    TooLarge,
    HttpError,
    Error,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EndpointProbe {
    pub url: String,
    pub outcome: FetchOutcome,
    pub http_status: Option<u16>,
    pub elapsed_ms: u64,
    pub body_bytes: u64,
    pub detail: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MetricsScrape {
    pub component: String,
    pub metrics: Option<EndpointProbe>,
    pub series: Vec<Series>,
    /// Lines the parser skipped.
    pub bad_lines: u32,
    /// Logical values from the profile's metric map (`running`, `queued`, `http_active`,
    /// `forward_seconds_total`, ...), summed over series.
    pub mapped: BTreeMap<String, f64>,
    /// Router `/workers` or engine `/v1/loads`, as JSON.
    pub extra: BTreeMap<String, serde_json::Value>,
    pub extra_probes: Vec<EndpointProbe>,
}
