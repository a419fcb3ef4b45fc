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

use crate::clock::Millis;
use crate::error::Result;
use crate::model::{Sample, Topology};
use serde::{Deserialize, Serialize};

mod baseline;
mod delta;
mod gz;
mod inflate;
mod jitter;
mod progress;
mod read;
mod recording;
mod replay;
mod to_file;
mod writer;

pub use crate::model::ComponentFacts;
pub use baseline::{is_secret_name, Baseline};
pub use delta::{apply_json, diff_json, DeltaState, KEYFRAME_EVERY};
pub use read::{
    read_records, NotARecording, ReadError, ReadLimits, ReadStats, Records, DEFAULT_MAX_LINE_BYTES,
    DEFAULT_MAX_LINE_VALUES,
};
pub use recording::{first_record_ms, RecordIter, Recording};
pub use replay::{parse_at, replay, Replayed, Replayer};
pub use to_file::record_samples;
pub use writer::{
    create_private_dir, segments, trim_sockets, RecordPolicy, RecordingWriter, RotationPolicy,
};

pub const RECORDING_VERSION: u32 = 1;

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
        /// Added (issue 14): the node recorded, with its clocks when this segment began
        /// (machine-id hashed, as in a redacted snapshot); absent in older recordings.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        node: Option<crate::model::NodeIdentity>,
    },
    Sample {
        sample: Sample,
        /// The recording's cadence for this kind when it was written (added with the calm
        /// cadence, issue 15): at most one sample per this many ms, so what happened between
        /// two of them (a connection opened and closed) is not in the recording. Absent: every
        /// sample, or a writer that did not say.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        every_ms: Option<i64>,
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
        /// As a sample's `every_ms`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        every_ms: Option<i64>,
    },
}

impl Record {
    pub fn t_ms(&self) -> Millis {
        match self {
            Record::Header { t_ms, .. } | Record::Topology { t_ms, .. } => *t_ms,
            Record::Sample { sample, .. } => sample.t_ms,
            Record::Delta { t_ms, .. } => *t_ms,
            Record::Baseline { baseline } => baseline.t_ms,
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
