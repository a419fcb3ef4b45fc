//! Recordings: append-only segment files of samples, topology changes and baselines, which
//! replay through the same correlator and detectors.
//!
//! Format: one record per line, `<crc32 of the JSON, 8 hex digits> <JSON>\n`, gzip-framed
//! by default ([`gz`]). A line torn by a crash fails its checksum; readers skip it (counted)
//! and go on. A recording is one file (`record -o FILE`) or a directory of size-rotated
//! segments (`seg-00000001.wwrec`, ...), each starting with a header, the topology and the
//! baseline, so it replays on its own.

use crate::clock::Millis;
use crate::error::Result;
use crate::model::{Sample, Topology};
use serde::{Deserialize, Serialize};

mod baseline;
mod delta;
mod excerpt;
mod gz;
mod inflate;
mod jitter;
mod progress;
mod read;
mod recording;
mod replay;
mod to_file;
mod writer;

pub use baseline::Baseline;
pub use delta::{apply_json, diff_json, DeltaState, KEYFRAME_EVERY};
pub use excerpt::{write_excerpt, Excerpt};
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
        /// The node recorded, with its clocks when this segment began
        /// (machine-id hashed, as in a redacted snapshot); absent in older recordings.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        node: Option<crate::model::NodeIdentity>,
    },
    Sample {
        sample: Sample,
        /// The recording's cadence for this kind when it was written: at most one sample
        /// per this many ms, so what happened between two (a connection opened and closed)
        /// is not recorded. Absent: every sample, or a writer that did not say.
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

/// CRC-32 (IEEE). `crc32fast`, not a bitwise loop: a big node's socket table is hundreds of
/// KB of JSON every few seconds, checked twice (its state and its record line).
pub fn crc32(data: &[u8]) -> u32 {
    crc32fast::hash(data)
}

/// CRC-32 of a value's JSON (the bytes `serde_json::to_vec` writes), without keeping them.
pub fn crc32_json<T: Serialize + ?Sized>(v: &T) -> serde_json::Result<u32> {
    let mut w = CrcWriter(crc32fast::Hasher::new());
    serde_json::to_writer(&mut w, v)?;
    Ok(w.0.finalize())
}

/// Feeds what is written to a CRC.
struct CrcWriter(crc32fast::Hasher);

impl std::io::Write for CrcWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.update(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Encodes one record as a line: the JSON written once, in place after room for its CRC.
pub fn encode(rec: &Record) -> Result<Vec<u8>> {
    let mut line = b"00000000 ".to_vec();
    serde_json::to_writer(&mut line, rec)?;
    let crc = format!("{:08x}", crc32(&line[9..]));
    line[..8].copy_from_slice(crc.as_bytes());
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The bitwise CRC-32 the format was defined with: the recordings already written carry it.
    fn bitwise_crc32(data: &[u8]) -> u32 {
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

    #[test]
    fn the_crc_is_the_one_recordings_were_written_with() {
        assert_eq!(crc32(b"123456789"), 0xCBF4_3926);
        let data: Vec<u8> = (0..5000u32).map(|i| (i * 7 + i / 13) as u8).collect();
        for len in [0, 1, 3, 64, 65, 4999, 5000] {
            assert_eq!(crc32(&data[..len]), bitwise_crc32(&data[..len]), "{len}");
        }
        let v = serde_json::json!({"a": [1, 2.5, "x\u{e9}"], "b": null});
        let bytes = serde_json::to_vec(&v).unwrap();
        assert_eq!(crc32_json(&v).unwrap(), bitwise_crc32(&bytes));
    }

    #[test]
    fn an_encoded_line_decodes_and_a_flipped_byte_does_not() {
        let rec = Record::Header {
            version: 1,
            t_ms: 1_795_963_800_000,
            pid: 4242,
            tool: "wedgewatch test".into(),
            node: None,
        };
        let line = encode(&rec).unwrap();
        assert_eq!(line.last(), Some(&b'\n'));
        let body = &line[..line.len() - 1];
        assert!(decode(body).is_some());
        let mut bad = body.to_vec();
        let last = bad.len() - 2;
        bad[last] ^= 1;
        assert!(decode(&bad).is_none());
    }
}
