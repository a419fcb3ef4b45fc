//! An excerpt of a recording: the records of a time span, written as a recording file of
//! its own (the daemon's incident bundles carry the minutes before an incident this way).
//!
//! The excerpt replays on its own: it starts with the topology and baselines in force at its
//! first record, as a rotated segment does. Only the segments that can hold the span are
//! read, one record at a time; records are redacted again on the way out.

use super::{first_record_ms, segments, Record, RecordPolicy, Recording, RecordingWriter};
use crate::clock::Millis;
use crate::error::Result;
use std::path::{Path, PathBuf};

/// What an excerpt holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Excerpt {
    /// The first and last sample's time (None: no sample in the span).
    pub first_ms: Option<Millis>,
    pub last_ms: Option<Millis>,
    pub samples: u64,
    /// Bytes of the file written.
    pub bytes: u64,
    /// Stopped at `max_bytes`: the span's later records are missing.
    pub cut: bool,
}

/// The context a record needs to replay: the newest topology, the first and the newest
/// baseline.
#[derive(Debug, Default)]
struct Context {
    topology: Option<Record>,
    first_baseline: Option<Record>,
    last_baseline: Option<Record>,
}

impl Context {
    fn keep(&mut self, r: Record) {
        match r {
            Record::Topology { .. } => self.topology = Some(r),
            Record::Baseline { .. } => {
                if self.first_baseline.is_none() {
                    self.first_baseline = Some(r.clone());
                }
                self.last_baseline = Some(r);
            }
            _ => {}
        }
    }

    fn records(self) -> impl Iterator<Item = Record> {
        let last = self
            .last_baseline
            .filter(|l| Some(l) != self.first_baseline.as_ref());
        self.topology
            .into_iter()
            .chain(self.first_baseline)
            .chain(last)
    }
}

/// The segments of the recording directory `dir` that can hold records from `since_ms` on:
/// the newest one that starts at or before it, and every newer one.
fn segments_from(dir: &Path, since_ms: Millis) -> Result<Vec<PathBuf>> {
    let all: Vec<PathBuf> = segments(dir)?.into_iter().map(|(_, p)| p).collect();
    let starts_before = |p: &PathBuf| {
        let one = Recording {
            files: vec![p.clone()],
        };
        first_record_ms(&one).is_some_and(|t| t <= since_ms)
    };
    let from = all.iter().rposition(starts_before).unwrap_or(0);
    Ok(all[from..].to_vec())
}

/// Writes the records of the recording directory `dir` from `since_ms` to `until_ms`
/// (sample times) into the new file `to`, at most about `max_bytes` of it.
pub fn write_excerpt(
    dir: &Path,
    since_ms: Millis,
    until_ms: Millis,
    to: &Path,
    max_bytes: u64,
) -> Result<Excerpt> {
    let source = Recording {
        files: segments_from(dir, since_ms)?,
    };
    // The header's time is where `--at` offsets count from: the span's start.
    let mut w = RecordingWriter::create_file(to, since_ms)?;
    w.policy = RecordPolicy::default();
    let mut ctx = Some(Context::default());
    let mut out = Excerpt::default();
    for rec in source.records() {
        let rec = rec?;
        let (t, sample) = (rec.t_ms(), matches!(rec, Record::Sample { .. }));
        if matches!(rec, Record::Header { .. }) {
            continue;
        }
        // Before the span's first sample, everything else is context.
        if let Some(c) = ctx.as_mut().filter(|_| !sample || t < since_ms) {
            c.keep(rec);
            continue;
        }
        if t > until_ms || sample && t < since_ms {
            continue;
        }
        if let Some(c) = ctx.take() {
            for r in c.records() {
                w.write(&r)?;
            }
        }
        match &rec {
            Record::Sample { sample, every_ms } => {
                w.write_recorded(sample, *every_ms)?;
                out.first_ms.get_or_insert(t);
                out.last_ms = Some(t);
                out.samples += 1;
            }
            other => w.write(other)?,
        }
        if w.bytes() > max_bytes {
            out.cut = true;
            break;
        }
    }
    let written = w.bytes();
    w.finish()?;
    // with the file's gzip trailer
    out.bytes = std::fs::symlink_metadata(to).map_or(written, |m| m.len());
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Payload, Sample, SourceStatus, Topology};
    use crate::record::RotationPolicy;

    fn gpu_sample(t: Millis) -> Sample {
        Sample {
            t_ms: t,
            status: SourceStatus::ok(),
            took_ms: 1,
            payload: Payload::Gpu(Default::default()),
        }
    }

    /// A rotated recording of one GPU sample a second from 0 to 599 s, in small segments.
    fn recording(dir: &Path) {
        let policy = RotationPolicy {
            max_segment_bytes: 2_000,
            keep_segments: 1_000,
        };
        let mut w = RecordingWriter::create_dir(dir, policy, 0).expect("writer");
        w.write(&Record::Topology {
            t_ms: 0,
            topology: Topology::default(),
        })
        .expect("topology");
        for s in 0..600 {
            w.write_sample(&gpu_sample(s * 1_000)).expect("sample");
        }
    }

    fn samples(path: &Path) -> Vec<Millis> {
        let (recs, stats) = Recording::open(path).expect("open").read().expect("read");
        assert_eq!(stats.skipped, 0, "{stats:?}");
        assert!(
            matches!(recs.get(1), Some(Record::Topology { .. })),
            "the excerpt starts with its context: {:?}",
            recs.get(1)
        );
        recs.iter()
            .filter_map(|r| match r {
                Record::Sample { sample, .. } => Some(sample.t_ms),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn an_excerpt_holds_the_span_and_replays_on_its_own() {
        let tmp = tempfile::tempdir().expect("tmp");
        let rec = tmp.path().join("recording");
        recording(&rec);
        assert!(segments(&rec).expect("segs").len() > 5, "rotated");
        let to = tmp.path().join("excerpt.wwrec");
        let e = write_excerpt(&rec, 300_000, 420_000, &to, 1 << 20).expect("excerpt");
        let got = samples(&to);
        assert_eq!(got.first(), Some(&300_000));
        assert_eq!(got.last(), Some(&420_000));
        assert_eq!(got.len(), 121);
        assert_eq!(e.samples, 121);
        assert_eq!((e.first_ms, e.last_ms), (Some(300_000), Some(420_000)));
        assert!(!e.cut);
        assert_eq!(e.bytes, std::fs::metadata(&to).expect("stat").len());
    }

    #[test]
    fn an_excerpt_stops_at_its_byte_bound_and_says_so() {
        let tmp = tempfile::tempdir().expect("tmp");
        let rec = tmp.path().join("recording");
        recording(&rec);
        let to = tmp.path().join("excerpt.wwrec");
        let e = write_excerpt(&rec, 0, 600_000, &to, 1_000).expect("excerpt");
        assert!(e.cut && e.samples < 600, "{e:?}");
        assert!(e.bytes < 3_000, "{e:?}");
        assert_eq!(samples(&to).len() as u64, e.samples);
    }
}
