//! Recordings on disk: one file, or a directory of rotated segments, read through
//! [`read_records`] one file after the other.

use super::read::{read_records, NotARecording, ReadError, ReadLimits, ReadStats, Records};
use super::{segments, Record};
use crate::clock::Millis;
use crate::error::{Error, Result};
use std::fs::File;
use std::path::{Path, PathBuf};

/// A recording opened for reading.
#[derive(Debug, Clone)]
pub struct Recording {
    pub files: Vec<PathBuf>,
}

fn file_error(path: &Path, e: ReadError) -> Error {
    match e {
        ReadError::NotARecording(why) => Error::NotARecording {
            path: path.to_path_buf(),
            why,
        },
        ReadError::Io(e) => Error::io(path, e),
    }
}

/// Opens one file as a recording stream (checking that it is one).
fn open_file(path: &Path, limits: ReadLimits) -> Result<Records<File>> {
    let f = crate::safe_fs::open_input(path)?;
    read_records(f, limits).map_err(|e| file_error(path, e))
}

impl Recording {
    /// A file, or a directory of segments; refused when it is not a recording.
    pub fn open(path: &Path) -> Result<Recording> {
        let files = if crate::safe_fs::is_input_dir(path) {
            let s = segments(path)?;
            if s.is_empty() {
                // any entry of that name (a FIFO too): the snapshot reader says what is wrong
                if std::fs::symlink_metadata(path.join("snapshot.json")).is_ok() {
                    return Err(Error::NotARecording {
                        path: path.to_path_buf(),
                        why: NotARecording::Snapshot,
                    });
                }
                return Err(Error::Other(format!(
                    "{}: no recording segments (seg-*.wwrec) in this directory",
                    path.display()
                )));
            }
            s.into_iter().map(|(_, p)| p).collect()
        } else {
            vec![path.to_path_buf()]
        };
        for f in &files {
            open_file(f, ReadLimits::default())?;
        }
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
        Ok((out, it.stats()))
    }

    /// Streams the records (deltas already turned back into samples), one line in memory
    /// at a time. An error ends the stream after yielding it.
    pub fn records(&self) -> RecordIter {
        self.records_with(ReadLimits::default())
    }

    pub fn records_with(&self, limits: ReadLimits) -> RecordIter {
        RecordIter {
            files: self.files.clone(),
            next_file: 0,
            current: None,
            finished: ReadStats::default(),
            limits,
            failed: false,
        }
    }
}

/// Iterator over a recording's records, file after file.
pub struct RecordIter {
    files: Vec<PathBuf>,
    next_file: usize,
    current: Option<(PathBuf, Records<File>)>,
    /// What the files already read skipped.
    finished: ReadStats,
    limits: ReadLimits,
    failed: bool,
}

impl RecordIter {
    /// What was read and skipped so far.
    pub fn stats(&self) -> ReadStats {
        let mut s = self.finished.clone();
        if let Some((_, r)) = &self.current {
            s.add(&r.stats());
        }
        s
    }
}

impl Iterator for RecordIter {
    type Item = Result<Record>;

    fn next(&mut self) -> Option<Result<Record>> {
        while !self.failed {
            let Some((path, records)) = self.current.as_mut() else {
                let f = self.files.get(self.next_file)?.clone();
                self.next_file += 1;
                // Delta bases never cross a file: each starts with keyframes.
                match open_file(&f, self.limits) {
                    Ok(r) => self.current = Some((f, r)),
                    Err(e) => {
                        self.failed = true;
                        return Some(Err(e));
                    }
                }
                continue;
            };
            match records.next() {
                Some(Ok(rec)) => return Some(Ok(rec)),
                Some(Err(e)) => {
                    self.failed = true;
                    return Some(Err(file_error(path, e)));
                }
                None => {
                    self.finished.add(&records.stats());
                    self.current = None;
                }
            }
        }
        None
    }
}

/// Time of the first record (for relative `--at`), without reading past it.
pub fn first_record_ms(rec: &Recording) -> Option<Millis> {
    rec.records().find_map(|r| r.ok()).map(|r| r.t_ms())
}
