//! Gzip framing of recording files: one deflate stream across records (neighbours share most
//! keys and values), with the crash tolerance of plain lines:
//! - every record is followed by a sync flush, so whole records are on disk and readable the
//!   moment `write` returns; a crash tears at most the one being written;
//! - a new gzip member, its header naming `wwrec`, starts every [`MEMBER_BYTES`] of input, so
//!   damage loses one member and the reader resynchronises on the next ([`super::inflate`]).

use flate2::write::GzEncoder;
use flate2::{Compression, GzBuilder};
use std::fs::File;
use std::io::{self, Write};

/// Start a new member after this much uncompressed input.
pub(crate) const MEMBER_BYTES: u64 = 1 << 20;
/// gzip ID1 ID2, deflate, FNAME set: how every member we write begins.
pub(crate) const MAGIC: [u8; 4] = [0x1f, 0x8b, 0x08, 0x08];
/// gzip header bytes 10..16 as we write them: FNAME "wwrec" and its terminator.
pub(crate) const NAME: &[u8] = b"wwrec\0";

/// Counts the bytes that reach the file (rotation is by size on disk).
#[derive(Debug)]
pub(crate) struct Counting {
    file: File,
    pub(crate) written: u64,
}

impl Write for Counting {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.file.write(buf)?;
        self.written += n as u64;
        Ok(n)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.file.flush()
    }
}

/// Where records go: decided at the first write, after the caller set the policy.
#[derive(Debug)]
pub(crate) enum Sink {
    Fresh(File),
    Plain(File),
    Gz {
        enc: GzEncoder<Counting>,
        member_in: u64,
    },
    /// Only while switching members, or after an I/O error broke the encoder.
    Broken,
}

fn member(c: Counting) -> GzEncoder<Counting> {
    GzBuilder::new()
        .filename("wwrec")
        .write(c, Compression::default())
}

impl Sink {
    /// Appends one encoded record; returns the file's size afterwards.
    pub(crate) fn append(
        &mut self,
        line: &[u8],
        compress: bool,
        size_before: u64,
    ) -> io::Result<u64> {
        let full = matches!(self, Sink::Gz { member_in, .. } if *member_in >= MEMBER_BYTES);
        if full || matches!(self, Sink::Fresh(_)) {
            *self = match std::mem::replace(self, Sink::Broken) {
                Sink::Fresh(file) if compress => Sink::Gz {
                    enc: member(Counting {
                        file,
                        written: size_before,
                    }),
                    member_in: 0,
                },
                Sink::Fresh(file) => Sink::Plain(file),
                // The member is full: end it (its trailer) and start the next.
                Sink::Gz { enc, .. } => Sink::Gz {
                    enc: member(enc.finish()?),
                    member_in: 0,
                },
                other => other,
            };
        }
        match self {
            Sink::Plain(f) => {
                // One write per record: a crash leaves at most one partial line.
                f.write_all(line)?;
                Ok(size_before + line.len() as u64)
            }
            Sink::Gz { enc, member_in } => {
                enc.write_all(line)?;
                enc.flush()?;
                *member_in += line.len() as u64;
                Ok(enc.get_ref().written)
            }
            Sink::Fresh(_) | Sink::Broken => Err(io::Error::other(
                "recording file unusable after an earlier write error",
            )),
        }
    }

    /// Ends the file cleanly (the gzip trailer), e.g. before rotating away from it; the
    /// file, for a caller that syncs it.
    pub(crate) fn finish(self) -> io::Result<Option<std::fs::File>> {
        match self {
            Sink::Gz { enc, .. } => enc.finish().map(|c| Some(c.file)),
            Sink::Fresh(f) | Sink::Plain(f) => Ok(Some(f)),
            Sink::Broken => Ok(None),
        }
    }

    pub(crate) fn sync(&mut self) -> io::Result<()> {
        match self {
            Sink::Fresh(f) | Sink::Plain(f) => f.sync_data(),
            Sink::Gz { enc, .. } => {
                enc.flush()?;
                enc.get_ref().file.sync_data()
            }
            Sink::Broken => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;
    use std::path::Path;

    fn lines(n: usize) -> Vec<String> {
        (0..n)
            .map(|i| {
                format!(
                    "{i:06} {{\"t\":{},\"x\":\"{}\"}}\n",
                    i * 250,
                    "ab".repeat(i % 40)
                )
            })
            .collect()
    }

    /// Writes `lines` gzip-framed; returns the file size after each record.
    fn write(path: &Path, lines: &[String]) -> Vec<u64> {
        let f = File::create(path).unwrap();
        let mut sink = Sink::Fresh(f);
        let mut size = 0;
        let sizes = lines
            .iter()
            .map(|l| {
                size = sink.append(l.as_bytes(), true, size).unwrap();
                size
            })
            .collect();
        std::mem::forget(sink); // as if killed: no trailer
        sizes
    }

    fn read(path: &Path) -> String {
        let mut out = Vec::new();
        let f = File::open(path).unwrap();
        super::super::inflate::Members::new(f)
            .read_to_end(&mut out)
            .unwrap();
        // Damaged members may inflate to any bytes; the reader's lines are checksummed.
        String::from_utf8_lossy(&out).into_owned()
    }

    #[test]
    fn every_record_is_on_disk_when_append_returns_across_members() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("r");
        // Enough input for several members.
        let ls = lines(40_000);
        let sizes = write(&p, &ls);
        assert_eq!(std::fs::metadata(&p).unwrap().len(), *sizes.last().unwrap());
        let data = std::fs::read(&p).unwrap();
        let members = data.windows(MAGIC.len()).filter(|w| *w == MAGIC).count();
        assert!(members >= 2, "{members} members");
        assert_eq!(read(&p), ls.concat());
        let raw: usize = ls.iter().map(String::len).sum();
        // Tiny lines: the per-record flush dominates (real records compress ~10x).
        assert!(
            data.len() * 2 < raw,
            "{} B for {raw} B of lines",
            data.len()
        );
    }

    #[test]
    fn a_cut_anywhere_keeps_every_whole_record_before_it() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("r");
        let ls = lines(60);
        let sizes = write(&p, &ls);
        let data = std::fs::read(&p).unwrap();
        let first_cut = usize::try_from(sizes[40]).unwrap();
        for cut in first_cut..data.len() {
            std::fs::write(&p, &data[..cut]).unwrap();
            let whole = sizes.iter().filter(|s| **s <= cut as u64).count();
            let text = read(&p);
            let want = ls[..whole].concat();
            assert!(text.starts_with(&want), "cut {cut}: lost whole records");
            // Anything after them is a prefix of the next record, never other bytes.
            let rest = &text[want.len()..];
            assert!(ls[whole].starts_with(rest), "cut {cut}: {rest:?}");
        }
    }

    #[test]
    fn damage_in_one_member_spares_the_others_and_appends_after_a_crash_read() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("r");
        let ls = lines(40_000);
        write(&p, &ls);
        let mut data = std::fs::read(&p).unwrap();
        let starts: Vec<usize> = (0..data.len())
            .filter(|&i| data[i..].starts_with(&MAGIC))
            .collect();
        assert!(starts.len() >= 3);
        // Flip bytes in the middle of the first member.
        let mid = (starts[0] + starts[1]) / 2;
        for b in &mut data[mid..mid + 16] {
            *b ^= 0x5a;
        }
        // And tear the file, then append a new member after the torn bytes, as
        // `record -o` reopening a crashed recording does.
        data.truncate(data.len() - 5);
        std::fs::write(&p, &data).unwrap();
        let f = std::fs::OpenOptions::new().append(true).open(&p).unwrap();
        let mut sink = Sink::Fresh(f);
        sink.append(b"appended\n", true, data.len() as u64).unwrap();
        sink.finish().unwrap();
        let text = read(&p);
        let got: Vec<&str> = text.split_inclusive('\n').collect();
        // Garbage inflated from the damage is there (the reader's line checksums reject
        // it); every record of the other members is whole and in order.
        let index: std::collections::BTreeMap<&str, usize> = ls
            .iter()
            .enumerate()
            .map(|(i, l)| (l.as_str(), i))
            .collect();
        let kept: Vec<usize> = got.iter().filter_map(|l| index.get(l).copied()).collect();
        assert!(kept.windows(2).all(|w| w[0] < w[1]), "in order");
        let first_lost = kept
            .iter()
            .zip(0..)
            .find(|(k, i)| *k != i)
            .map(|(_, i)| i)
            .unwrap();
        assert!(
            first_lost > 0,
            "the first member's records before the damage are kept"
        );
        let resumed = kept[first_lost];
        assert!(
            kept[first_lost..]
                .iter()
                .zip(resumed..)
                .all(|(k, i)| *k == i),
            "from the next member on, nothing is lost"
        );
        // Only the torn tail is missing at the end: the last whole records are there.
        assert!(kept.last().copied().unwrap() >= ls.len() - 2);
        assert_eq!(got.last(), Some(&"appended\n"));
    }
}
