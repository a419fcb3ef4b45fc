//! Reading recordings: files and segment directories as streams of records.

use super::gz;
use super::{decode, segments, DeltaState, Record};
use crate::clock::Millis;
use crate::error::{Error, Result};
use std::io::BufRead;
use std::path::Path;
use std::path::PathBuf;

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

/// Time of the first record (for relative `--at`), without reading past it.
pub fn first_record_ms(rec: &Recording) -> Option<Millis> {
    rec.records().find_map(|r| r.ok()).map(|r| r.t_ms())
}
