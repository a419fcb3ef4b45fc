//! The recording reader: a pure function of the bytes ([`read_records`]), streaming, in
//! memory bounded by [`ReadLimits`] whatever the input (recordings come from strangers). It
//! holds at most one line and a window of compressed bytes, reads every byte once, and
//! reports everything it skipped in [`ReadStats`].

use super::inflate::{self, MemberStats, Members};
use super::{decode, DeltaState, Record};
use std::io::{self, BufRead, BufReader, Chain, Cursor, Read};

/// Generous for real records (a big stack's stays in the low tens of MiB).
pub const DEFAULT_MAX_LINE_BYTES: usize = 64 << 20;
/// The longest first line looked at for a header record.
const HEADER_LINE_MAX: usize = 64 << 10;
/// How much of a file's start is looked at to tell what it is.
const SNIFF_BYTES: u64 = 4096;
/// Read buffer of the line splitter; also the inflater's output per call (at least the
/// deflate window, so a failing call never keeps decoded bytes back).
const READ_BUF: usize = 64 << 10;

/// A line of tiny values (`[0,0,...]`) decodes to some 200 bytes of heap per value, so the
/// value count, not the length, bounds what a hostile line costs (about 400 MiB at this
/// default).
pub const DEFAULT_MAX_LINE_VALUES: usize = 2 << 20;

/// Bounds on what the reader holds in memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReadLimits {
    /// A longer line is skipped (counted in [`ReadStats::oversized`]) without being held.
    pub max_line_bytes: usize,
    /// A line with more JSON values (counted as `,` `:` `[` `{` bytes, an upper bound) is
    /// skipped before it is parsed (counted in [`ReadStats::oversized`]).
    pub max_line_values: usize,
}

impl Default for ReadLimits {
    fn default() -> Self {
        ReadLimits {
            max_line_bytes: DEFAULT_MAX_LINE_BYTES,
            max_line_values: DEFAULT_MAX_LINE_VALUES,
        }
    }
}

/// What reading found and skipped.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReadStats {
    pub records: u64,
    /// Lines that were truncated or failed their checksum.
    pub skipped: u64,
    /// Delta records whose base was lost with a skipped line (until the next keyframe).
    pub undecodable: u64,
    /// Lines over [`ReadLimits::max_line_bytes`] (skipped unread) or
    /// [`ReadLimits::max_line_values`] (skipped unparsed).
    pub oversized: u64,
    /// Gzip members given up part-way (damaged, or torn by a crash).
    pub damaged_members: u64,
    /// Bytes outside any gzip member (garbage between or after members).
    pub stray_bytes: u64,
}

impl ReadStats {
    pub fn add(&mut self, o: &ReadStats) {
        self.records += o.records;
        self.skipped += o.skipped;
        self.undecodable += o.undecodable;
        self.oversized += o.oversized;
        self.damaged_members += o.damaged_members;
        self.stray_bytes += o.stray_bytes;
    }

    /// A few words saying what was skipped (for a header), or None for a clean read.
    pub fn brief(&self) -> Option<String> {
        let records = self.skipped + self.oversized + self.undecodable;
        let parts: Vec<String> = [
            (records, "record(s)"),
            (self.damaged_members, "gzip member(s)"),
            (self.stray_bytes, "stray byte(s)"),
        ]
        .into_iter()
        .filter(|(n, _)| *n > 0)
        .map(|(n, what)| format!("{n} {what}"))
        .collect();
        (!parts.is_empty()).then(|| format!("recording damaged: skipped {}", parts.join(", ")))
    }

    /// One line saying what was skipped, or None for a clean read.
    pub fn summary(&self) -> Option<String> {
        let parts: Vec<String> = [
            (self.skipped, "damaged record(s) skipped"),
            (self.oversized, "oversized line(s) skipped"),
            (self.damaged_members, "damaged gzip member(s) skipped"),
            (self.stray_bytes, "stray byte(s) skipped"),
            (
                self.undecodable,
                "sample(s) not rebuilt (their delta base was lost)",
            ),
        ]
        .into_iter()
        .filter(|(n, _)| *n > 0)
        .map(|(n, what)| format!("{n} {what}"))
        .collect();
        (!parts.is_empty()).then(|| parts.join(", "))
    }
}

// Defined with the crate's error, which carries it, below every layer that reads recordings.
pub use crate::error::NotARecording;

#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error(transparent)]
    NotARecording(#[from] NotARecording),
    #[error(transparent)]
    Io(#[from] io::Error),
}

/// Reads a recording's records from `input`: deltas come back as whole samples, damage
/// is skipped and counted ([`Records::stats`]). Fails only when the bytes are not a
/// recording: a recording starts with a gzip member as the writer frames it, or with a
/// header record.
pub fn read_records<R: Read>(mut input: R, limits: ReadLimits) -> Result<Records<R>, ReadError> {
    let mut head = Vec::new();
    (&mut input).take(SNIFF_BYTES).read_to_end(&mut head)?;
    let gzip = what_is(&head)?;
    let bytes = Cursor::new(head).chain(input);
    let source = if gzip {
        Source::Gz(Members::new(bytes))
    } else {
        Source::Plain(bytes)
    };
    // A header line is short: do not read far into something else looking for it.
    let mut lines = LineReader::new(source, limits.max_line_bytes.min(HEADER_LINE_MAX));
    let first = if gzip {
        None
    } else {
        match lines.read_line(false)? {
            Some(Line::Whole) => match decode(&lines.line) {
                Some(h @ Record::Header { .. }) => Some(h),
                _ => return Err(NotARecording::NoHeader.into()),
            },
            _ => return Err(NotARecording::NoHeader.into()),
        }
    };
    lines.max = limits.max_line_bytes;
    Ok(Records {
        lines,
        max_values: limits.max_line_values,
        first,
        delta: DeltaState::default(),
        stats: ReadStats::default(),
        failed: false,
    })
}

/// Whether a file starting with `head` is gzip-framed, or what it is instead of a recording.
fn what_is(head: &[u8]) -> Result<bool, NotARecording> {
    if head.is_empty() {
        return Err(NotARecording::Empty);
    }
    if head.starts_with(&[0x1f, 0x8b]) {
        return if inflate::is_member(head) {
            Ok(true)
        } else {
            Err(NotARecording::ForeignGzip)
        };
    }
    // A record line starts with its checksum in hex; JSON with a brace.
    if head.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'{') {
        let marker = b"\"wedgewatch.snapshot/";
        let snapshot = head.windows(marker.len()).any(|w| w == marker);
        return Err(if snapshot {
            NotARecording::Snapshot
        } else {
            NotARecording::Json
        });
    }
    Ok(false)
}

enum Source<R> {
    Plain(Chain<Cursor<Vec<u8>>, R>),
    Gz(Members<Chain<Cursor<Vec<u8>>, R>>),
}

impl<R: Read> Read for Source<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Source::Plain(r) => r.read(buf),
            Source::Gz(m) => m.read(buf),
        }
    }
}

/// The records of one recording stream; see [`read_records`].
pub struct Records<R> {
    lines: LineReader<Source<R>>,
    max_values: usize,
    /// The header, read while checking the stream is a recording.
    first: Option<Record>,
    delta: DeltaState,
    stats: ReadStats,
    failed: bool,
}

impl<R: Read> Records<R> {
    /// What was read and skipped so far.
    pub fn stats(&self) -> ReadStats {
        let m = match self.lines.src.get_ref() {
            Source::Gz(m) => m.stats,
            Source::Plain(_) => MemberStats::default(),
        };
        ReadStats {
            damaged_members: m.damaged,
            stray_bytes: m.stray_bytes,
            ..self.stats.clone()
        }
    }

    /// A whole line's record, if it is one (deltas turned back into samples).
    fn record(&mut self) -> Option<Record> {
        let structural = |b: &u8| matches!(b, b',' | b':' | b'[' | b'{');
        if self.lines.line.iter().filter(|b| structural(b)).count() > self.max_values {
            self.stats.oversized += 1;
            return None;
        }
        let Some(rec) = decode(&self.lines.line) else {
            self.stats.skipped += 1;
            return None;
        };
        let rec = match rec {
            Record::Delta { every_ms, .. } => match self.delta.decode(rec) {
                Some(sample) => Record::Sample { sample, every_ms },
                None => {
                    self.stats.undecodable += 1;
                    return None;
                }
            },
            // A new writer (a file appended to after a restart) starts with keyframes:
            // never patch its samples onto the previous writer's.
            Record::Header { .. } => {
                self.delta.reset();
                rec
            }
            other => other,
        };
        self.stats.records += 1;
        Some(rec)
    }
}

impl<R: Read> Iterator for Records<R> {
    type Item = Result<Record, ReadError>;

    /// An I/O error ends the stream after yielding it.
    fn next(&mut self) -> Option<Self::Item> {
        if let Some(h) = self.first.take() {
            self.stats.records += 1;
            return Some(Ok(h));
        }
        while !self.failed {
            match self.lines.next_line() {
                Err(e) => {
                    self.failed = true;
                    return Some(Err(e.into()));
                }
                Ok(None) => return None,
                Ok(Some(Line::Whole)) => {
                    if let Some(rec) = self.record() {
                        return Some(Ok(rec));
                    }
                }
                Ok(Some(Line::Torn)) => self.stats.skipped += 1,
                Ok(Some(Line::TooLong)) => self.stats.oversized += 1,
            }
        }
        None
    }
}

/// What [`LineReader::next_line`] found; a whole line's bytes are in `line`.
enum Line {
    Whole,
    /// The end of the input without a line break (a torn tail).
    Torn,
    /// Longer than the cap: skipped, not held.
    TooLong,
}

/// Splits a stream into lines of at most `max` bytes.
struct LineReader<R> {
    src: BufReader<R>,
    line: Vec<u8>,
    max: usize,
}

impl<R: Read> LineReader<R> {
    fn new(src: R, max: usize) -> LineReader<R> {
        LineReader {
            src: BufReader::with_capacity(READ_BUF, src),
            line: Vec::new(),
            max,
        }
    }

    fn next_line(&mut self) -> io::Result<Option<Line>> {
        self.read_line(true)
    }

    /// The next line; one over the cap is read to its end (and dropped) when `skip_long`,
    /// else left where the cap was hit.
    fn read_line(&mut self, skip_long: bool) -> io::Result<Option<Line>> {
        self.line.clear();
        let mut too_long = false;
        loop {
            let chunk = match self.src.fill_buf() {
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                other => other?,
            };
            if chunk.is_empty() {
                return Ok(match (too_long, self.line.is_empty()) {
                    (true, _) => Some(Line::TooLong),
                    (false, true) => None,
                    (false, false) => Some(Line::Torn),
                });
            }
            // `contains` is memchr: fast over the long stretches of a long line.
            let newline = if chunk.contains(&b'\n') {
                chunk.iter().position(|b| *b == b'\n')
            } else {
                None
            };
            let part = &chunk[..newline.unwrap_or(chunk.len())];
            if !too_long && self.line.len() + part.len() > self.max {
                too_long = true;
                self.line.clear();
                if !skip_long {
                    return Ok(Some(Line::TooLong));
                }
            }
            if !too_long {
                let want = self.line.len() + part.len();
                if want > self.line.capacity() {
                    // Powers of two up to the cap: growing copies, so the peak is the
                    // last two sizes (1.5 times a power-of-two cap), never more.
                    // (`max` below `READ_BUF` is a small configured cap, not a bigger buffer.)
                    let ceiling = self.max.max(want);
                    let to = want
                        .next_power_of_two()
                        .max(READ_BUF.min(ceiling))
                        .min(ceiling);
                    self.line.reserve_exact(to - self.line.len());
                }
                self.line.extend_from_slice(part);
            }
            let used = newline.map_or(chunk.len(), |i| i + 1);
            self.src.consume(used);
            if newline.is_some() {
                return Ok(Some(if too_long { Line::TooLong } else { Line::Whole }));
            }
        }
    }
}
