//! Recordings: append-only segment files of samples, topology changes and baselines, which
//! replay through the same correlator and detectors.
//!
//! Format: one record per line, `<crc32 of the JSON, 8 hex digits> <JSON>\n`, gzip-framed
//! by default (see [`gz`]: sync-flushed after every record, a new member every MiB). A
//! crash mid-write leaves a line without its newline or with a wrong checksum; readers skip
//! such lines (counting them) and go on, so everything up to the last whole record replays.
//! A recording is either one file (`record -o FILE`) or a directory of segments
//! `seg-00000001.wwrec`, ... rotated by size, keeping the newest N. Each new segment starts
//! with a header and the current topology and baseline, so it replays on its own.

use crate::clock::{Clock, Millis};
use crate::error::{Error, Result};
use crate::model::{Change, ProcessFacts, Role, Sample, Topology};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::path::{Path, PathBuf};

mod delta;
mod gz;
mod inflate;
mod read;
mod recording;
mod replay;

pub use delta::{apply_json, diff_json, DeltaState, KEYFRAME_EVERY};
pub use read::{
    read_records, NotARecording, ReadError, ReadLimits, ReadStats, Records, DEFAULT_MAX_LINE_BYTES,
    DEFAULT_MAX_LINE_VALUES,
};
pub use recording::{first_record_ms, RecordIter, Recording};
pub use replay::{replay, Replayed, Replayer};

pub const RECORDING_VERSION: u32 = 1;
const SEGMENT_PREFIX: &str = "seg-";
const SEGMENT_SUFFIX: &str = ".wwrec";

/// One line of a recording.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Record {
    /// First record of every segment.
    Header {
        version: u32,
        t_ms: Millis,
        /// The recorder's pid: its own metrics scrapes are not requests.
        pid: i32,
        tool: String,
    },
    Sample {
        sample: Sample,
    },
    Topology {
        t_ms: Millis,
        topology: Topology,
    },
    Baseline {
        baseline: Baseline,
    },
    /// A sample, compactly: whole (`key`) or as a patch against the previous sample of the
    /// same kind in the same segment. `crc` is of the whole reconstructed sample data.
    Delta {
        t_ms: Millis,
        kind: crate::model::SourceKind,
        status: crate::model::SourceStatus,
        took_ms: u64,
        key: bool,
        crc: u32,
        data: serde_json::Value,
    },
}

impl Record {
    pub fn t_ms(&self) -> Millis {
        match self {
            Record::Header { t_ms, .. } | Record::Topology { t_ms, .. } => *t_ms,
            Record::Sample { sample } => sample.t_ms,
            Record::Delta { t_ms, .. } => *t_ms,
            Record::Baseline { baseline } => baseline.t_ms,
        }
    }
}

/// The facts of one component at baseline time.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BaselineComponent {
    pub id: String,
    pub role: Role,
    pub stack: String,
    pub main_pid: Option<i32>,
    /// `pid:start_ticks` of the main process.
    pub identity: Option<String>,
    pub started_at_ms: Option<Millis>,
    pub exe: Option<String>,
    pub cmdline: Vec<String>,
    /// Secret values are keyed masks `<redacted:KEYID:MAC>` (comparable within one run).
    pub env: BTreeMap<String, String>,
    pub listen: Vec<String>,
}

/// A snapshot-like record of every component's facts, taken on start and whenever a
/// component appears or restarts, so "what changed since noon" needs no saved snapshot.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Baseline {
    pub t_ms: Millis,
    /// Why it was taken (`start`, `new component decode@...`, `restart of ...`).
    pub reason: String,
    pub components: Vec<BaselineComponent>,
}

/// Env names whose values are never stored in clear.
pub fn is_secret_name(name: &str) -> bool {
    crate::redact::is_secret_name(name)
}

/// What leaves the daemon in a `Change`: masks become plain `<redacted>`.
fn unmask(v: Option<String>) -> Option<String> {
    v.map(|s| crate::redact::mask::unmask(&s))
}

/// Whether two stored values differ (masks under different keys cannot be compared and
/// do not count as a change).
fn differs(a: Option<&String>, b: Option<&String>) -> bool {
    match (a, b) {
        (Some(a), Some(b)) => !crate::redact::mask::same(a, b),
        (a, b) => a != b,
    }
}

impl Baseline {
    /// Takes the facts of every component's main process from the latest process facts.
    /// Components whose main process has no facts yet are left out (taken next time).
    pub fn take(
        t_ms: Millis,
        topo: &Topology,
        procs: &[ProcessFacts],
        reason: impl Into<String>,
    ) -> Baseline {
        let mut components = Vec::new();
        for c in &topo.components {
            let Some(p) = c.main_pid.and_then(|m| procs.iter().find(|p| p.pid == m)) else {
                continue;
            };
            // setproctitle wipes a titled process's args and env: read them where discovery
            // found they survive (a launcher or the engine parent).
            let by_pid = |pid: i32| procs.iter().find(|f| f.pid == pid).unwrap_or(p);
            let env_facts = by_pid(crate::discover::env_pid(c).unwrap_or(p.pid));
            let args_facts = by_pid(crate::discover::args_pid(c).unwrap_or(p.pid));
            // A process whose environment could not be read (vanished mid-sample, permission)
            // is baselined next time: an empty env would read as "every variable removed".
            if env_facts.env.is_none() {
                continue;
            }
            // Secrets are stored as keyed masks (see `redact::mask`): comparable within one
            // daemon run, meaningless without the key, which is never written.
            let mut masker = crate::redact::Redactor::masking(crate::redact::MaskKey::process());
            let mut env = env_facts.env.clone().unwrap_or_default();
            masker.env(&mut env);
            components.push(BaselineComponent {
                id: c.id.clone(),
                role: c.role,
                stack: c.stack.clone(),
                main_pid: c.main_pid,
                identity: Some(match p.start_ticks {
                    Some(st) => format!("{}:{st}", p.pid),
                    None => p.pid.to_string(),
                }),
                started_at_ms: p.started_at_ms,
                exe: p.exe.clone(),
                // Recordings travel: secrets in arguments are never stored in clear.
                cmdline: masker.args(&args_facts.cmdline.clone().unwrap_or_default()),
                env,
                listen: c.listen.clone(),
            });
        }
        Baseline {
            t_ms,
            reason: reason.into(),
            components,
        }
    }

    pub fn component(&self, id: &str) -> Option<&BaselineComponent> {
        self.components.iter().find(|c| c.id == id)
    }

    /// What changed from `self` (older) to `newer`: env, cmdline, exe, process identity,
    /// and components that appeared or vanished (field `topology`). The foundation's
    /// `diff::diff_snapshots` is the full version; this one needs only baselines.
    pub fn changes_to(&self, newer: &Baseline) -> Vec<Change> {
        let mut out = Vec::new();
        for n in &newer.components {
            let Some(o) = self.component(&n.id) else {
                out.push(Change {
                    component: n.id.clone(),
                    role: n.role,
                    field: "topology".into(),
                    key: None,
                    before: None,
                    after: Some("present".into()),
                });
                continue;
            };
            let ch =
                |field: &str, key: Option<String>, b: Option<String>, a: Option<String>| Change {
                    component: n.id.clone(),
                    role: n.role,
                    field: field.into(),
                    key,
                    before: unmask(b),
                    after: unmask(a),
                };
            let keys: std::collections::BTreeSet<&String> =
                o.env.keys().chain(n.env.keys()).collect();
            for k in keys {
                let (b, a) = (o.env.get(k), n.env.get(k));
                if differs(b, a) {
                    out.push(ch("env", Some(k.clone()), b.cloned(), a.cloned()));
                }
            }
            let (oc, nc) = (o.cmdline.join(" "), n.cmdline.join(" "));
            if differs(Some(&oc), Some(&nc)) {
                out.push(ch(
                    "cmdline",
                    None,
                    Some(o.cmdline.join(" ")),
                    Some(n.cmdline.join(" ")),
                ));
            }
            if o.exe != n.exe {
                out.push(ch(
                    "version",
                    Some("exe".into()),
                    o.exe.clone(),
                    n.exe.clone(),
                ));
            }
            if o.identity != n.identity {
                out.push(ch(
                    "process",
                    Some("identity".into()),
                    o.identity.clone(),
                    n.identity.clone(),
                ));
            }
        }
        for o in &self.components {
            if newer.component(&o.id).is_none() {
                out.push(Change {
                    component: o.id.clone(),
                    role: o.role,
                    field: "topology".into(),
                    key: None,
                    before: Some("present".into()),
                    after: None,
                });
            }
        }
        out
    }

    /// Merges `newer` over `self`: components seen in either, newest facts win. Used to
    /// keep "the latest known facts of every component".
    pub fn merged(&self, newer: &Baseline) -> Baseline {
        let mut comps: BTreeMap<String, BaselineComponent> = self
            .components
            .iter()
            .map(|c| (c.id.clone(), c.clone()))
            .collect();
        for c in &newer.components {
            comps.insert(c.id.clone(), c.clone());
        }
        Baseline {
            t_ms: newer.t_ms,
            reason: newer.reason.clone(),
            components: comps.into_values().collect(),
        }
    }
}

/// CRC-32 (IEEE), bitwise: records are small and this keeps the format dependency-free.
pub fn crc32(data: &[u8]) -> u32 {
    let mut crc: u32 = 0xFFFF_FFFF;
    for &b in data {
        crc ^= u32::from(b);
        for _ in 0..8 {
            let mask = (crc & 1).wrapping_neg();
            crc = (crc >> 1) ^ (0xEDB8_8320 & mask);
        }
    }
    !crc
}

/// Encodes one record as a line.
pub fn encode(rec: &Record) -> Result<Vec<u8>> {
    let json = serde_json::to_vec(rec)?;
    let mut line = format!("{:08x} ", crc32(&json)).into_bytes();
    line.extend_from_slice(&json);
    line.push(b'\n');
    Ok(line)
}

/// Decodes one line (without its newline); None if truncated or corrupt.
pub fn decode(line: &[u8]) -> Option<Record> {
    if line.len() < 10 || line[8] != b' ' {
        return None;
    }
    let crc = u32::from_str_radix(std::str::from_utf8(&line[..8]).ok()?, 16).ok()?;
    let json = &line[9..];
    if crc32(json) != crc {
        return None;
    }
    serde_json::from_slice(json).ok()
}

/// Size-bounded rotation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct RotationPolicy {
    pub max_segment_bytes: u64,
    pub keep_segments: usize,
}

impl Default for RotationPolicy {
    fn default() -> Self {
        // 16 MiB x 8: a few hours of a small stack at default cadences.
        RotationPolicy {
            max_segment_bytes: 16 << 20,
            keep_segments: 8,
        }
    }
}

/// Appends records to a recording.
#[derive(Debug)]
pub struct RecordingWriter {
    target: Target,
    sink: gz::Sink,
    /// Written with the first record, so the policy (set after creation) decides the
    /// file's framing, header included.
    pending_header: Option<Record>,
    bytes: u64,
    seq: u64,
    last_topology: Option<Record>,
    last_baseline: Option<Record>,
    /// The first baseline ever written: "what changed since the start" survives rotation.
    first_baseline: Option<Record>,
    pid: i32,
    tool: String,
    delta: DeltaState,
    last_written: BTreeMap<crate::model::SourceKind, Millis>,
    /// Recordings travel (an incident recorded on one box is studied on another): every
    /// record passes through one redactor for the whole run, so a secret learned in one
    /// sample is scrubbed from every later one.
    redactor: crate::redact::Redactor,
    /// What to keep and how often: see [`RecordPolicy`].
    pub policy: RecordPolicy,
}

/// What a recording keeps (the live model still gets every sample).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RecordPolicy {
    /// Write at most one sample of a kind per this many ms (0: all). Sockets and GPU are
    /// sampled at 4 Hz for the live view; 1 Hz is plenty to replay a wedge.
    pub min_interval_ms: BTreeMap<crate::model::SourceKind, i64>,
    /// Keep every raw Prometheus series; otherwise only the ones the correlator reads raw
    /// (in-flight gauges); the mapped values are always kept.
    pub keep_raw_series: bool,
    /// Keyframes + deltas (default) instead of whole samples on every line.
    pub compact: bool,
    /// Keep only sockets of the recorded topology's components, and of the client side of
    /// a connection only its owner (the correlator needs the pid, not the counters, which
    /// the server side already has).
    pub trim_sockets: bool,
    /// Gzip-frame the file (about 10x smaller). Decided at a file's first record.
    #[serde(default = "yes")]
    pub compress: bool,
}

fn yes() -> bool {
    true
}

impl Default for RecordPolicy {
    fn default() -> Self {
        use crate::model::SourceKind;
        RecordPolicy {
            min_interval_ms: [(SourceKind::Sockets, 1000), (SourceKind::Gpu, 1000)]
                .into_iter()
                .collect(),
            keep_raw_series: false,
            compact: true,
            trim_sockets: true,
            compress: true,
        }
    }
}

/// Sockets that matter to the correlator: those on a component's listen port (server side
/// in full; client side without counters) and those owned by a component's process.
pub fn trim_sockets(
    table: &crate::model::SocketTable,
    topo: &Topology,
) -> crate::model::SocketTable {
    let ports: std::collections::BTreeSet<u16> = topo
        .components
        .iter()
        .flat_map(|c| c.listen_ports())
        .collect();
    let pids: std::collections::BTreeSet<i32> = topo
        .components
        .iter()
        .flat_map(|c| c.pids.iter().copied())
        .collect();
    let mut out = crate::model::SocketTable {
        sockets: Vec::new(),
        notes: table.notes.clone(),
    };
    for e in &table.sockets {
        if e.state == crate::model::TcpState::TimeWait {
            // Closed for the correlator (no owner, no tcp_info) and kept by the kernel for
            // a minute: a vanished connection replays the same, one record cheaper.
            continue;
        }
        let server_side = e.local_port().is_some_and(|p| ports.contains(&p));
        let client_side = e.remote_port().is_some_and(|p| ports.contains(&p)) && !server_side;
        let owned = e.pid.is_some_and(|p| pids.contains(&p));
        if server_side && e.state == crate::model::TcpState::Listen {
            // A listener's tcp_info "ms since last data" reads 0 on every dump, which would
            // rewrite every listener on every recorded sample; its counters mean nothing.
            let mut e = e.clone();
            e.tcp_info = None;
            out.sockets.push(e);
        } else if server_side {
            out.sockets.push(e.clone());
        } else if client_side {
            let mut e = e.clone();
            e.tcp_info = None;
            out.sockets.push(e);
        } else if owned {
            out.sockets.push(e.clone());
        }
    }
    out
}

/// Raw series the correlator reads directly (kept even when raw series are dropped).
fn series_consumed(name: &str) -> bool {
    name.ends_with("http_requests_active")
        || name.ends_with("worker_requests_active")
        || name.ends_with("router_running_requests")
}

#[derive(Debug)]
enum Target {
    File(PathBuf),
    Dir {
        dir: PathBuf,
        policy: RotationPolicy,
    },
}

fn open_append(path: &Path) -> Result<File> {
    let mut o = OpenOptions::new();
    o.create(true).append(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        o.mode(0o600); // recordings hold command lines and environments
        o.custom_flags(libc::O_NOFOLLOW);
    }
    o.open(path).map_err(|e| Error::io(path, e))
}

/// A new segment: created here, never through a link, never an existing file.
fn create_segment(path: &Path) -> Result<File> {
    crate::safe_fs::create_new_private_file(path).map_err(|e| Error::io(path, e))
}

fn segment_name(seq: u64) -> String {
    format!("{SEGMENT_PREFIX}{seq:08}{SEGMENT_SUFFIX}")
}

/// Segment files of a directory, oldest first, with their sequence numbers.
pub fn segments(dir: &Path) -> Result<Vec<(u64, PathBuf)>> {
    let rd = std::fs::read_dir(dir).map_err(|e| Error::io(dir, e))?;
    let mut v: Vec<(u64, PathBuf)> = rd
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            let n = name
                .strip_prefix(SEGMENT_PREFIX)?
                .strip_suffix(SEGMENT_SUFFIX)?;
            Some((n.parse().ok()?, e.path()))
        })
        .collect();
    v.sort();
    Ok(v)
}

impl RecordingWriter {
    /// One file, appended to (for `record -o FILE`). No rotation.
    pub fn create_file(path: &Path, now_ms: Millis) -> Result<RecordingWriter> {
        let file = open_append(path)?;
        let bytes = file.metadata().map(|m| m.len()).unwrap_or(0);
        let mut w = RecordingWriter::new(Target::File(path.to_path_buf()), file, bytes, 0);
        w.write_header(now_ms)?;
        Ok(w)
    }

    fn new(target: Target, file: File, bytes: u64, seq: u64) -> RecordingWriter {
        RecordingWriter {
            target,
            sink: gz::Sink::Fresh(file),
            pending_header: None,
            bytes,
            seq,
            last_topology: None,
            last_baseline: None,
            first_baseline: None,
            redactor: crate::redact::Redactor::new(),
            pid: std::process::id() as i32,
            tool: format!("wedgewatch {}", env!("CARGO_PKG_VERSION")),
            delta: DeltaState::default(),
            last_written: BTreeMap::new(),
            policy: RecordPolicy::default(),
        }
    }

    /// A directory of rotated segments (created 0700 if missing); continues after the
    /// newest existing segment.
    pub fn create_dir(
        dir: &Path,
        policy: RotationPolicy,
        now_ms: Millis,
    ) -> Result<RecordingWriter> {
        create_private_dir(dir)?;
        let seq = segments(dir)?.last().map(|(n, _)| n + 1).unwrap_or(1);
        let path = dir.join(segment_name(seq));
        let file = create_segment(&path)?;
        let target = Target::Dir {
            dir: dir.to_path_buf(),
            policy,
        };
        let mut w = RecordingWriter::new(target, file, 0, seq);
        w.write_header(now_ms)?;
        w.prune()?;
        Ok(w)
    }

    fn write_header(&mut self, now_ms: Millis) -> Result<()> {
        self.pending_header = Some(Record::Header {
            version: RECORDING_VERSION,
            t_ms: now_ms,
            pid: self.pid,
            tool: self.tool.clone(),
        });
        Ok(())
    }

    fn write_raw(&mut self, rec: &Record) -> Result<()> {
        let header = self.pending_header.take();
        for r in header.iter().chain(std::iter::once(rec)) {
            let line = encode(r)?;
            self.bytes = self
                .sink
                .append(&line, self.policy.compress, self.bytes)
                .map_err(|e| Error::io(self.path(), e))?;
        }
        Ok(())
    }

    /// The file currently written.
    pub fn path(&self) -> PathBuf {
        match &self.target {
            Target::File(p) => p.clone(),
            Target::Dir { dir, .. } => dir.join(segment_name(self.seq)),
        }
    }

    /// Appends a record, rotating first if the segment is full. A record that would not
    /// survive redaction is not written.
    pub fn write(&mut self, rec: &Record) -> Result<()> {
        let Some(redacted) = self.redactor.redact_typed(rec) else {
            return Ok(());
        };
        let rec = &redacted;
        if let Target::Dir { policy, .. } = &self.target {
            let max = policy.max_segment_bytes;
            if self.bytes > 0 && self.bytes >= max {
                self.rotate(rec.t_ms())?;
            }
        }
        match rec {
            Record::Topology { .. } => self.last_topology = Some(rec.clone()),
            Record::Baseline { .. } => {
                if self.first_baseline.is_none() {
                    self.first_baseline = Some(rec.clone());
                }
                self.last_baseline = Some(rec.clone());
            }
            _ => {}
        }
        self.write_raw(rec)
    }

    /// Appends a sample per the [`RecordPolicy`]: possibly skipped (cadence), trimmed
    /// (raw series) and delta-encoded. Returns whether it was written.
    pub fn write_sample(&mut self, s: &Sample) -> Result<bool> {
        let kind = s.kind();
        let min = self.policy.min_interval_ms.get(&kind).copied().unwrap_or(0);
        if let Some(last) = self.last_written.get(&kind) {
            if min > 0 && s.t_ms - last < min && s.t_ms >= *last {
                return Ok(false);
            }
        }
        let trimmed;
        let s = match (&s.payload, self.policy.keep_raw_series) {
            (crate::model::Payload::Sockets(table), _) if self.policy.trim_sockets => {
                let Some(Record::Topology { topology, .. }) = &self.last_topology else {
                    return self.write_untrimmed(s);
                };
                trimmed = Sample {
                    payload: crate::model::Payload::Sockets(trim_sockets(table, topology)),
                    ..s.clone()
                };
                &trimmed
            }
            (crate::model::Payload::Metrics(scrapes), false) => {
                let mut scrapes = scrapes.clone();
                for sc in scrapes.iter_mut() {
                    sc.series.retain(|x| series_consumed(&x.name));
                }
                trimmed = Sample {
                    payload: crate::model::Payload::Metrics(scrapes),
                    ..s.clone()
                };
                &trimmed
            }
            _ => s,
        };
        // After trimming (less to walk). Every kind of payload, not only processes:
        // secrets also sit in metrics labels, `/v1/loads` bodies, thread names, stacks.
        let Some(redacted) = self.redactor.redact_typed(s) else {
            return Ok(false);
        };
        let s = &redacted;
        if self.policy.compact {
            // Rotation resets the delta base: check before encoding.
            if let Target::Dir { policy, .. } = &self.target {
                if self.bytes > 0 && self.bytes >= policy.max_segment_bytes {
                    self.rotate(s.t_ms)?;
                }
            }
            let rec = self.delta.encode(s)?;
            self.write_raw(&rec)?;
        } else {
            self.write(&Record::Sample { sample: s.clone() })?;
        }
        self.last_written.insert(kind, s.t_ms);
        Ok(true)
    }

    fn write_untrimmed(&mut self, s: &Sample) -> Result<bool> {
        let keep = self.policy.trim_sockets;
        self.policy.trim_sockets = false;
        let r = self.write_sample(s);
        self.policy.trim_sockets = keep;
        r
    }

    fn rotate(&mut self, now_ms: Millis) -> Result<()> {
        let Target::Dir { dir, .. } = &self.target else {
            return Ok(());
        };
        let old = dir.join(segment_name(self.seq));
        self.seq += 1;
        let path = dir.join(segment_name(self.seq));
        let file = create_segment(&path)?;
        std::mem::replace(&mut self.sink, gz::Sink::Fresh(file))
            .finish()
            .map_err(|e| Error::io(&old, e))?;
        self.bytes = 0;
        self.delta.reset();
        self.write_header(now_ms)?;
        // A segment must replay on its own: carry the context forward.
        if let Some(t) = self.last_topology.clone() {
            self.write_raw(&t)?;
        }
        if let Some(b) = self.first_baseline.clone() {
            if Some(&b) != self.last_baseline.as_ref() {
                self.write_raw(&b)?;
            }
        }
        if let Some(b) = self.last_baseline.clone() {
            self.write_raw(&b)?;
        }
        self.prune()
    }

    fn prune(&self) -> Result<()> {
        if let Target::Dir { dir, policy } = &self.target {
            let segs = segments(dir)?;
            let keep = policy.keep_segments.max(1);
            if segs.len() > keep {
                for (_, p) in &segs[..segs.len() - keep] {
                    std::fs::remove_file(p).map_err(|e| Error::io(p, e))?;
                }
            }
        }
        Ok(())
    }

    /// Flushes to the disk (records reach the OS as they are written; this is for
    /// fsync-minded callers).
    pub fn sync(&mut self) -> Result<()> {
        let p = self.path();
        self.sink.sync().map_err(|e| Error::io(p, e))
    }
}

/// Creates a directory readable by its owner only.
pub fn create_private_dir(dir: &Path) -> Result<()> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(|e| Error::io(dir, e))
    }
    #[cfg(not(unix))]
    {
        std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))
    }
}

/// Parses `--at TIME` for a replay: RFC 3339 (`2026-11-29T12:00:00Z`), epoch milliseconds,
/// or an offset from the recording's first record (`+90s`, `+5m`, `+1h`, `+1500ms`).
pub fn parse_at(s: &str, recording_start_ms: Millis) -> Result<Millis> {
    let bad = || {
        Error::Other(format!(
            "--at {s:?}: expected RFC 3339 time, epoch ms, or +N[ms|s|m|h] from the recording start"
        ))
    };
    let s = s.trim();
    if let Some(off) = s.strip_prefix('+') {
        let split = off.find(|c: char| !c.is_ascii_digit()).unwrap_or(off.len());
        let (num, unit) = off.split_at(split);
        let n: i64 = num.parse().map_err(|_| bad())?;
        let mult = match unit {
            "ms" => 1,
            "" | "s" => 1000,
            "m" => 60_000,
            "h" => 3_600_000,
            _ => return Err(bad()),
        };
        // Checked: `+9223372036854775807s` must be a bad --at, not an overflow panic.
        return n
            .checked_mul(mult)
            .and_then(|off| recording_start_ms.checked_add(off))
            .ok_or_else(bad);
    }
    if let Ok(ms) = s.parse::<i64>() {
        return Ok(ms);
    }
    crate::clock::parse_rfc3339(s).ok_or_else(bad)
}

/// `wedgewatch record -o FILE --for DURATION` in one call: runs the sampler for
/// `duration_ms` (tokio time), writes every sample to `path` (appending), plus the topology
/// and a baseline from the first processes sample. Returns the samples written.
pub async fn record_to_file(
    sampler: crate::sampler::Sampler,
    path: &Path,
    duration_ms: u64,
    topology: &Topology,
    clock: std::sync::Arc<dyn Clock>,
) -> Result<u64> {
    let mut w = RecordingWriter::create_file(path, clock.now_ms())?;
    w.write(&Record::Topology {
        t_ms: clock.now_ms(),
        topology: topology.clone(),
    })?;
    let (tx, mut rx) = tokio::sync::mpsc::channel(4096);
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let task = tokio::spawn(sampler.run(tx, stop_rx));
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_millis(duration_ms);
    let mut n = 0;
    let mut baselined = false;
    let mut result = Ok(());
    while let Ok(Some(s)) = tokio::time::timeout_at(deadline, rx.recv()).await {
        if let (false, crate::model::Payload::Processes(p)) = (baselined, &s.payload) {
            let b = Baseline::take(s.t_ms, topology, p, "start");
            if !b.components.is_empty() {
                baselined = true;
                if let Err(e) = w.write(&Record::Baseline { baseline: b }) {
                    result = Err(e);
                    break;
                }
            }
        }
        match w.write_sample(&s) {
            Ok(true) => n += 1,
            Ok(false) => {}
            Err(e) => {
                result = Err(e);
                break;
            }
        }
    }
    let _ = stop_tx.send(true);
    drop(rx);
    let _ = task.await;
    result.map(|()| n)
}
