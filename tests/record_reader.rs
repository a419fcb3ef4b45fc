//! Reading recordings: every sample written replays (random sequences, the real binary),
//! and the reader stands hostile files (not recordings, over-long lines, gzip bombs).

mod correl_common;
mod shapes;

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
                Record::Sample { sample } => Some(sample),
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
