//! Writing recordings: [`RecordingWriter`] appends records to one file or to a directory of
//! size-rotated segments (`seg-00000001.wwrec`, ..., keeping the newest N), each segment
//! starting with a header and the current topology and baselines so it replays on its own.
//! [`RecordPolicy`] says what is kept: sample cadence, sockets and raw series trimmed to what
//! the correlator reads, keyframes + deltas, gzip framing. Every record is redacted first.

use super::delta::DeltaState;
use super::{encode, gz, Record, RECORDING_VERSION};
use crate::clock::Millis;
use crate::error::{Error, Result};
use crate::model::{Payload, Sample, Topology};
use serde::{Deserialize, Serialize};
use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fs::File;
use std::path::{Path, PathBuf};

const SEGMENT_PREFIX: &str = "seg-";
const SEGMENT_SUFFIX: &str = ".wwrec";

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
    /// The sockets last written: response progress is thinned (`progress.rs`).
    progress: super::progress::Progress,
    last_written: BTreeMap<crate::model::SourceKind, Millis>,
    /// Whether the recorder suspects anything now (see [`RecordingWriter::set_alert`]).
    alert: bool,
    /// Recordings travel: every record passes through one redactor for the whole run, so a
    /// secret learned in one sample is scrubbed from every later one.
    redactor: crate::redact::Redactor,
    /// What to keep and how often: see [`RecordPolicy`].
    pub policy: RecordPolicy,
}

/// What a recording keeps (the live model still gets every sample).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RecordPolicy {
    /// Write at most one sample of a kind per this many ms (0: all): sampled fast for the live
    /// view, a wedge replays at 1 Hz.
    pub min_interval_ms: BTreeMap<crate::model::SourceKind, i64>,
    /// The same while calm (nothing suspected, [`RecordingWriter::set_alert`]): a calm stretch
    /// is kept for its state, not for every short connection.
    #[serde(default = "calm_intervals")]
    pub calm_interval_ms: BTreeMap<crate::model::SourceKind, i64>,
    /// Keep every raw Prometheus series; otherwise only the ones the correlator reads raw
    /// (in-flight gauges); the mapped values are always kept.
    pub keep_raw_series: bool,
    /// Keyframes + deltas (default) instead of whole samples on every line.
    pub compact: bool,
    /// Keep only sockets of the recorded topology's components, and of a connection's client
    /// side only its owner (the server side has the counters).
    pub trim_sockets: bool,
    /// Gzip-frame the file. Decided at a file's first record.
    #[serde(default = "yes")]
    pub compress: bool,
}

fn yes() -> bool {
    true
}

/// Sockets every 10 s while calm (a third of the wedge threshold); metrics and GPU readings
/// every 5 s (read live every second, they need not be recorded as often).
fn calm_intervals() -> BTreeMap<crate::model::SourceKind, i64> {
    use crate::model::SourceKind;
    [
        (SourceKind::Sockets, 10_000),
        (SourceKind::Metrics, 5_000),
        (SourceKind::Gpu, 5_000),
    ]
    .into_iter()
    .collect()
}

impl Default for RecordPolicy {
    fn default() -> Self {
        use crate::model::SourceKind;
        RecordPolicy {
            min_interval_ms: [(SourceKind::Sockets, 1000), (SourceKind::Gpu, 1000)]
                .into_iter()
                .collect(),
            calm_interval_ms: calm_intervals(),
            keep_raw_series: false,
            compact: true,
            trim_sockets: true,
            compress: true,
        }
    }
}

/// `s` with another payload (its time, status and duration), without copying its own.
fn with_payload(s: &Sample, payload: Payload) -> Sample {
    Sample {
        t_ms: s.t_ms,
        status: s.status.clone(),
        took_ms: s.took_ms,
        payload,
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
            let mut e = replayed_fields(e);
            e.tcp_info = None;
            out.sockets.push(e);
        } else if server_side {
            out.sockets.push(replayed_fields(e));
        } else if client_side {
            let mut e = replayed_fields(e);
            e.tcp_info = None;
            out.sockets.push(e);
        } else if owned {
            out.sockets.push(replayed_fields(e));
        }
    }
    out
}

/// A socket as a recording keeps it: what replay reads; the rest, which changes in every
/// sample, zeroed (`bytes_sent` only while nothing is acked: the correlator's fallback).
fn replayed_fields(e: &crate::model::SocketEntry) -> crate::model::SocketEntry {
    let tcp_info = e.tcp_info.map(|t| crate::model::TcpInfo {
        bytes_acked: t.bytes_acked,
        bytes_received: t.bytes_received,
        bytes_sent: if t.bytes_acked == 0 { t.bytes_sent } else { 0 },
        last_data_sent_ms: t.last_data_sent_ms,
        last_data_recv_ms: t.last_data_recv_ms,
        last_ack_recv_ms: t.last_ack_recv_ms,
        ..crate::model::TcpInfo::default()
    });
    crate::model::SocketEntry {
        rx_queue: 0,
        tx_queue: 0,
        uid: 0,
        tcp_info,
        ..e.clone()
    }
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

/// `record -o FILE`: appended to, never through a planted link nor into another user's file.
fn open_append(path: &Path) -> Result<File> {
    Ok(crate::safe_fs::open_append_output(path)?)
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
            progress: super::progress::Progress::default(),
            last_written: BTreeMap::new(),
            alert: true,
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
            node: Some(crate::snapshot::node::for_output(
                crate::sys::node::this_node(),
                true,
            )),
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

    /// Whether anything is suspected now: alert, samples are written at
    /// [`RecordPolicy::min_interval_ms`]; calm, at [`RecordPolicy::calm_interval_ms`]. A
    /// writer never told is alert.
    pub fn set_alert(&mut self, yes: bool) {
        self.alert = yes;
    }

    /// The cadence in force for `kind`: at most one sample per this many ms (0: every one).
    pub fn every_ms(&self, kind: crate::model::SourceKind) -> i64 {
        let calm = (!self.alert)
            .then(|| self.policy.calm_interval_ms.get(&kind))
            .flatten();
        calm.or_else(|| self.policy.min_interval_ms.get(&kind))
            .copied()
            .unwrap_or(0)
            .max(0)
    }

    /// Appends a sample per the [`RecordPolicy`]: possibly skipped (cadence), trimmed
    /// (raw series) and delta-encoded. Returns whether it was written.
    pub fn write_sample(&mut self, s: &Sample) -> Result<bool> {
        let kind = s.kind();
        let min = self.every_ms(kind);
        if let Some(last) = self.last_written.get(&kind) {
            if min > 0 && s.t_ms - last < min && s.t_ms >= *last {
                return Ok(false);
            }
        }
        let trimmed = match (&s.payload, self.policy.keep_raw_series) {
            (Payload::Sockets(table), _) if self.policy.trim_sockets => {
                let Some(Record::Topology { topology, .. }) = &self.last_topology else {
                    return self.write_untrimmed(s);
                };
                let mut table = trim_sockets(table, topology);
                if self.policy.compact {
                    self.progress.thin(s.t_ms, &mut table);
                }
                Cow::Owned(with_payload(s, Payload::Sockets(table)))
            }
            (Payload::Metrics(scrapes), false) => {
                let mut scrapes = scrapes.clone();
                for sc in scrapes.iter_mut() {
                    sc.series.retain(|x| series_consumed(&x.name));
                }
                Cow::Owned(with_payload(s, Payload::Metrics(scrapes)))
            }
            _ => Cow::Borrowed(s),
        };
        // After trimming (less to walk). Every kind of payload, not only processes:
        // secrets also sit in metrics labels, `/v1/loads` bodies, thread names, stacks.
        let Some(redacted) = self.redacted(trimmed) else {
            return Ok(false);
        };
        let t_ms = redacted.t_ms;
        let every_ms = (min > 0).then_some(min);
        if self.policy.compact {
            // Rotation resets the delta base: check before encoding.
            if let Target::Dir { policy, .. } = &self.target {
                if self.bytes > 0 && self.bytes >= policy.max_segment_bytes {
                    self.rotate(t_ms)?;
                }
            }
            let rec = self.delta.encode(&redacted, every_ms)?;
            self.write_raw(&rec)?;
        } else {
            self.write(&Record::Sample {
                sample: redacted,
                every_ms,
            })?;
        }
        self.last_written.insert(kind, t_ms);
        Ok(true)
    }

    /// Appends a sample read back from a recording as it was recorded (no cadence, no
    /// trimming, `every_ms` kept), redacted again: an excerpt is an output of its own.
    pub fn write_recorded(&mut self, s: &Sample, every_ms: Option<i64>) -> Result<()> {
        let Some(redacted) = self.redacted(Cow::Borrowed(s)) else {
            return Ok(());
        };
        if !self.policy.compact {
            return self.write(&Record::Sample {
                sample: redacted,
                every_ms,
            });
        }
        let rec = self.delta.encode(&redacted, every_ms)?;
        self.write_raw(&rec)
    }

    /// Bytes written to the current file so far (compressed, as on the disk).
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// The sample as it may leave. A socket table is the kernel's binary records formatted by
    /// us (no text any process chose), so only its free text (notes, the status's reason) is
    /// redacted; every other payload goes through the redactor's JSON walk.
    fn redacted(&mut self, s: Cow<'_, Sample>) -> Option<Sample> {
        if !matches!(s.payload, Payload::Sockets(_)) {
            return self.redactor.redact_typed(s.as_ref());
        }
        let mut s = s.into_owned();
        if let Some(r) = s.status.reason.as_mut() {
            *r = self.redactor.text(r);
        }
        if let Payload::Sockets(table) = &mut s.payload {
            for n in table.notes.iter_mut() {
                *n = self.redactor.text(n);
            }
        }
        Some(s)
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
        self.progress.reset();
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

    /// Ends the file (its gzip trailer) and syncs it to the disk: a file written whole, as
    /// an excerpt is, ends cleanly.
    pub fn finish(self) -> Result<()> {
        let p = self.path();
        match self.sink.finish().map_err(|e| Error::io(&p, e))? {
            Some(f) => f.sync_all().map_err(|e| Error::io(&p, e)),
            None => Ok(()),
        }
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
