//! Reading gzip-framed recordings ([`super::gz`]), streaming. On damage it skips to the next
//! member and yields a line break there, so the damaged partial line fails its checksum alone.
//! Compressed bytes are held in a window of about two [`CHUNK`]s, every byte scanned once.
//! `Decompress` directly, one record at a time: `GzDecoder` drops what it had inflated when it
//! meets the damage.

use super::gz::{MAGIC, NAME};
use flate2::{Decompress, FlushDecompress, Status};
use std::io::{self, Read};

/// Compressed bytes read from the source at a time.
const CHUNK: usize = 64 << 10;
/// A member header as we write it: magic, mtime, xfl, os, then the name `wwrec\0`.
pub(crate) const HEADER_LEN: usize = 10 + NAME.len();
/// The empty stored block a sync flush ends with.
const SYNC: [u8; 4] = [0x00, 0x00, 0xff, 0xff];

/// What decoding skipped.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct MemberStats {
    /// Members given up part-way: damaged, or torn by a crash.
    pub damaged: u64,
    /// Bytes that belong to no member (garbage between or after members).
    pub stray_bytes: u64,
}

/// Whether `data` starts with a member header as the writer writes it.
pub(crate) fn is_member(data: &[u8]) -> bool {
    data.len() >= HEADER_LEN && data[..MAGIC.len()] == MAGIC && data[10..HEADER_LEN] == *NAME
}

/// The uncompressed bytes of consecutive members read from `src`.
pub(crate) struct Members<R> {
    src: R,
    eof: bool,
    /// Compressed bytes; everything before `pos` is done with.
    buf: Vec<u8>,
    pos: usize,
    /// Inside a member (else looking for the next one).
    in_member: bool,
    /// Where the next member header is, once found; the search has looked up to `hdr_scan`.
    next_hdr: Option<usize>,
    hdr_scan: usize,
    /// The search for the next sync point has looked up to here, and found this one
    /// (its end), which later reads reuse until they pass it.
    sync_scan: usize,
    sync_at: Option<usize>,
    /// Bytes after the current position known not to be stray (a member's trailer).
    trailer: usize,
    z: Decompress,
    /// A line break to yield before inflating on (after a resync to the next member).
    pending_break: bool,
    /// The bytes skipped up to the next header are the rest of an abandoned member.
    after_damage: bool,
    pub(crate) stats: MemberStats,
}

impl<R: Read> Members<R> {
    pub(crate) fn new(src: R) -> Members<R> {
        Members {
            src,
            eof: false,
            buf: Vec::with_capacity(2 * CHUNK),
            pos: 0,
            in_member: false,
            next_hdr: None,
            hdr_scan: 0,
            sync_scan: 0,
            sync_at: None,
            trailer: 0,
            z: Decompress::new(false),
            pending_break: false,
            after_damage: false,
            stats: MemberStats::default(),
        }
    }

    /// Drops the bytes before `pos` and reads up to a chunk more; false at the end.
    fn fill(&mut self) -> io::Result<bool> {
        if self.eof {
            return Ok(false);
        }
        let done = self.pos;
        self.buf.drain(..done);
        self.pos = 0;
        self.next_hdr = self.next_hdr.and_then(|h| h.checked_sub(done));
        self.hdr_scan = self.hdr_scan.saturating_sub(done);
        self.sync_scan = self.sync_scan.saturating_sub(done);
        self.sync_at = self.sync_at.and_then(|m| m.checked_sub(done));
        let have = self.buf.len();
        self.buf.resize(have + CHUNK, 0);
        let n = loop {
            match self.src.read(&mut self.buf[have..]) {
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                other => break other,
            }
        };
        self.buf.truncate(have + *n.as_ref().unwrap_or(&0));
        let n = n?;
        self.eof = n == 0;
        Ok(n > 0)
    }

    /// How far the buffered bytes can be searched: a header may straddle the end.
    fn searchable(&self) -> usize {
        if self.eof {
            self.buf.len()
        } else {
            self.buf.len().saturating_sub(HEADER_LEN - 1)
        }
    }

    /// Looks for the next member header in bytes not searched yet.
    fn find_next_header(&mut self) {
        if self.next_hdr.is_some() {
            return;
        }
        let end = self.searchable();
        let from = self.hdr_scan.max(self.pos);
        self.next_hdr = (from..end).find(|&i| self.buf[i] == MAGIC[0] && is_member(&self.buf[i..]));
        self.hdr_scan = end.max(from);
    }

    /// Where the current member's bytes end, as far as known now.
    fn member_limit(&mut self) -> usize {
        self.find_next_header();
        self.next_hdr.unwrap_or_else(|| self.searchable())
    }

    /// Just past the first sync point after `from` and at most `limit`, else `limit`.
    fn sync_end(&mut self, from: usize, limit: usize) -> usize {
        if let Some(m) = self.sync_at.filter(|m| *m > from && *m <= limit) {
            return m;
        }
        self.sync_at = None;
        let from = from.max(self.sync_scan).min(limit);
        let found = self
            .buf
            .get(from..limit)
            .and_then(|d| d.windows(SYNC.len()).position(|w| w == SYNC));
        match found {
            Some(i) => {
                let m = from + i + SYNC.len();
                self.sync_at = Some(m);
                self.sync_scan = m;
                m
            }
            None => {
                // A marker may straddle `limit`: look at its last bytes again next time.
                self.sync_scan = limit.saturating_sub(SYNC.len() - 1).max(from);
                limit
            }
        }
    }

    /// Moves to the next member header, reading on as needed; false at the end.
    fn start_member(&mut self) -> io::Result<bool> {
        loop {
            self.find_next_header();
            if let Some(h) = self.next_hdr.take() {
                self.skip_to(h);
                // The abandoned member's partial line must not run into this one's first.
                self.pending_break = std::mem::take(&mut self.after_damage);
                self.pos = h + HEADER_LEN;
                self.hdr_scan = h + 1;
                self.sync_scan = self.pos;
                self.sync_at = None;
                self.z.reset(false);
                self.in_member = true;
                return Ok(true);
            }
            self.skip_to(self.searchable().max(self.pos));
            if !self.fill()? {
                self.skip_to(self.buf.len());
                return Ok(false);
            }
        }
    }

    fn skip_to(&mut self, to: usize) {
        let to = to.max(self.pos);
        let n = to - self.pos;
        let trailer = n.min(self.trailer);
        self.trailer -= trailer;
        if !self.after_damage {
            self.stats.stray_bytes += (n - trailer) as u64;
        }
        self.pos = to;
    }

    /// The current member is torn or damaged: go on with the next one, after a line break.
    fn abandon_member(&mut self) {
        self.stats.damaged += 1;
        self.in_member = false;
        self.after_damage = true;
    }

    /// Inflates from the current member into `out`: Some(n) when `n` bytes came out (or
    /// at the end), None when the member ended or was given up (go on with the next).
    fn inflate_some(&mut self, out: &mut [u8]) -> io::Result<Option<usize>> {
        loop {
            // (A member just started may lie past the searchable part of the window.)
            let limit = self.member_limit().max(self.pos);
            let fed_all = self.eof && limit == self.buf.len();
            // Feed one record at a time: an inflate call that fails reports little of
            // what it inflated before the damage.
            let mut end = self.sync_end(self.pos, limit);
            let (res, consumed, written) = loop {
                let input = self.buf.get(self.pos..end).unwrap_or_default();
                let (in0, out0) = (self.z.total_in(), self.z.total_out());
                let res = self.z.decompress(input, out, FlushDecompress::None);
                let consumed = usize::try_from(self.z.total_in() - in0).unwrap_or(usize::MAX);
                let written = usize::try_from(self.z.total_out() - out0).unwrap_or(usize::MAX);
                if consumed == 0 && written == 0 && res.is_ok() && end < limit {
                    // A marker-like run inside compressed data, not a flush: more input.
                    end = self.sync_end(end, limit);
                    continue;
                }
                break (
                    res,
                    consumed.min(end.saturating_sub(self.pos)),
                    written.min(out.len()),
                );
            };
            self.pos += consumed;
            match res {
                Ok(Status::StreamEnd) => {
                    // Member complete. Its trailer (CRC32, size) is not checked: every line
                    // carries its own checksum. Whatever follows up to the next header is
                    // stray.
                    self.in_member = false;
                    self.trailer = 8;
                    return Ok(Some(written).filter(|n| *n > 0));
                }
                Ok(_) if consumed == 0 && written == 0 => {
                    // Input used up mid-member: read on, or it is torn (a crash, still being
                    // written) and the next member takes over; an inflater that takes nothing
                    // from a window this large never will.
                    let stalled = self.buf.len() - self.pos > 4 * CHUNK;
                    if self.next_hdr.is_some() || fed_all || stalled {
                        self.abandon_member();
                        return Ok(None);
                    }
                    self.fill()?;
                }
                Ok(_) if written > 0 => return Ok(Some(written)),
                Ok(_) => {}
                Err(_) => {
                    // Output of a failing call may hold garbage; lines are checksummed.
                    self.abandon_member();
                    return Ok(Some(written).filter(|n| *n > 0));
                }
            }
        }
    }
}

impl<R: Read> Read for Members<R> {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        if out.is_empty() {
            return Ok(0);
        }
        loop {
            if self.pending_break {
                self.pending_break = false;
                out[0] = b'\n';
                return Ok(1);
            }
            if !self.in_member {
                if !self.start_member()? {
                    return Ok(0);
                }
                continue;
            }
            if let Some(n) = self.inflate_some(out)? {
                return Ok(n);
            }
        }
    }
}
