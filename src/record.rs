//! Recordings: append-only segment files of samples, topology changes and baselines, which
//! replay through the same correlator and detectors.
//!
//! Format: one record per line, `<crc32 of the JSON, 8 hex digits> <JSON>\n`. A crash
//! mid-write leaves a line without its newline or with a wrong checksum; readers skip such
//! lines (counting them) and go on, so everything up to the last whole record replays.
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
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};

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
}

impl Record {
    pub fn t_ms(&self) -> Millis {
        match self {
            Record::Header { t_ms, .. } | Record::Topology { t_ms, .. } => *t_ms,
            Record::Sample { sample } => sample.t_ms,
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
    let n = name.to_ascii_uppercase();
    [
        "KEY",
        "TOKEN",
        "SECRET",
        "PASSWORD",
        "PASSWD",
        "CREDENTIAL",
        "AUTH",
        "COOKIE",
        "PRIVATE",
    ]
    .iter()
    .any(|w| n.contains(w))
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
            let env = p
                .env
                .clone()
                .unwrap_or_default()
                .into_iter()
                .map(|(k, v)| {
                    if is_secret_name(&k) {
                        let masked = format!("<redacted:{:08x}>", crc32(v.as_bytes()));
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
                cmdline: p.cmdline.clone().unwrap_or_default(),
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
                    before: b,
                    after: a,
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
    file: File,
    bytes: u64,
    seq: u64,
    last_topology: Option<Record>,
    last_baseline: Option<Record>,
    pid: i32,
    tool: String,
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
        let mut w = RecordingWriter {
            target: Target::File(path.to_path_buf()),
            file,
            bytes,
            seq: 0,
            last_topology: None,
            last_baseline: None,
            pid: std::process::id() as i32,
            tool: format!("wedgewatch {}", env!("CARGO_PKG_VERSION")),
        };
        w.write_header(now_ms)?;
        Ok(w)
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
        let mut w = RecordingWriter {
            target: Target::Dir {
                dir: dir.to_path_buf(),
                policy,
            },
            file,
            bytes: 0,
            seq,
            last_topology: None,
            last_baseline: None,
            pid: std::process::id() as i32,
            tool: format!("wedgewatch {}", env!("CARGO_PKG_VERSION")),
        };
        w.write_header(now_ms)?;
        w.prune()?;
        Ok(w)
    }

    fn write_header(&mut self, now_ms: Millis) -> Result<()> {
        let h = Record::Header {
            version: RECORDING_VERSION,
            t_ms: now_ms,
            pid: self.pid,
            tool: self.tool.clone(),
        };
        self.write_raw(&h)
    }

    fn write_raw(&mut self, rec: &Record) -> Result<()> {
        let line = encode(rec)?;
        // One write per record: a crash leaves at most one partial line at the tail.
        self.file
            .write_all(&line)
            .map_err(|e| Error::io(self.path(), e))?;
        self.bytes += line.len() as u64;
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
            Record::Baseline { .. } => self.last_baseline = Some(rec.clone()),
            _ => {}
        }
        self.write_raw(rec)
    }

    pub fn write_sample(&mut self, s: &Sample) -> Result<()> {
        self.write(&Record::Sample { sample: s.clone() })
    }

    fn rotate(&mut self, now_ms: Millis) -> Result<()> {
        let Target::Dir { dir, .. } = &self.target else {
            return Ok(());
        };
        self.seq += 1;
        let path = dir.join(segment_name(self.seq));
        self.file.flush().map_err(|e| Error::io(&path, e))?;
        self.file = open_append(&path)?;
        self.bytes = 0;
        self.write_header(now_ms)?;
        // A segment must replay on its own: carry the context forward.
        if let Some(t) = self.last_topology.clone() {
            self.write_raw(&t)?;
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

    /// Flushes to the OS (records are written unbuffered; this is for fsync-minded callers).
    pub fn sync(&mut self) -> Result<()> {
        let p = self.path();
        self.file.sync_data().map_err(|e| Error::io(p, e))
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

    /// Every whole record, in file order; truncated or corrupt lines are skipped and counted.
    pub fn read(&self) -> Result<(Vec<Record>, ReadStats)> {
        let mut out = Vec::new();
        let mut stats = ReadStats::default();
        for f in &self.files {
            let file = File::open(f).map_err(|e| Error::io(f, e))?;
            let mut r = BufReader::new(file);
            let mut buf = Vec::new();
            loop {
                buf.clear();
                let n = r.read_until(b'\n', &mut buf).map_err(|e| Error::io(f, e))?;
                if n == 0 {
                    break;
                }
                let complete = buf.last() == Some(&b'\n');
                let line = if complete {
                    &buf[..buf.len() - 1]
                } else {
                    &buf[..]
                };
                match (complete, decode(line)) {
                    (true, Some(rec)) => {
                        stats.records += 1;
                        out.push(rec);
                    }
                    _ => stats.skipped += 1,
                }
            }
        }
        Ok((out, stats))
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
    let (records, stats) = rec.read()?;
    let mut model = Model::new(thresholds);
    model.ignore_client_pids.clear();
    let mut baselines: Vec<Baseline> = Vec::new();
    let mut last = None;
    for r in records {
        if at.is_some_and(|a| r.t_ms() > a) {
            // Headers/context re-written at rotation carry the rotation time; only samples
            // define the timeline, so stop at the first sample past `at`.
            if matches!(r, Record::Sample { .. }) {
                break;
            }
            continue;
        }
        match r {
            Record::Header { pid, .. } => {
                if !model.ignore_client_pids.contains(&pid) {
                    model.ignore_client_pids.push(pid);
                }
            }
            Record::Topology { topology, .. } => model.set_topology(topology),
            Record::Baseline { baseline } => {
                if baselines.last() != Some(&baseline) {
                    baselines.push(baseline);
                }
            }
            Record::Sample { sample } => {
                last = Some(last.map_or(sample.t_ms, |l: Millis| l.max(sample.t_ms)));
                model.ingest(&sample);
            }
        }
    }
    if let Some(first) = baselines.first() {
        let merged = baselines
            .iter()
            .skip(1)
            .fold(first.clone(), |acc, b| acc.merged(b));
        model.set_config_changes(first.changes_to(&merged));
    }
    let at_ms = at.or(last).unwrap_or(0);
    Ok(Replayed {
        model,
        baselines,
        stats,
        at_ms,
    })
}

/// `record -o FILE --for DURATION`: writes samples from the sampler's channel until
/// `duration_ms` of the clock has passed or the channel closes. Returns samples written.
pub async fn record_for(
    rx: &mut tokio::sync::mpsc::Receiver<Sample>,
    writer: &mut RecordingWriter,
    clock: &dyn Clock,
    duration_ms: i64,
    topology: &Topology,
) -> Result<u64> {
    let end = clock.now_ms() + duration_ms;
    writer.write(&Record::Topology {
        t_ms: clock.now_ms(),
        topology: topology.clone(),
    })?;
    let mut n = 0;
    while clock.now_ms() < end {
        let left = (end - clock.now_ms()).max(0) as u64;
        match tokio::time::timeout(std::time::Duration::from_millis(left), rx.recv()).await {
            Ok(Some(s)) => {
                writer.write_sample(&s)?;
                n += 1;
            }
            Ok(None) | Err(_) => break,
        }
    }
    Ok(n)
}
