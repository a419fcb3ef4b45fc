//! Hostile recordings: a gzip member inflating to more than 1 GiB of one line is read in
//! bounded time and in memory bounded by the line cap; a line of tiny JSON values costs
//! memory bounded by the value budget. Alone in their test binary, so the counting
//! allocator sees only them.

// libc calls (tcp_info, rusage, ptys, a counting allocator) that std does not wrap.
#![allow(unsafe_code)]

use wedgewatch_testkit::correl as correl_common;

use correl_common::*;
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};
use wedgewatch::record::*;

struct Counting;
static NOW: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        let n = NOW.fetch_add(l.size(), Ordering::Relaxed) + l.size();
        PEAK.fetch_max(n, Ordering::Relaxed);
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        NOW.fetch_sub(l.size(), Ordering::Relaxed);
        unsafe { System.dealloc(p, l) }
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

/// Deflate bits, least significant first; Huffman codes most significant first.
#[derive(Default)]
struct Bits {
    out: Vec<u8>,
    acc: u64,
    n: u32,
}

impl Bits {
    fn value(&mut self, v: u64, len: u32) {
        self.acc |= v << self.n;
        self.n += len;
        while self.n >= 8 {
            self.out.push(self.acc as u8);
            self.acc >>= 8;
            self.n -= 8;
        }
    }
    fn code(&mut self, code: u64, len: u32) {
        let rev = (0..len).fold(0, |r, i| (r << 1) | ((code >> i) & 1));
        self.value(rev, len);
    }
    /// A literal byte below 144 in the fixed Huffman code.
    fn literal(&mut self, b: u8) {
        assert!(b < 144);
        self.code(0x30 + u64::from(b), 8);
    }
}

/// One gzip member as the writer frames it: `before`, then `a` repeated `n * 258 + 1`
/// times (fixed-Huffman matches of length 258 at distance 1: 13 bits each, so no sync
/// marker anywhere), then `after`.
fn bomb(before: &[u8], n: u64, after: &[u8]) -> Vec<u8> {
    let mut b = Bits::default();
    b.out
        .extend_from_slice(&[0x1f, 0x8b, 8, 8, 0, 0, 0, 0, 0, 3]);
    b.out.extend_from_slice(b"wwrec\0");
    b.value(0, 1); // not the last block
    b.value(1, 2); // fixed Huffman
    before.iter().for_each(|c| b.literal(*c));
    b.literal(b'a');
    for _ in 0..n {
        b.code(0b1100_0101, 8); // length code 285: 258
        b.code(0, 5); // distance code 0: 1
    }
    after.iter().for_each(|c| b.literal(*c));
    b.code(0, 7); // end of block
    b.value(1, 1); // last block: empty
    b.value(1, 2);
    b.code(0, 7);
    b.value(0, 7); // to a byte boundary
    b.out.truncate(b.out.len() - usize::from(b.n == 0));
    b.out.extend_from_slice(&[0; 8]); // trailer (not checked: lines carry checksums)
    b.out
}

/// One test, so the counting allocator sees one thing at a time.
#[test]
fn hostile_lines_are_read_in_bounded_time_and_memory() {
    a_gzip_bomb_of_one_line_is_read_in_bounded_time_and_memory();
    a_dense_line_costs_memory_bounded_by_the_value_budget();
}

fn a_gzip_bomb_of_one_line_is_read_in_bounded_time_and_memory() {
    let header = encode(&Record::Header {
        version: 1,
        t_ms: T0,
        pid: 1,
        tool: "test".into(),
        node: None,
    })
    .expect("encode");
    let topology = encode(&Record::Topology {
        t_ms: T0,
        topology: pd_topology(),
    })
    .expect("encode");
    let mut after = b"\n".to_vec();
    after.extend_from_slice(&topology);
    // 1.1 GiB of one line.
    let data = bomb(&header, (1100 << 20) / 258, &after);
    assert!(data.len() < 8 << 20, "{} B", data.len());
    for cap in [1 << 20, DEFAULT_MAX_LINE_BYTES] {
        let base = NOW.load(Ordering::Relaxed);
        PEAK.store(base, Ordering::Relaxed);
        let start = Instant::now();
        let mut recs = read_records(
            &data[..],
            ReadLimits {
                max_line_bytes: cap,
                ..ReadLimits::default()
            },
        )
        .expect("ok");
        let kinds: Vec<String> = recs
            .by_ref()
            .map(|r| {
                format!("{:?}", r.expect("record"))
                    .chars()
                    .take(8)
                    .collect()
            })
            .collect();
        let took = start.elapsed();
        let peak = PEAK.load(Ordering::Relaxed) - base;
        println!(
            "cap {} MiB: {} B inflating to 1.1 GiB read in {took:?}, peak heap {:.1} MiB",
            cap >> 20,
            data.len(),
            peak as f64 / f64::from(1 << 20)
        );
        assert_eq!(
            kinds,
            ["Header {", "Topology"],
            "the records around the bomb"
        );
        let stats = recs.stats();
        assert_eq!((stats.oversized, stats.skipped), (1, 0), "{stats:?}");
        // Growing a line copies it: the old and the new buffer, 1.5 times the cap.
        assert!(
            peak < cap / 2 * 3 + (4 << 20),
            "peak {peak} B with a cap of {cap} B"
        );
        // About 2 s in a debug build; the old reader ran for minutes, growing.
        assert!(took < Duration::from_secs(60), "{took:?}");
    }
}

/// A line of tiny JSON values (`[0,0,...]`), checksummed: parsed, it is a tree some 100
/// times the line's size.
fn dense_line(values: usize) -> Vec<u8> {
    let data = format!("[{}0]", "0,".repeat(values - 1));
    let crc = crc32(data.as_bytes());
    let rec = format!(
        r#"{{"type":"delta","t_ms":1,"kind":"gpu","status":{{"status":"ok"}},"took_ms":1,"key":true,"crc":{crc},"data":{data}}}"#
    );
    let mut bytes = encode(&Record::Header {
        version: 1,
        t_ms: 1,
        pid: 1,
        tool: "t".into(),
        node: None,
    })
    .expect("encode");
    bytes.extend_from_slice(format!("{:08x} {rec}\n", crc32(rec.as_bytes())).as_bytes());
    bytes
}

/// Peak heap while reading `bytes` to the end, and the stats.
fn peak_reading(bytes: &[u8], limits: ReadLimits) -> (usize, ReadStats) {
    let base = NOW.load(Ordering::Relaxed);
    PEAK.store(base, Ordering::Relaxed);
    let mut recs = read_records(bytes, limits).expect("a recording");
    recs.by_ref().for_each(drop);
    (PEAK.load(Ordering::Relaxed) - base, recs.stats())
}

fn a_dense_line_costs_memory_bounded_by_the_value_budget() {
    let limits = ReadLimits {
        max_line_values: 200_000,
        ..ReadLimits::default()
    };
    let (peak, stats) = peak_reading(&dense_line(150_000), limits);
    println!(
        "150k values: peak heap {:.1} MiB ({} B a value)",
        peak as f64 / f64::from(1 << 20),
        peak / 150_000
    );
    assert_eq!((stats.records, stats.oversized), (1, 0), "{stats:?}");
    assert!(peak < 300 * 200_000, "{peak} B");
    let (peak, stats) = peak_reading(&dense_line(250_000), limits);
    assert_eq!(stats.oversized, 1, "{stats:?}");
    assert!(peak < 4 << 20, "skipped unparsed: {peak} B");
}
