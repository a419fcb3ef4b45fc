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
use crate::correlate::Model;
use crate::detect::Thresholds;
use crate::error::{Error, Result};
use crate::model::{Change, ProcessFacts, Role, Sample, Topology};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::BufRead;
use std::path::{Path, PathBuf};

mod gz;

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
    /// Secret-looking values are replaced by `<redacted:crc32>` (still comparable).
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

/// A per-process random salt for masking secret values in baselines: two baselines of one
/// daemon compare equal when a secret is unchanged, but a shared recording does not let
/// anyone test guesses against the mask.
fn secret_salt() -> &'static [u8; 16] {
    static SALT: std::sync::OnceLock<[u8; 16]> = std::sync::OnceLock::new();
    SALT.get_or_init(|| {
        let mut salt = [0u8; 16];
        let ok = std::fs::File::open("/dev/urandom")
            .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut salt))
            .is_ok();
        if !ok {
            let t = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos())
                .unwrap_or_default();
            salt[..16].copy_from_slice(&(t ^ u128::from(std::process::id())).to_le_bytes());
        }
        salt
    })
}

/// The stored form of a secret value: a salted checksum, never the value.
fn mask_secret(v: &str) -> String {
    let mut data = secret_salt().to_vec();
    data.extend_from_slice(v.as_bytes());
    format!("<redacted:{:08x}>", crc32(&data))
}

/// What leaves the daemon in a `Change`: the mask becomes plain `<redacted>`.
fn unmask(v: Option<String>) -> Option<String> {
    v.map(|s| {
        if s.starts_with("<redacted:") {
            crate::model::REDACTED.to_string()
        } else {
            s
        }
    })
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
            let env = env_facts
                .env
                .clone()
                .unwrap_or_default()
                .into_iter()
                .map(|(k, v)| {
                    if is_secret_name(&k) {
                        let masked = mask_secret(&v);
                        (k, masked)
                    } else {
                        (k, v)
                    }
                })
                .collect();
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
                cmdline: crate::redact::Redactor::new()
                    .args(&args_facts.cmdline.clone().unwrap_or_default()),
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
                if b != a {
                    out.push(ch("env", Some(k.clone()), b.cloned(), a.cloned()));
                }
            }
            if o.cmdline != n.cmdline {
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
    }
    o.open(path).map_err(|e| Error::io(path, e))
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
        let file = open_append(&path)?;
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

    /// Appends a record, rotating first if the segment is full.
    pub fn write(&mut self, rec: &Record) -> Result<()> {
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
            // Recordings travel (an incident recorded on one box is studied on another):
            // secrets in environments and arguments are never written in clear.
            (crate::model::Payload::Processes(facts), _) => {
                let mut facts = facts.clone();
                let mut redactor = crate::redact::Redactor::new();
                for f in facts.iter_mut() {
                    redactor.facts(f);
                }
                trimmed = Sample {
                    payload: crate::model::Payload::Processes(facts),
                    ..s.clone()
                };
                &trimmed
            }
            _ => s,
        };
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
        let file = open_append(&path)?;
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

/// A recording opened for reading.
#[derive(Debug, Clone)]
pub struct Recording {
    pub files: Vec<PathBuf>,
}

/// What reading skipped.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReadStats {
    pub records: u64,
    /// Lines that were truncated or failed their checksum.
    pub skipped: u64,
    /// Delta records whose base was lost with a skipped line (until the next keyframe).
    pub undecodable: u64,
}

impl Recording {
    /// A file, or a directory of segments.
    pub fn open(path: &Path) -> Result<Recording> {
        let md = std::fs::metadata(path).map_err(|e| Error::io(path, e))?;
        let files = if md.is_dir() {
            let s = segments(path)?;
            if s.is_empty() {
                return Err(Error::Other(format!(
                    "{}: no recording segments (seg-*.wwrec) in this directory",
                    path.display()
                )));
            }
            s.into_iter().map(|(_, p)| p).collect()
        } else {
            vec![path.to_path_buf()]
        };
        Ok(Recording { files })
    }

    /// Every whole record, in file order; truncated or corrupt lines are skipped and
    /// counted. Loads everything: for long recordings use [`Recording::records`].
    pub fn read(&self) -> Result<(Vec<Record>, ReadStats)> {
        let mut it = self.records();
        let mut out = Vec::new();
        for r in it.by_ref() {
            out.push(r?);
        }
        Ok((out, it.stats))
    }

    /// Streams the records (deltas already turned back into samples), one line in memory
    /// at a time. An I/O error ends the stream after yielding it.
    pub fn records(&self) -> RecordIter {
        RecordIter {
            files: self.files.clone(),
            next_file: 0,
            reader: None,
            delta: DeltaState::default(),
            buf: Vec::new(),
            stats: ReadStats::default(),
            failed: false,
        }
    }
}

/// Iterator over a recording's records; `stats` counts what was skipped so far.
pub struct RecordIter {
    files: Vec<PathBuf>,
    next_file: usize,
    reader: Option<(PathBuf, Box<dyn BufRead + Send>)>,
    delta: DeltaState,
    buf: Vec<u8>,
    pub stats: ReadStats,
    failed: bool,
}

impl Iterator for RecordIter {
    type Item = Result<Record>;

    fn next(&mut self) -> Option<Result<Record>> {
        if self.failed {
            return None;
        }
        loop {
            if self.reader.is_none() {
                let f = self.files.get(self.next_file)?.clone();
                self.next_file += 1;
                match gz::open_lines(&f) {
                    Ok(lines) => self.reader = Some((f, lines)),
                    Err(e) => {
                        self.failed = true;
                        return Some(Err(Error::io(f, e)));
                    }
                }
                // Delta bases never cross a segment: each starts with keyframes.
                self.delta.reset();
            }
            let Some((path, r)) = self.reader.as_mut() else {
                continue;
            };
            self.buf.clear();
            let n = match r.read_until(b'\n', &mut self.buf) {
                Ok(n) => n,
                Err(e) => {
                    self.failed = true;
                    return Some(Err(Error::io(path.clone(), e)));
                }
            };
            if n == 0 {
                self.reader = None;
                continue;
            }
            let complete = self.buf.last() == Some(&b'\n');
            let line = if complete {
                &self.buf[..self.buf.len() - 1]
            } else {
                &self.buf[..]
            };
            match (complete, decode(line)) {
                (true, Some(rec @ Record::Delta { .. })) => match self.delta.decode(&rec) {
                    Some(sample) => {
                        self.stats.records += 1;
                        return Some(Ok(Record::Sample { sample }));
                    }
                    None => self.stats.undecodable += 1,
                },
                (true, Some(rec)) => {
                    self.stats.records += 1;
                    return Some(Ok(rec));
                }
                _ => self.stats.skipped += 1,
            }
        }
    }
}

/// A model rebuilt from a recording.
#[derive(Debug, Clone)]
pub struct Replayed {
    pub model: Model,
    /// Baselines in the recording up to the replay time, oldest first.
    pub baselines: Vec<Baseline>,
    pub stats: ReadStats,
    /// The time the model was replayed to.
    pub at_ms: Millis,
}

/// Feeds a recording through the correlator up to `at` (inclusive; None: the end), so
/// `snapshot --from FILE --at TIME` sees what a live snapshot would have seen then.
/// `config_changed` is set from the oldest baseline to the newest one up to `at`.
pub fn replay(rec: &Recording, at: Option<Millis>, thresholds: Thresholds) -> Result<Replayed> {
    let mut records = rec.records();
    let mut r = Replayer::new(thresholds);
    for rec in records.by_ref() {
        let rec = rec?;
        if at.is_some_and(|a| rec.t_ms() > a) {
            // Headers/context re-written at rotation carry the rotation time; only samples
            // define the timeline, so stop at the first sample past `at`.
            if matches!(rec, Record::Sample { .. }) {
                break;
            }
            continue;
        }
        r.apply(rec);
    }
    let at_ms = at.or(r.last_sample_ms).unwrap_or(0);
    Ok(Replayed {
        model: r.model,
        baselines: r.baselines,
        stats: records.stats,
        at_ms,
    })
}

/// Feeds records through the correlator one at a time: what `replay` and the UI's
/// `--replay` share. `config_changed` always compares the oldest baseline with the newest
/// facts seen so far.
#[derive(Debug)]
pub struct Replayer {
    pub model: Model,
    pub baselines: Vec<Baseline>,
    pub last_sample_ms: Option<Millis>,
}

impl Replayer {
    pub fn new(thresholds: Thresholds) -> Replayer {
        let mut model = Model::new(thresholds);
        // The recorder's own pid comes from the recording's header, not from this process.
        model.ignore_client_pids.clear();
        Replayer {
            model,
            baselines: Vec::new(),
            last_sample_ms: None,
        }
    }

    /// Applies one record; returns the sample time when it was a sample.
    pub fn apply(&mut self, r: Record) -> Option<Millis> {
        match r {
            Record::Header { pid, .. } => {
                if !self.model.ignore_client_pids.contains(&pid) {
                    self.model.ignore_client_pids.push(pid);
                }
                None
            }
            Record::Topology { topology, .. } => {
                self.model.set_topology(topology);
                None
            }
            Record::Baseline { baseline } => {
                if self.baselines.last() != Some(&baseline) {
                    self.baselines.push(baseline);
                    if let Some(first) = self.baselines.first() {
                        let merged = self
                            .baselines
                            .iter()
                            .skip(1)
                            .fold(first.clone(), |acc, b| acc.merged(b));
                        self.model.set_config_changes(first.changes_to(&merged));
                    }
                }
                None
            }
            // Decoded into samples by `read`.
            Record::Delta { .. } => None,
            Record::Sample { sample } => {
                let t = sample.t_ms;
                self.last_sample_ms = Some(self.last_sample_ms.map_or(t, |l| l.max(t)));
                self.model.ingest(&sample);
                Some(t)
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// Compact sample encoding: keyframes and deltas.
//
// Consecutive samples of one source are mostly the same (idle connections, unchanged stacks,
// environments). A `delta` record carries only what changed against the previous sample of
// the same kind, as a JSON patch; every `KEYFRAME_EVERY` samples, and at the start of every
// segment, a keyframe carries it whole. Each record holds the CRC of the full reconstructed
// sample, so a reader that lost a record (a corrupt line) never applies a delta to the
// wrong base: it waits for the next keyframe. The kernel's "ms since last data" fields are
// stored as absolute times so an idle connection is byte-for-byte unchanged.

/// A keyframe at least this often per source kind.
pub const KEYFRAME_EVERY: u32 = 120;
const RELATIVE_MS_FIELDS: [&str; 3] =
    ["last_data_sent_ms", "last_data_recv_ms", "last_ack_recv_ms"];

/// Rewrites "ms ago" fields to absolute times (`to_abs`) or back.
/// (`abs = t - ago` and `ago = t - abs`: the same map both ways.)
fn rebase_times(v: &mut serde_json::Value, t_ms: Millis) {
    match v {
        serde_json::Value::Object(o) => {
            for (k, x) in o.iter_mut() {
                if RELATIVE_MS_FIELDS.contains(&k.as_str()) {
                    if let Some(n) = x.as_i64() {
                        *x = serde_json::Value::from(t_ms - n);
                    }
                } else {
                    rebase_times(x, t_ms);
                }
            }
        }
        serde_json::Value::Array(a) => a.iter_mut().for_each(|x| rebase_times(x, t_ms)),
        _ => {}
    }
}

/// Identity of an array element, for keyed array diffs.
fn elem_key(v: &serde_json::Value) -> Option<String> {
    let o = v.as_object()?;
    if let (Some(l), Some(r)) = (o.get("local"), o.get("remote")) {
        return Some(format!(
            "s|{l}|{r}|{}",
            o.get("netns").unwrap_or(&serde_json::Value::Null)
        ));
    }
    if let (Some(n), Some(l)) = (o.get("name"), o.get("labels")) {
        return Some(format!("m|{n}|{l}"));
    }
    for k in ["tid", "pid", "component", "index"] {
        if let Some(x) = o.get(k) {
            return Some(format!("{k}|{x}"));
        }
    }
    None
}

fn keyed(a: &[serde_json::Value]) -> Option<Vec<String>> {
    let keys: Option<Vec<String>> = a.iter().map(elem_key).collect();
    let keys = keys?;
    let uniq: std::collections::BTreeSet<&String> = keys.iter().collect();
    (uniq.len() == keys.len()).then_some(keys)
}

/// The patch turning `old` into `new`, or None if equal.
pub fn diff_json(old: &serde_json::Value, new: &serde_json::Value) -> Option<serde_json::Value> {
    use serde_json::{json, Map, Value};
    if old == new {
        return None;
    }
    match (old, new) {
        (Value::Object(a), Value::Object(b)) => {
            let mut p = Map::new();
            for (k, vb) in b {
                match a.get(k) {
                    Some(va) => {
                        if let Some(n) = diff_json(va, vb) {
                            p.insert(k.clone(), n);
                        }
                    }
                    None => {
                        p.insert(k.clone(), json!({ "$v": vb }));
                    }
                }
            }
            let d: Vec<&String> = a.keys().filter(|k| !b.contains_key(*k)).collect();
            let mut node = Map::new();
            node.insert("$p".into(), Value::Object(p));
            if !d.is_empty() {
                node.insert("$d".into(), json!(d));
            }
            Some(Value::Object(node))
        }
        (Value::Array(a), Value::Array(b)) => {
            let (Some(ka), Some(kb)) = (keyed(a), keyed(b)) else {
                // Unkeyed (or duplicate keys, e.g. three stack dumps of one pid per window):
                // element by element when the length is the same, which is the common case
                // of a source that re-reads the same things; whole otherwise.
                if a.len() == b.len() {
                    let at: Vec<Value> = a
                        .iter()
                        .zip(b)
                        .enumerate()
                        .filter_map(|(i, (ea, eb))| diff_json(ea, eb).map(|n| json!([i, n])))
                        .collect();
                    let whole = serde_json::to_vec(new).map_or(0, |v| v.len());
                    let patch = serde_json::to_vec(&at).map_or(usize::MAX, |v| v.len());
                    if patch < whole {
                        return Some(json!({ "$i": at }));
                    }
                }
                return Some(json!({ "$v": new }));
            };
            let index: BTreeMap<&String, &Value> = ka.iter().zip(a.iter()).collect();
            let mut upd = Vec::new();
            let mut added = Vec::new();
            for (k, eb) in kb.iter().zip(b.iter()) {
                match index.get(k) {
                    Some(ea) => {
                        if let Some(n) = diff_json(ea, eb) {
                            upd.push(json!({ "k": k, "n": n }));
                        }
                    }
                    None => added.push(eb.clone()),
                }
            }
            let kb_set: std::collections::BTreeSet<&String> = kb.iter().collect();
            let removed: Vec<&String> = ka.iter().filter(|k| !kb_set.contains(k)).collect();
            // Order after apply: old order minus removed, then the added ones.
            let mut order: Vec<&String> = ka.iter().filter(|k| kb_set.contains(k)).collect();
            let ka_set: std::collections::BTreeSet<&String> = ka.iter().collect();
            order.extend(kb.iter().filter(|k| !ka_set.contains(k)));
            let mut node = Map::new();
            node.insert("$k".into(), json!(1));
            if !upd.is_empty() {
                node.insert("$u".into(), Value::Array(upd));
            }
            if !added.is_empty() {
                node.insert("$n".into(), Value::Array(added));
            }
            if !removed.is_empty() {
                node.insert("$r".into(), json!(removed));
            }
            if order != kb.iter().collect::<Vec<_>>() {
                // The common case: the kept elements are in their old order and new ones
                // landed in between (a new connection in a socket table). Then the new
                // elements' positions say it all; a full key list ($o) only otherwise.
                let kept_new: Vec<&String> = kb.iter().filter(|k| ka_set.contains(k)).collect();
                let kept_old: Vec<&String> = ka.iter().filter(|k| kb_set.contains(k)).collect();
                if kept_new == kept_old {
                    let at: Vec<usize> = kb
                        .iter()
                        .enumerate()
                        .filter(|(_, k)| !ka_set.contains(k))
                        .map(|(i, _)| i)
                        .collect();
                    node.insert("$a".into(), json!(at));
                } else {
                    node.insert("$o".into(), json!(kb));
                }
            }
            Some(Value::Object(node))
        }
        _ => Some(json!({ "$v": new })),
    }
}

/// Applies a patch from [`diff_json`]; None if it does not fit the base.
pub fn apply_json(base: &serde_json::Value, node: &serde_json::Value) -> Option<serde_json::Value> {
    use serde_json::Value;
    let n = node.as_object()?;
    if let Some(v) = n.get("$v") {
        return Some(v.clone());
    }
    if let Some(at) = n.get("$i").and_then(Value::as_array) {
        let mut a = base.as_array()?.clone();
        for pair in at {
            let i = usize::try_from(pair.get(0)?.as_u64()?).ok()?;
            let slot = a.get_mut(i)?;
            *slot = apply_json(slot, pair.get(1)?)?;
        }
        return Some(Value::Array(a));
    }
    if let Some(p) = n.get("$p").and_then(Value::as_object) {
        let mut o = base.as_object()?.clone();
        for (k, sub) in p {
            let cur = o.get(k).cloned().unwrap_or(Value::Null);
            o.insert(k.clone(), apply_json(&cur, sub)?);
        }
        for d in n.get("$d").and_then(Value::as_array).into_iter().flatten() {
            o.remove(d.as_str()?);
        }
        return Some(Value::Object(o));
    }
    if n.contains_key("$k") {
        let a = base.as_array()?;
        let keys = keyed(a)?;
        let mut elems: Vec<(String, Value)> = keys.into_iter().zip(a.iter().cloned()).collect();
        let removed: Vec<&str> = n
            .get("$r")
            .and_then(Value::as_array)
            .map(|r| r.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        elems.retain(|(k, _)| !removed.contains(&k.as_str()));
        for u in n.get("$u").and_then(Value::as_array).into_iter().flatten() {
            let k = u.get("k")?.as_str()?;
            let slot = elems.iter_mut().find(|(ek, _)| ek == k)?;
            slot.1 = apply_json(&slot.1, u.get("n")?)?;
        }
        for e in n.get("$n").and_then(Value::as_array).into_iter().flatten() {
            elems.push((elem_key(e)?, e.clone()));
        }
        if let Some(at) = n.get("$a").and_then(Value::as_array) {
            // `elems` is kept (old order) then added; put the added ones at their places.
            let added = n.get("$n").and_then(Value::as_array).map_or(0, Vec::len);
            let split = elems.len().checked_sub(added)?;
            let new_ones = elems.split_off(split);
            if at.len() != new_ones.len() {
                return None;
            }
            let mut out: Vec<Value> = Vec::with_capacity(elems.len() + new_ones.len());
            let mut kept = elems.into_iter().map(|(_, v)| v);
            for ((_, v), pos) in new_ones.into_iter().zip(at) {
                let pos = usize::try_from(pos.as_u64()?).ok()?;
                while out.len() < pos {
                    out.push(kept.next()?);
                }
                out.push(v);
            }
            out.extend(kept);
            return Some(Value::Array(out));
        }
        if let Some(order) = n.get("$o").and_then(Value::as_array) {
            let mut by: BTreeMap<String, Value> = elems.into_iter().collect();
            let mut out = Vec::new();
            for k in order {
                out.push(by.remove(k.as_str()?)?);
            }
            return Some(Value::Array(out));
        }
        return Some(Value::Array(elems.into_iter().map(|(_, v)| v).collect()));
    }
    None
}

/// Per-kind state of the delta encoder / decoder.
#[derive(Debug, Default, Clone)]
pub struct DeltaState {
    bases: BTreeMap<crate::model::SourceKind, (serde_json::Value, u32)>,
}

impl DeltaState {
    pub fn reset(&mut self) {
        self.bases.clear();
    }

    /// Encodes a sample as a keyframe or a delta record.
    pub fn encode(&mut self, s: &Sample) -> Result<Record> {
        let mut full = serde_json::to_value(&s.payload)?;
        let mut state = full
            .get_mut("data")
            .map(serde_json::Value::take)
            .unwrap_or_default();
        rebase_times(&mut state, s.t_ms);
        let crc = crc32(&serde_json::to_vec(&state)?);
        let kind = s.kind();
        let (key, data, count) = match self.bases.get(&kind) {
            Some((base, n)) if *n < KEYFRAME_EVERY => match diff_json(base, &state) {
                Some(p) => (false, p, n + 1),
                None => (false, serde_json::json!({ "$p": {} }), n + 1),
            },
            _ => (true, state.clone(), 0),
        };
        self.bases.insert(kind, (state, count));
        Ok(Record::Delta {
            t_ms: s.t_ms,
            kind,
            status: s.status.clone(),
            took_ms: s.took_ms,
            key,
            crc,
            data,
        })
    }

    /// Decodes a delta record back into a sample; None if its base is missing or the
    /// result fails its CRC (a record was lost): wait for the next keyframe.
    pub fn decode(&mut self, r: &Record) -> Option<Sample> {
        let Record::Delta {
            t_ms,
            kind,
            status,
            took_ms,
            key,
            crc,
            data,
        } = r
        else {
            return None;
        };
        let state = if *key {
            data.clone()
        } else {
            let base = &self.bases.get(kind)?.0;
            apply_json(base, data)?
        };
        let ok = serde_json::to_vec(&state)
            .map(|b| crc32(&b) == *crc)
            .unwrap_or(false);
        if !ok {
            self.bases.remove(kind);
            return None;
        }
        self.bases.insert(*kind, (state.clone(), 0));
        let mut data = state;
        rebase_times(&mut data, *t_ms);
        let payload: crate::model::Payload =
            serde_json::from_value(serde_json::json!({ "source": kind, "data": data })).ok()?;
        Some(Sample {
            t_ms: *t_ms,
            status: status.clone(),
            took_ms: *took_ms,
            payload,
        })
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

/// Time of the first record (for relative `--at`), without reading past it.
pub fn first_record_ms(rec: &Recording) -> Option<Millis> {
    rec.records().find_map(|r| r.ok()).map(|r| r.t_ms())
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

#[cfg(test)]
mod delta_tests {
    use super::{apply_json, diff_json};
    use serde_json::json;

    fn round_trip(old: serde_json::Value, new: serde_json::Value) -> serde_json::Value {
        let patch = diff_json(&old, &new).expect("they differ");
        assert_eq!(apply_json(&old, &patch), Some(new), "patch {patch}");
        patch
    }

    #[test]
    fn duplicate_keys_are_diffed_by_position() {
        // Three dumps of one pid per window: the same key three times.
        let dump = |t: i64, line: i64| json!({"pid": 7, "t_ms": t, "frames": [{"line": line}]});
        let old = json!([dump(1, 10), dump(2, 10), dump(3, 10)]);
        let new = json!([dump(4, 10), dump(5, 11), dump(6, 10)]);
        let patch = round_trip(old, new);
        assert!(patch.get("$i").is_some(), "{patch}");
        assert!(
            !patch.to_string().contains("frames\":[{"),
            "only what changed: {patch}"
        );
        // A different length is written whole.
        let patch = round_trip(json!([dump(1, 1)]), json!([dump(1, 1), dump(1, 1)]));
        assert!(patch.get("$v").is_some(), "{patch}");
    }

    #[test]
    fn new_elements_in_the_middle_carry_positions_not_the_whole_order() {
        let s = |l: &str| json!({"local": l, "remote": "r", "state": "ESTABLISHED"});
        let old = json!([s("a"), s("c"), s("e"), s("g")]);
        let new = json!([s("a"), s("b"), s("c"), s("g"), s("h"), s("d0")]);
        let patch = round_trip(old.clone(), new);
        assert_eq!(patch["$a"], json!([1, 4, 5]), "{patch}");
        assert!(patch.get("$o").is_none(), "{patch}");
        // Kept elements reordered: the full order is still written, and still right.
        let patch = round_trip(old, json!([s("c"), s("a"), s("x")]));
        assert!(patch.get("$o").is_some(), "{patch}");
    }
}
