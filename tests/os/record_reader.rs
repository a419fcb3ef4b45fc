//! Reading recordings: every sample written replays (random sequences, the real binary),
//! and the reader stands hostile files (not recordings, over-long lines, gzip bombs).

use wedgewatch_testkit::correl as correl_common;
use wedgewatch_testkit::shapes;

use correl_common::*;
use wedgewatch::model::*;
use wedgewatch::record::*;

/// xorshift64*: a fixed seed gives the same sequence on every run.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) % n
    }
}

fn facts(rng: &mut Rng) -> ProcessFacts {
    ProcessFacts {
        pid: 400,
        start_ticks: Some(42),
        cmdline: Some(vec!["python3".into(), "-m".into(), "sglang".into()]),
        cpu_time_ms: Some(rng.below(3) * 10),
        ..Default::default()
    }
}

/// One sample of a random source, often unchanged, often empty (an idle host).
fn random_payload(rng: &mut Rng, sim: &mut Sim) -> Payload {
    let empty = rng.below(3) == 0;
    match rng.below(5) {
        0 => {
            match rng.below(6) {
                0 => drop(sim.connect(Some(200), 31012, 400)),
                1 if !sim.conns.is_empty() => sim.close(0),
                2 if !sim.conns.is_empty() => sim.request(0, 10),
                _ => {}
            }
            Payload::Sockets(sim.socket_table())
        }
        1 if empty => Payload::Gpu(gpu(&[])),
        1 => Payload::Gpu(gpu(&[(0, rng.below(2) as u32 * 50, 100)])),
        2 if empty => Payload::Processes(vec![]),
        2 => Payload::Processes(vec![facts(rng)]),
        3 if empty => Payload::Metrics(vec![]),
        3 => Payload::Metrics(vec![scrape(DECODE, &[("running", rng.below(3) as f64)])]),
        _ if empty => Payload::Stacks(vec![]),
        _ => Payload::Stacks(vec![stack(
            401,
            sim.now,
            "idle",
            ["a", "b"][rng.below(2) as usize],
        )]),
    }
}

fn random_samples(seed: u64, n: usize) -> Vec<Sample> {
    let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    let mut sim = Sim::new(pd_topology());
    (0..n)
        .map(|_| {
            sim.advance(rng.below(3) as i64 * 250);
            Sample {
                t_ms: sim.now,
                status: SourceStatus::ok(),
                took_ms: rng.below(4),
                payload: random_payload(&mut rng, &mut sim),
            }
        })
        .collect()
}

/// Writes `samples` with every sample kept as it is (no thinning, no trimming); a new
/// writer (as `record -o` appending to a file) every `reopen_every` samples.
fn write_all(target: &std::path::Path, samples: &[Sample], variant: u64, reopen_every: usize) {
    let open = |t_ms| match variant % 2 {
        0 => RecordingWriter::create_file(target, t_ms),
        _ => RecordingWriter::create_dir(
            target,
            RotationPolicy {
                max_segment_bytes: 1500,
                keep_segments: 100_000,
            },
            t_ms,
        ),
    };
    for chunk in samples.chunks(reopen_every) {
        let mut w = open(chunk[0].t_ms).expect("create");
        w.policy.min_interval_ms.clear();
        w.policy.trim_sockets = false;
        w.policy.keep_raw_series = true;
        w.policy.compress = variant / 2 == 0;
        w.write(&Record::Topology {
            t_ms: chunk[0].t_ms,
            topology: pd_topology(),
        })
        .expect("topology");
        for s in chunk {
            assert!(w.write_sample(s).expect("write"));
        }
    }
}

#[test]
fn every_sample_written_replays() {
    let dir = tempfile::tempdir().expect("tmp");
    for seed in 0..16u64 {
        let samples = random_samples(seed, 300);
        let variant = seed % 4; // file or rotated directory, gzip-framed or plain
        let target = dir.path().join(format!("r{seed}"));
        write_all(&target, &samples, variant, 100 + seed as usize);
        let (records, stats) = Recording::open(&target)
            .expect("open")
            .read()
            .expect("read");
        assert_eq!(
            stats,
            ReadStats {
                records: stats.records,
                ..Default::default()
            },
            "seed {seed}"
        );
        let back: Vec<&Sample> = records
            .iter()
            .filter_map(|r| match r {
                Record::Sample { sample, .. } => Some(sample),
                _ => None,
            })
            .collect();
        assert_eq!(back.len(), samples.len(), "seed {seed}, variant {variant}");
        for (i, (a, b)) in back.iter().zip(&samples).enumerate() {
            assert_eq!(*a, b, "seed {seed}, variant {variant}, sample {i}");
        }
    }
}

#[test]
fn a_recording_of_this_host_replays_every_sample() {
    let dir = tempfile::tempdir().expect("tmp");
    let path = dir.path().join("r.wwrec");
    let out = shapes::wedgewatch()
        .args(["record", "--for", "3s", "-o"])
        .arg(&path)
        .output()
        .expect("run record");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let written: usize = stderr
        .split("recorded ")
        .nth(1)
        .and_then(|s| s.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no sample count in {stderr:?}"));
    assert!(written > 5, "{stderr}");
    let (records, stats) = Recording::open(&path).expect("open").read().expect("read");
    let replayed = records
        .iter()
        .filter(|r| matches!(r, Record::Sample { .. }))
        .count();
    assert_eq!(
        (replayed, stats.skipped, stats.undecodable),
        (written, 0, 0)
    );
    let out = shapes::wedgewatch()
        .args(["snapshot", "--json", "--from"])
        .arg(&path)
        .output()
        .expect("run snapshot");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        !stderr.contains(&*path.to_string_lossy()),
        "a clean replay: {stderr}"
    );
}

/// A small plain recording: a header, the topology and a few samples.
fn plain_recording(path: &std::path::Path, compress: bool) {
    let mut w = RecordingWriter::create_file(path, T0).expect("create");
    w.policy.compress = compress;
    w.policy.min_interval_ms.clear();
    w.write(&Record::Topology {
        t_ms: T0,
        topology: pd_topology(),
    })
    .expect("topology");
    for s in random_samples(7, 40) {
        w.write_sample(&s).expect("write");
    }
}

fn foreign_gzip() -> Vec<u8> {
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    std::io::Write::write_all(&mut gz, b"somebody else's data\n").expect("gzip");
    gz.finish().expect("gzip")
}

fn random_bytes(n: usize) -> Vec<u8> {
    let mut rng = Rng(0x5eed);
    (0..n).map(|_| rng.below(256) as u8).collect()
}

const PASSWD: &[u8] =
    b"root:x:0:0:root:/root:/bin/bash\ndaemon:x:1:1:daemon:/usr/sbin:/usr/sbin/nologin\n";
const SNAPSHOT: &[u8] = b"{\n  \"schema\": \"wedgewatch.snapshot/1\",\n  \"components\": []\n}\n";

#[test]
fn bytes_that_are_not_recordings_are_refused() {
    let why = |bytes: &[u8]| match read_records(bytes, ReadLimits::default()) {
        Ok(_) => None,
        Err(ReadError::NotARecording(why)) => Some(why),
        Err(e) => panic!("{e}"),
    };
    assert_eq!(why(b""), Some(NotARecording::Empty));
    assert_eq!(why(PASSWD), Some(NotARecording::NoHeader));
    assert_eq!(why(&random_bytes(100_000)), Some(NotARecording::NoHeader));
    assert_eq!(why(&foreign_gzip()), Some(NotARecording::ForeignGzip));
    assert_eq!(why(SNAPSHOT), Some(NotARecording::Snapshot));
    assert_eq!(why(b"{\"a\": 1}\n"), Some(NotARecording::Json));
    // A valid record that is not a header is not a recording's start either.
    let line = encode(&Record::Topology {
        t_ms: T0,
        topology: pd_topology(),
    })
    .expect("encode");
    assert_eq!(why(&line), Some(NotARecording::NoHeader));
    let dir = tempfile::tempdir().expect("tmp");
    for compress in [false, true] {
        let p = dir.path().join(format!("r{compress}"));
        plain_recording(&p, compress);
        assert_eq!(why(&std::fs::read(&p).expect("read")), None);
    }
}

fn run(args: &[&std::ffi::OsStr]) -> (i32, String, String) {
    let out = shapes::wedgewatch().args(args).output().expect("run");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn files_that_are_not_recordings_are_an_error_naming_the_file() {
    let dir = tempfile::tempdir().expect("tmp");
    let trace = dir.path().join("trace.json");
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        ("empty.wwrec", vec![], "empty file"),
        (
            "passwd",
            PASSWD.to_vec(),
            "does not start with a recording header",
        ),
        (
            "random.bin",
            random_bytes(50_000),
            "does not start with a recording header",
        ),
        (
            "other.gz",
            foreign_gzip(),
            "gzip data not written by wedgewatch",
        ),
        (
            "snapshot.json",
            SNAPSHOT.to_vec(),
            "a wedgewatch snapshot, not a recording",
        ),
    ];
    for (name, bytes, want) in cases {
        let p = dir.path().join(name);
        std::fs::write(&p, bytes).expect("write");
        let mut commands: Vec<Vec<&std::ffi::OsStr>> = vec![
            vec![
                "snapshot".as_ref(),
                "--json".as_ref(),
                "--from".as_ref(),
                p.as_os_str(),
            ],
            vec!["tui".as_ref(), "--replay".as_ref(), p.as_os_str()],
        ];
        if name != "snapshot.json" {
            // export reads snapshots too; it refuses the rest.
            commands.push(vec![
                "export".as_ref(),
                "--perfetto".as_ref(),
                trace.as_os_str(),
                "--from".as_ref(),
                p.as_os_str(),
            ]);
        }
        for args in commands {
            let (code, stdout, stderr) = run(&args);
            assert_eq!(code, 2, "{name} {args:?}: {stderr}");
            assert!(stdout.is_empty(), "{name}: {stdout}");
            assert_eq!(stderr.lines().count(), 1, "one line: {stderr}");
            assert!(
                stderr.contains(name),
                "{name}: must name the file: {stderr}"
            );
            // `tui --replay` opens a whole snapshot as a still frame: this stub is refused
            // as a snapshot that does not match the contract.
            let want = if name == "snapshot.json" && args[0] == "tui" {
                "not a wedgewatch snapshot: does not match the contract"
            } else {
                want
            };
            assert!(stderr.contains(want), "{name} {args:?}: {stderr}");
        }
    }
    assert!(!trace.exists(), "no trace written");
}

/// A plain recording with a damaged line in the middle.
fn damaged_recording(path: &std::path::Path) {
    plain_recording(path, false);
    let mut text = std::fs::read(path).expect("read");
    let third_line = text
        .iter()
        .enumerate()
        .filter(|(_, b)| **b == b'\n')
        .nth(4)
        .map(|(i, _)| i + 1)
        .expect("line");
    text[third_line + 20] ^= 0x01;
    std::fs::write(path, &text).expect("write");
}

#[test]
fn damage_is_reported_by_snapshot_and_export() {
    let dir = tempfile::tempdir().expect("tmp");
    let p = dir.path().join("damaged.wwrec");
    damaged_recording(&p);
    let trace = dir.path().join("trace.json");
    for args in [
        vec![
            "snapshot".as_ref(),
            "--json".as_ref(),
            "--from".as_ref(),
            p.as_os_str(),
        ],
        vec![
            "export".as_ref(),
            "--perfetto".as_ref(),
            trace.as_os_str(),
            "--from".as_ref(),
            p.as_os_str(),
        ],
    ] {
        let (code, _, stderr) = run(&args);
        assert_eq!(code, 0, "{stderr}");
        let line = stderr
            .lines()
            .find(|l| l.contains("damaged.wwrec"))
            .unwrap_or_else(|| panic!("{args:?}: nothing reported: {stderr}"));
        assert!(line.contains("1 damaged record(s) skipped"), "{line}");
    }
}

#[test]
fn an_over_long_line_is_skipped_unheld_and_reading_goes_on() {
    let dir = tempfile::tempdir().expect("tmp");
    let p = dir.path().join("r.wwrec");
    plain_recording(&p, false);
    let good = std::fs::read(&p).expect("read");
    let first_line_end = good.iter().position(|b| *b == b'\n').expect("line") + 1;
    let mut bytes = good[..first_line_end].to_vec();
    bytes.extend(std::iter::repeat_n(b'7', 3 << 20));
    bytes.push(b'\n');
    bytes.extend_from_slice(&good[first_line_end..]);
    bytes.extend(std::iter::repeat_n(b'7', 3 << 20)); // and a torn one at the end
    let limits = ReadLimits {
        max_line_bytes: 1 << 20,
        ..ReadLimits::default()
    };
    let count = |bytes: &[u8]| {
        let mut recs = read_records(bytes, limits).expect("a recording");
        let n = recs.by_ref().filter(|r| r.is_ok()).count();
        (n, recs.stats())
    };
    let (clean, clean_stats) = count(&good);
    let (n, stats) = count(&bytes);
    assert_eq!(n, clean, "every record around the long lines");
    assert_eq!(stats.oversized, 2, "{stats:?}");
    assert_eq!((clean_stats.oversized, clean_stats.skipped), (0, 0));
    assert!(stats
        .summary()
        .is_some_and(|s| s.contains("2 oversized line(s)")));
}

#[test]
fn an_endless_stream_that_is_not_a_recording_is_refused_at_once() {
    // Digits, like a record's checksum, with never a line break.
    let endless = std::io::repeat(b'7');
    let why = read_records(endless, ReadLimits::default()).err();
    assert!(
        matches!(why, Some(ReadError::NotARecording(NotARecording::NoHeader))),
        "{why:?}"
    );
}

#[test]
fn damaged_recordings_never_panic_and_keep_what_is_whole() {
    let dir = tempfile::tempdir().expect("tmp");
    let mut rng = Rng(0xdead_beef);
    for compress in [false, true] {
        let p = dir.path().join(format!("r{compress}"));
        plain_recording(&p, compress);
        let good = std::fs::read(&p).expect("read");
        let clean = read_records(&good[..], ReadLimits::default())
            .expect("ok")
            .count();
        for _ in 0..150 {
            let mut bytes = good.clone();
            // Flip, zero or drop a few bytes anywhere but the first 16 (the signature).
            for _ in 0..1 + rng.below(4) {
                let at = 16 + rng.below(bytes.len() as u64 - 16) as usize;
                match rng.below(3) {
                    0 => bytes[at] ^= 1 << rng.below(8),
                    1 => bytes[at] = 0,
                    _ => bytes.truncate(at.max(17)),
                }
            }
            let Ok(mut recs) = read_records(&bytes[..], ReadLimits::default()) else {
                continue; // a damaged header line: refused, which is fine too
            };
            let n = recs.by_ref().filter(|r| r.is_ok()).count();
            assert!(
                n <= clean,
                "{n} records from damage, {clean} from the original"
            );
            let _ = recs.stats().summary();
        }
    }
}
