//! Recording: write, crash mid-record, replay up to the last whole sample; rotation bound;
//! corrupt lines skipped; baselines turn into config_changed on replay.

use correl_common::*;
use std::io::Write;
use wedgewatch::detect::Thresholds;
use wedgewatch::model::*;
use wedgewatch::record::*;
use wedgewatch_testkit::correl as correl_common;

fn sockets_sample(sim: &Sim) -> Sample {
    Sample {
        t_ms: sim.now,
        status: SourceStatus::ok(),
        took_ms: 2,
        payload: Payload::Sockets(sim.socket_table()),
    }
}

/// A wedged decode request recorded for 40 s: returns the samples in order.
fn wedge_samples() -> Vec<Sample> {
    let mut sim = Sim::new(pd_topology());
    let d = sim.connect(Some(200), 31012, 400);
    sim.request(d, 900);
    let mut out = Vec::new();
    for _ in 0..160 {
        sim.advance(250);
        out.push(sockets_sample(&sim));
    }
    out
}

fn proc_facts(pid: i32, env: &[(&str, &str)]) -> ProcessFacts {
    ProcessFacts {
        pid,
        start_ticks: Some(42),
        cmdline: Some(vec![
            "python3".into(),
            "-m".into(),
            "sglang.launch_server".into(),
        ]),
        env: Some(
            env.iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        ),
        exe: Some("/usr/bin/python3.11".into()),
        ..Default::default()
    }
}

#[test]
fn replay_survives_a_kill_mid_write() {
    let dir = tempfile::tempdir().expect("tmp");
    let path = dir.path().join("rec.wwrec");
    let samples = wedge_samples();
    let (before_last, after_last) = {
        let mut w = RecordingWriter::create_file(&path, T0).expect("create");
        w.policy.min_interval_ms.clear(); // every sample, to count them exactly
        w.write(&Record::Topology {
            t_ms: T0,
            topology: pd_topology(),
        })
        .expect("topo");
        let (last, rest) = samples.split_last().expect("samples");
        for s in rest {
            w.write_sample(s).expect("write");
        }
        // Every record is on disk when write returns (the gzip stream is sync-flushed).
        let before = std::fs::metadata(&path).expect("md").len();
        w.write_sample(last).expect("write");
        let after = std::fs::metadata(&path).expect("md").len();
        std::mem::forget(w); // killed: no clean end of the file
        (before, after)
    };
    assert!(
        after_last > before_last + 2,
        "the last record reached the disk"
    );
    // Simulate a kill mid-write: cut the file inside the last record.
    let full = std::fs::read(&path).expect("read");
    let cut = usize::try_from((before_last + after_last) / 2).expect("size");
    std::fs::write(&path, &full[..cut]).expect("truncate");
    let rec = Recording::open(&path).expect("open");
    let (records, stats) = rec.read().expect("read");
    assert!(stats.skipped <= 1, "{stats:?}");
    assert_eq!(stats.undecodable, 0, "{stats:?}");
    let n_samples = records
        .iter()
        .filter(|r| matches!(r, Record::Sample { .. }))
        .count();
    assert_eq!(
        n_samples,
        samples.len() - 1,
        "everything up to the last whole sample"
    );

    let r = replay(&rec, None, Thresholds::default()).expect("replay");
    assert_eq!(r.at_ms, samples[samples.len() - 2].t_ms);
    let parts = wedgewatch::pipeline::parts(&r.model, r.at_ms);
    let w: Vec<_> = parts
        .findings
        .iter()
        .filter(|f| f.kind == "wedged_request")
        .collect();
    assert_eq!(w.len(), 1, "{:#?}", parts.findings);
    assert_eq!(w[0].component.as_deref(), Some(DECODE));

    // A later append after the crash still reads (the torn line is skipped, not fatal).
    {
        let mut w = RecordingWriter::create_file(&path, T0 + 50_000).expect("reopen");
        w.policy.min_interval_ms.clear();
        w.write_sample(&samples[samples.len() - 1]).expect("append");
    }
    let (records2, stats2) = Recording::open(&path).expect("open").read().expect("read");
    assert_eq!(stats2.skipped, 1, "the torn record, once");
    assert_eq!(
        records2
            .iter()
            .filter(|r| matches!(r, Record::Sample { .. }))
            .count(),
        samples.len()
    );
}

#[test]
fn replay_at_a_time_sees_the_past() {
    let dir = tempfile::tempdir().expect("tmp");
    let path = dir.path().join("rec.wwrec");
    let samples = wedge_samples();
    let mut w = RecordingWriter::create_file(&path, T0).expect("create");
    w.write(&Record::Topology {
        t_ms: T0,
        topology: pd_topology(),
    })
    .expect("topo");
    for s in &samples {
        w.write_sample(s).expect("write");
    }
    drop(w);
    let rec = Recording::open(&path).expect("open");
    let early = replay(&rec, Some(T0 + 10_000), Thresholds::default()).expect("replay");
    assert_eq!(early.at_ms, T0 + 10_000);
    let parts = wedgewatch::pipeline::parts(&early.model, early.at_ms);
    assert!(
        parts.findings.iter().all(|f| f.kind != "wedged_request"),
        "only 10 s old then"
    );
    assert_eq!(parts.requests[0].age_ms, 10_000.0);
}

#[test]
fn corrupt_line_in_the_middle_is_skipped() {
    let dir = tempfile::tempdir().expect("tmp");
    let path = dir.path().join("rec.wwrec");
    let samples = wedge_samples();
    let mut w = RecordingWriter::create_file(&path, T0).expect("create");
    w.policy.compact = false; // whole samples: each line stands alone
    w.policy.compress = false; // lines as they are on disk, to damage one
    w.policy.min_interval_ms.clear();
    for s in &samples[..3] {
        w.write_sample(s).expect("write");
    }
    drop(w);
    let mut text = std::fs::read(&path).expect("read");
    // Flip a byte inside the second sample's JSON: its checksum no longer matches.
    let second_line_start = text
        .iter()
        .enumerate()
        .filter(|(_, b)| **b == b'\n')
        .nth(1)
        .map(|(i, _)| i + 1)
        .expect("line");
    text[second_line_start + 30] ^= 0x01;
    std::fs::write(&path, &text).expect("write");
    let (records, stats) = Recording::open(&path).expect("open").read().expect("read");
    assert_eq!(stats.skipped, 1);
    assert_eq!(
        records
            .iter()
            .filter(|r| matches!(r, Record::Sample { .. }))
            .count(),
        2
    );
}

#[test]
fn rotation_keeps_n_bounded_segments_each_replayable() {
    for compress in [false, true] {
        rotation_keeps_n_bounded_segments(compress);
    }
}

fn rotation_keeps_n_bounded_segments(compress: bool) {
    let dir = tempfile::tempdir().expect("tmp");
    let recdir = dir.path().join("recording");
    let policy = RotationPolicy {
        // Sizes are on disk: gzip-framed segments fill about ten times slower.
        max_segment_bytes: if compress { 1024 } else { 8 * 1024 },
        keep_segments: 3,
    };
    let samples = wedge_samples();
    let mut w = RecordingWriter::create_dir(&recdir, policy, T0).expect("create");
    w.policy.compact = false; // bigger lines: several rotations from 160 samples
    w.policy.compress = compress;
    w.policy.min_interval_ms.clear();
    w.write(&Record::Topology {
        t_ms: T0,
        topology: pd_topology(),
    })
    .expect("topo");
    for s in &samples {
        w.write_sample(s).expect("write");
    }
    drop(w);
    let segs = segments(&recdir).expect("segments");
    assert_eq!(segs.len(), 3, "{segs:?}");
    assert!(segs[0].0 > 1, "oldest segments were deleted");
    let line_max = samples
        .iter()
        .map(|s| {
            encode(&Record::Sample {
                sample: s.clone(),
                every_ms: None,
            })
            .expect("enc")
            .len() as u64
        })
        .max()
        .unwrap_or(0);
    for (_, p) in &segs {
        let len = std::fs::metadata(p).expect("md").len();
        assert!(
            len <= policy.max_segment_bytes + line_max + 4096,
            "{p:?} is {len} bytes"
        );
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&recdir).expect("md").permissions().mode() & 0o777;
        assert_eq!(mode, 0o700);
        let fmode = std::fs::metadata(&segs[0].1)
            .expect("md")
            .permissions()
            .mode()
            & 0o777;
        assert_eq!(fmode, 0o600);
    }
    // The newest segment alone carries the topology again and replays the wedge.
    let r = replay(
        &Recording {
            files: vec![segs[2].1.clone()],
        },
        None,
        Thresholds::default(),
    )
    .expect("replay");
    assert_eq!(r.model.topology().components.len(), 4);
    let parts = wedgewatch::pipeline::parts(&r.model, r.at_ms);
    assert!(
        parts.findings.iter().any(|f| f.kind == "wedged_request"),
        "{:#?}",
        parts.findings
    );
    // Whole directory replays too.
    assert!(replay(
        &Recording::open(&recdir).expect("open"),
        None,
        Thresholds::default()
    )
    .is_ok());
}

#[test]
fn baselines_give_config_changed_on_replay() {
    let dir = tempfile::tempdir().expect("tmp");
    let path = dir.path().join("rec.wwrec");
    let topo = pd_topology();
    let before = Baseline::take(
        T0,
        &topo,
        &[proc_facts(400, &[("PATH", "/bin"), ("HF_TOKEN", "abc")])],
        "start",
    );
    let after = Baseline::take(
        T0 + 1000,
        &topo,
        &[proc_facts(
            400,
            &[
                ("PATH", "/bin"),
                ("HF_TOKEN", "abd"),
                ("SGLANG_SPLIT_TUNING", "1"),
            ],
        )],
        "restart of decode",
    );
    assert_eq!(before.components.len(), 1, "only components with facts");
    assert!(before.components[0].env["HF_TOKEN"].starts_with("<redacted:"));
    let mut w = RecordingWriter::create_file(&path, T0).expect("create");
    w.write(&Record::Topology {
        t_ms: T0,
        topology: topo,
    })
    .expect("topo");
    w.write(&Record::Baseline { baseline: before }).expect("b1");
    w.write(&Record::Baseline { baseline: after }).expect("b2");
    w.write_sample(&Sample {
        t_ms: T0 + 2000,
        status: SourceStatus::ok(),
        took_ms: 1,
        payload: Payload::Gpu(GpuReading::default()),
    })
    .expect("s");
    w.sync().expect("sync");
    drop(w);
    let r = replay(
        &Recording::open(&path).expect("open"),
        None,
        Thresholds::default(),
    )
    .expect("replay");
    assert_eq!(r.baselines.len(), 2);
    let ch = r.model.config_changes();
    let keys: Vec<_> = ch.iter().filter_map(|c| c.key.clone()).collect();
    assert!(keys.contains(&"SGLANG_SPLIT_TUNING".to_string()), "{ch:#?}");
    assert!(
        keys.contains(&"HF_TOKEN".to_string()),
        "secret change detected without its value: {ch:#?}"
    );
    assert!(ch.iter().all(|c| c.after.as_deref() != Some("abd")));
    let parts = wedgewatch::pipeline::parts(&r.model, r.at_ms);
    assert!(parts
        .findings
        .iter()
        .any(|f| f.kind == "config_changed" && f.summary.contains("decode")));
}

#[test]
fn open_reports_missing_and_empty() {
    let dir = tempfile::tempdir().expect("tmp");
    let err = Recording::open(&dir.path().join("nope")).expect_err("missing");
    assert!(err.to_string().contains("nope"));
    let err = Recording::open(dir.path()).expect_err("empty dir");
    assert!(err.to_string().contains("no recording segments"), "{err}");
    // A file that is not a recording is refused, naming it (not an empty replay).
    let p = dir.path().join("garbage");
    std::fs::File::create(&p)
        .and_then(|mut f| f.write_all(b"hello\nworld\n"))
        .expect("write");
    let err = Recording::open(&p).expect_err("garbage");
    assert!(err.to_string().contains("garbage"), "{err}");
    assert!(
        err.to_string().contains("not a wedgewatch recording"),
        "{err}"
    );
}

/// A busy-ish stack: 30 connections, a few of them moving, GPU and metrics every tick,
/// processes with environments, stack dumps.
fn busy_samples() -> Vec<Sample> {
    let mut sim = Sim::new(pd_topology());
    let conns: Vec<usize> = (0..30)
        .map(|_| sim.connect(Some(200), 31012, 400))
        .collect();
    let env: std::collections::BTreeMap<String, String> = (0..60)
        .map(|i| (format!("VAR_{i}"), "x".repeat(40)))
        .collect();
    let mut out = Vec::new();
    for i in 0..400u64 {
        sim.advance(250);
        for (j, c) in conns.iter().enumerate() {
            if j < 3 {
                sim.request(*c, 10);
                sim.respond(*c, 50);
            }
        }
        out.push(sockets_sample(&sim));
        out.push(Sample {
            t_ms: sim.now,
            status: SourceStatus::ok(),
            took_ms: 1,
            payload: Payload::Gpu(gpu(&[(0, 3, 60), (1, 50, 200)])),
        });
        if i % 4 == 0 {
            let mut p = proc_facts(400, &[]);
            p.env = Some(env.clone());
            p.cpu_time_ms = Some(i * 10);
            out.push(Sample {
                t_ms: sim.now,
                status: SourceStatus::ok(),
                took_ms: 1,
                payload: Payload::Processes(vec![p]),
            });
            out.push(Sample {
                t_ms: sim.now,
                status: SourceStatus::ok(),
                took_ms: 1,
                payload: Payload::Metrics(vec![scrape(
                    DECODE,
                    &[("running", 3.0), ("forward_seconds_total", i as f64)],
                )]),
            });
        }
        if i % 20 == 0 {
            out.push(Sample {
                t_ms: sim.now,
                status: SourceStatus::ok(),
                took_ms: 1,
                payload: Payload::Stacks(vec![stack(401, sim.now, "idle", "maybe_sleep")]),
            });
        }
    }
    out
}

#[test]
fn compact_encoding_is_lossless_and_much_smaller() {
    let dir = tempfile::tempdir().expect("tmp");
    let samples = busy_samples();
    let write = |name: &str, compact: bool, compress: bool| {
        let path = dir.path().join(name);
        let mut w = RecordingWriter::create_file(&path, T0).expect("create");
        w.policy.compact = compact;
        w.policy.compress = compress;
        w.policy.min_interval_ms.clear();
        for s in &samples {
            assert!(w.write_sample(s).expect("write"));
        }
        (path.clone(), std::fs::metadata(&path).expect("md").len())
    };
    let (full_path, full) = write("full.wwrec", false, false);
    let (compact_path, compact) = write("compact.wwrec", true, false);
    let (gz_path, gz) = write("compact-gz.wwrec", true, true);
    assert!(compact * 4 < full, "compact {compact} B vs full {full} B");
    assert!(
        gz * 4 < compact,
        "gzip-framed {gz} B vs plain compact {compact} B"
    );
    for p in [&full_path, &compact_path, &gz_path] {
        let (recs, st) = Recording::open(p).expect("open").read().expect("read");
        assert_eq!((st.skipped, st.undecodable), (0, 0));
        let back: Vec<Sample> = recs
            .into_iter()
            .filter_map(|r| match r {
                Record::Sample { sample, .. } => Some(sample),
                _ => None,
            })
            .collect();
        assert_eq!(back.len(), samples.len());
        for (a, b) in back.iter().zip(samples.iter()) {
            assert_eq!(a, b, "lossless round trip");
        }
    }
}

#[test]
fn compact_recording_recovers_at_the_next_keyframe_after_a_corrupt_line() {
    let dir = tempfile::tempdir().expect("tmp");
    let path = dir.path().join("c.wwrec");
    let samples: Vec<Sample> = busy_samples()
        .into_iter()
        .filter(|s| s.kind() == SourceKind::Sockets)
        .collect();
    let mut w = RecordingWriter::create_file(&path, T0).expect("create");
    w.policy.min_interval_ms.clear();
    w.policy.compress = false; // lines as they are on disk, to damage one
    for s in &samples {
        w.write_sample(s).expect("write");
    }
    drop(w);
    // Corrupt the 3rd sample line (line 0 is the header).
    let mut text = std::fs::read(&path).expect("read");
    let starts: Vec<usize> = std::iter::once(0)
        .chain(
            text.iter()
                .enumerate()
                .filter(|(_, b)| **b == b'\n')
                .map(|(i, _)| i + 1),
        )
        .collect();
    text[starts[3] + 20] ^= 0x01;
    std::fs::write(&path, &text).expect("write");
    let (recs, st) = Recording::open(&path).expect("open").read().expect("read");
    assert_eq!(st.skipped, 1);
    // A delta after the lost line is used only if it rebuilds the exact sample (its CRC
    // says so); otherwise samples are dropped until the next keyframe. Never wrong data.
    let back: Vec<Sample> = recs
        .into_iter()
        .filter_map(|r| match r {
            Record::Sample { sample, .. } => Some(sample),
            _ => None,
        })
        .collect();
    assert_eq!(back.len() as u64 + st.undecodable + 1, samples.len() as u64);
    for b in &back {
        let orig = samples
            .iter()
            .find(|s| s.t_ms == b.t_ms)
            .expect("same time");
        assert_eq!(b, orig);
    }
    assert_eq!(back.last(), samples.last(), "recovered");
}

#[test]
fn default_policy_thins_sockets_to_one_hertz_and_drops_raw_series() {
    let dir = tempfile::tempdir().expect("tmp");
    let path = dir.path().join("d.wwrec");
    let samples = wedge_samples(); // 160 socket samples at 4 Hz
    let mut w = RecordingWriter::create_file(&path, T0).expect("create");
    w.write(&Record::Topology {
        t_ms: T0,
        topology: pd_topology(),
    })
    .expect("topo");
    let written = samples
        .iter()
        .filter(|s| w.write_sample(s).expect("write"))
        .count();
    assert_eq!(written, 40);
    let mut sc = scrape(DECODE, &[("running", 1.0)]);
    sc.series.push(Series {
        name: "sglang:num_running_reqs".into(),
        labels: Default::default(),
        value: 1.0,
    });
    sc.series.push(Series {
        name: "sglang:http_requests_active".into(),
        labels: Default::default(),
        value: 1.0,
    });
    w.write_sample(&Sample {
        t_ms: T0 + 99_000,
        status: SourceStatus::ok(),
        took_ms: 1,
        payload: Payload::Metrics(vec![sc]),
    })
    .expect("m");
    drop(w);
    let (recs, _) = Recording::open(&path).expect("open").read().expect("read");
    let m = recs.iter().find_map(|r| match r {
        Record::Sample {
            sample:
                Sample {
                    payload: Payload::Metrics(m),
                    ..
                },
            ..
        } => Some(m.clone()),
        _ => None,
    });
    let m = m.expect("metrics sample");
    // Sockets: the server side keeps its counters, the client side only its owner.
    let table = recs.iter().find_map(|r| match r {
        Record::Sample {
            sample:
                Sample {
                    payload: Payload::Sockets(t),
                    ..
                },
            ..
        } => Some(t.clone()),
        _ => None,
    });
    let table = table.expect("sockets sample");
    let server = table
        .sockets
        .iter()
        .find(|e| e.local == "127.0.0.1:31012" && e.state != TcpState::Listen)
        .expect("server side");
    assert!(server.tcp_info.is_some());
    let client = table
        .sockets
        .iter()
        .find(|e| e.remote == "127.0.0.1:31012")
        .expect("client side");
    assert_eq!((client.tcp_info, client.pid), (None, Some(200)));
    // And the wedge still replays from the thinned, trimmed recording.
    let r = replay(
        &Recording::open(&path).expect("open"),
        None,
        Thresholds::default(),
    )
    .expect("replay");
    assert!(wedgewatch::pipeline::parts(&r.model, T0 + 40_000)
        .findings
        .iter()
        .any(|f| f.kind == "wedged_request"));
    assert_eq!(m[0].series.len(), 1);
    assert_eq!(m[0].series[0].name, "sglang:http_requests_active");
    assert_eq!(m[0].mapped.get("running"), Some(&1.0));
}

/// Measurement, not a check: recording growth of the synthetic busy stack with the default
/// policy. `cargo test --test record measure_recording_growth -- --ignored --nocapture`
#[test]
#[ignore]
fn measure_recording_growth() {
    let dir = tempfile::tempdir().expect("tmp");
    let path = dir.path().join("p.wwrec");
    let mut w = RecordingWriter::create_file(&path, T0).expect("create");
    w.write(&Record::Topology {
        t_ms: T0,
        topology: pd_topology(),
    })
    .expect("topo");
    let samples = busy_samples();
    let span_ms = samples.last().map(|s| s.t_ms - T0).unwrap_or(1);
    for s in &samples {
        w.write_sample(s).expect("w");
    }
    drop(w);
    let bytes = std::fs::metadata(&path).expect("md").len();
    println!(
        "{} samples over {} s: {bytes} B = {:.1} MiB/hour",
        samples.len(),
        span_ms / 1000,
        bytes as f64 * 3_600_000.0 / span_ms as f64 / (1u64 << 20) as f64
    );
}

#[test]
fn parse_at_accepts_times_offsets_and_rejects_garbage() {
    assert_eq!(parse_at("+90s", T0).expect("s"), T0 + 90_000);
    assert_eq!(parse_at("+5m", T0).expect("m"), T0 + 300_000);
    assert_eq!(parse_at("+1500ms", T0).expect("ms"), T0 + 1500);
    assert_eq!(
        parse_at("1795963857073", T0).expect("epoch"),
        1_795_963_857_073
    );
    assert_eq!(
        parse_at("2026-11-29T14:50:57.073Z", T0).expect("rfc"),
        1_795_963_857_073
    );
    let e = parse_at("yesterday", T0).expect_err("garbage");
    assert!(e.to_string().contains("RFC 3339"), "{e}");
    assert!(parse_at("+5x", T0).is_err());
}

#[test]
fn rotation_carries_the_start_baseline_forward() {
    let dir = tempfile::tempdir().expect("tmp");
    let recdir = dir.path().join("recording");
    let policy = RotationPolicy {
        max_segment_bytes: 4 * 1024,
        keep_segments: 2,
    };
    let topo = pd_topology();
    let b1 = Baseline::take(T0, &topo, &[proc_facts(400, &[("PATH", "/bin")])], "start");
    let b2 = Baseline::take(
        T0 + 1,
        &topo,
        &[proc_facts(400, &[("PATH", "/bin"), ("SGLANG_X", "1")])],
        "restart of decode",
    );
    let mut w = RecordingWriter::create_dir(&recdir, policy, T0).expect("create");
    w.policy.compact = false;
    w.policy.compress = false; // several rotations from a few samples
    w.policy.min_interval_ms.clear();
    w.write(&Record::Topology {
        t_ms: T0,
        topology: topo,
    })
    .expect("topo");
    w.write(&Record::Baseline { baseline: b1 }).expect("b1");
    w.write(&Record::Baseline { baseline: b2 }).expect("b2");
    for s in wedge_samples() {
        w.write_sample(&s).expect("write");
    }
    drop(w);
    let segs = segments(&recdir).expect("segs");
    assert!(segs[0].0 > 2, "the first segments are gone: {segs:?}");
    let r = replay(
        &Recording::open(&recdir).expect("open"),
        None,
        Thresholds::default(),
    )
    .expect("replay");
    assert_eq!(r.baselines[0].reason, "start");
    assert!(
        r.model
            .config_changes()
            .iter()
            .any(|c| c.key.as_deref() == Some("SGLANG_X")),
        "{:?}",
        r.model.config_changes()
    );
}

#[test]
fn replay_frames_step_through_the_recording_and_end_wedged() {
    let dir = tempfile::tempdir().expect("tmp");
    let path = dir.path().join("rec.wwrec");
    let samples = wedge_samples(); // 40 s of samples, 250 ms apart
    {
        let mut w = RecordingWriter::create_file(&path, T0).expect("create");
        w.policy.min_interval_ms.clear();
        w.write(&Record::Topology {
            t_ms: T0,
            topology: pd_topology(),
        })
        .expect("topo");
        for s in &samples {
            w.write_sample(s).expect("write");
        }
    }
    let rec = Recording::open(&path).expect("open");
    let frames =
        wedgewatch::attach::replay_frames(&rec, 5_000, Thresholds::default()).expect("frames");
    // One frame per 5 s of recorded time, plus the final state.
    assert!((8..=10).contains(&frames.len()), "{} frames", frames.len());
    let times: Vec<i64> = frames.iter().map(|f| f.taken_at_ms).collect();
    assert!(times.windows(2).all(|w| w[0] < w[1]), "{times:?}");
    let wedged = |p: &wedgewatch::snapshot::SnapshotParts| {
        p.findings.iter().any(|f| f.kind == "wedged_request")
    };
    // The request has waited 40 s at the end (over the 30 s threshold), not in the first frame.
    assert!(!wedged(&frames[0]));
    assert!(wedged(frames.last().expect("last")));
}

#[test]
fn recordings_never_hold_secrets_in_clear() {
    let dir = tempfile::tempdir().expect("tmp");
    let path = dir.path().join("rec.wwrec");
    let mut facts = proc_facts(
        400,
        &[("HF_TOKEN", "hf_recorded_secret_99"), ("SGLANG_X", "1")],
    );
    facts.cmdline = Some(vec![
        "python3".into(),
        "--api-key".into(),
        "sk-recorded-cli-77".into(),
    ]);
    {
        let mut w = RecordingWriter::create_file(&path, T0).expect("create");
        w.write_sample(&Sample {
            t_ms: T0 + 1000,
            status: SourceStatus::ok(),
            took_ms: 1,
            payload: Payload::Processes(vec![facts]),
        })
        .expect("write");
        // A socket table's free text is redacted too (its entries are ours: numbers and
        // addresses); the secrets were learned from the process sample above.
        w.write_sample(&Sample {
            t_ms: T0 + 2000,
            status: SourceStatus::unavailable("netns of pid 400: sk-recorded-cli-77 refused"),
            took_ms: 1,
            payload: Payload::Sockets(SocketTable {
                sockets: Vec::new(),
                notes: vec!["fell back to /proc for hf_recorded_secret_99".into()],
            }),
        })
        .expect("write");
    }
    let mut text = String::new();
    std::io::Read::read_to_string(
        &mut flate2::read::MultiGzDecoder::new(std::fs::File::open(&path).expect("open")),
        &mut text,
    )
    .expect("gunzip");
    assert!(
        text.contains("HF_TOKEN"),
        "the file is the recording: {text}"
    );
    assert!(!text.contains("hf_recorded_secret_99"), "{text}");
    assert!(!text.contains("sk-recorded-cli-77"), "{text}");
    assert!(
        text.contains("fell back to /proc for"),
        "the note is kept: {text}"
    );
    // Names and harmless values stay, so replay still shows what was set.
    let (records, _) = Recording::open(&path).expect("open").read().expect("read");
    let procs = records
        .iter()
        .find_map(|r| match r {
            Record::Sample { sample, .. } => match &sample.payload {
                Payload::Processes(p) => Some(p.clone()),
                _ => None,
            },
            _ => None,
        })
        .expect("processes sample");
    let env = procs[0].env.as_ref().expect("env");
    assert_eq!(env["HF_TOKEN"], REDACTED);
    assert_eq!(env["SGLANG_X"], "1");
}

/// Metric values are arbitrary floats (rates, seconds totals) and sometimes NaN or
/// infinite (an empty summary). Every one must come back bit for bit from both encodings;
/// a float that parses back one ULP off would fail the delta's CRC and lose that source
/// until the next keyframe (two minutes of metrics at 1 Hz).
#[test]
fn every_metric_value_survives_both_encodings_bit_for_bit() {
    let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let specials = [f64::NAN, f64::INFINITY, f64::NEG_INFINITY, -0.0, 5e-324];
    let mut samples = Vec::new();
    for i in 0..300i64 {
        let mut sc = scrape(
            DECODE,
            &[
                (
                    "forward_seconds_total",
                    (next() >> 11) as f64 / 9_007_199_254_740_992.0,
                ),
                ("running", f64::from_bits(next() >> 2) % 1e6),
            ],
        );
        sc.series = (0..6)
            .map(|j| Series {
                name: format!("sglang:s{j}"),
                labels: Default::default(),
                value: if j == 0 {
                    specials[usize::try_from(i).unwrap() % specials.len()]
                } else {
                    let v = f64::from_bits(next());
                    if v.is_finite() {
                        v
                    } else {
                        0.1 + 0.2
                    }
                },
            })
            .collect();
        samples.push(Sample {
            t_ms: T0 + i * 1000,
            status: SourceStatus::ok(),
            took_ms: 1,
            payload: Payload::Metrics(vec![sc]),
        });
    }
    let bits = |s: &Sample| -> Vec<u64> {
        let Payload::Metrics(sc) = &s.payload else {
            panic!("not metrics")
        };
        sc.iter()
            .flat_map(|x| {
                x.mapped
                    .values()
                    .copied()
                    .chain(x.series.iter().map(|s| s.value))
            })
            .map(f64::to_bits)
            .collect()
    };
    let dir = tempfile::tempdir().expect("tmp");
    for compact in [true, false] {
        let path = dir.path().join(format!("floats-{compact}.wwrec"));
        let mut w = RecordingWriter::create_file(&path, T0).expect("create");
        w.policy.compact = compact;
        w.policy.keep_raw_series = true;
        w.policy.min_interval_ms.clear();
        for s in &samples {
            assert!(w.write_sample(s).expect("write"));
        }
        let (recs, st) = Recording::open(&path).expect("open").read().expect("read");
        assert_eq!(
            (st.skipped, st.undecodable),
            (0, 0),
            "compact={compact}: records lost"
        );
        let back: Vec<Sample> = recs
            .into_iter()
            .filter_map(|r| match r {
                Record::Sample { sample, .. } => Some(sample),
                _ => None,
            })
            .collect();
        assert_eq!(back.len(), samples.len(), "compact={compact}");
        for (a, b) in back.iter().zip(&samples) {
            assert_eq!(bits(a), bits(b), "compact={compact} at t={}", b.t_ms);
        }
    }
}

/// Socket samples written by a writer told calm for the first `calm_ms` of `samples`, then
/// alert; returns what was read back (time and cadence of each socket sample) and the file.
fn write_paced(samples: &[Sample], calm_ms: i64) -> (Vec<(i64, Option<i64>)>, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("tmp");
    let path = dir.path().join("paced.wwrec");
    let mut w = RecordingWriter::create_file(&path, T0).expect("create");
    w.write(&Record::Topology {
        t_ms: T0,
        topology: pd_topology(),
    })
    .expect("topo");
    for s in samples {
        w.set_alert(s.t_ms - T0 > calm_ms);
        w.write_sample(s).expect("write");
    }
    drop(w);
    let (recs, stats) = Recording::open(&path).expect("open").read().expect("read");
    assert_eq!(stats.summary(), None);
    let written = recs
        .iter()
        .filter_map(|r| match r {
            Record::Sample { sample, every_ms } => Some((sample.t_ms - T0, *every_ms)),
            _ => None,
        })
        .collect();
    (written, dir)
}

#[test]
fn the_writer_records_sockets_every_ten_seconds_while_calm_and_every_second_while_alert() {
    let samples = wedge_samples(); // 4 Hz from T0 + 250 ms to T0 + 40 s
    let (written, _dir) = write_paced(&samples, 20_000);
    let calm: Vec<i64> = (0..2).map(|i| 250 + i * 10_000).collect();
    let alert: Vec<i64> = (0..20).map(|i| 20_250 + i * 1_000).collect();
    let want: Vec<(i64, Option<i64>)> = calm
        .into_iter()
        .map(|t| (t, Some(10_000)))
        .chain(alert.into_iter().map(|t| (t, Some(1_000))))
        .collect();
    assert_eq!(written, want);
}

/// Metrics and GPU readings taken every second: recorded every 5 s while calm, every one
/// (metrics) or every second (GPU) while alert.
#[test]
fn the_writer_records_metrics_and_gpu_every_five_seconds_while_calm() {
    let dir = tempfile::tempdir().expect("tmp");
    let path = dir.path().join("paced.wwrec");
    let mut w = RecordingWriter::create_file(&path, T0).expect("create");
    let sample = |t_ms, payload| Sample {
        t_ms,
        status: SourceStatus::ok(),
        took_ms: 1,
        payload,
    };
    for i in 0..20 {
        let t = T0 + 500 + i * 1_000;
        w.set_alert(i >= 10);
        w.write_sample(&sample(t, Payload::Metrics(Vec::new())))
            .expect("metrics");
        w.write_sample(&sample(t, Payload::Gpu(GpuReading::default())))
            .expect("gpu");
    }
    drop(w);
    let (recs, _) = Recording::open(&path).expect("open").read().expect("read");
    let written = |kind: SourceKind| -> Vec<(i64, Option<i64>)> {
        recs.iter()
            .filter_map(|r| match r {
                Record::Sample { sample, every_ms } if sample.kind() == kind => {
                    Some((sample.t_ms - T0, *every_ms))
                }
                _ => None,
            })
            .collect()
    };
    let calm = [(500, Some(5_000)), (5_500, Some(5_000))];
    let metrics: Vec<_> = calm
        .into_iter()
        .chain((10..20).map(|i| (500 + i * 1_000, None)))
        .collect();
    let gpu: Vec<_> = calm
        .into_iter()
        .chain((10..20).map(|i| (500 + i * 1_000, Some(1_000))))
        .collect();
    assert_eq!(written(SourceKind::Metrics), metrics);
    assert_eq!(written(SourceKind::Gpu), gpu);
}

#[test]
fn a_recording_written_calm_replays_the_wedge_and_says_its_cadence() {
    let samples = wedge_samples();
    let (written, dir) = write_paced(&samples, i64::MAX);
    assert_eq!(
        written.len(),
        4,
        "a socket table every 10 s of 40: {written:?}"
    );
    let rec = Recording::open(&dir.path().join("paced.wwrec")).expect("open");
    let r = replay(&rec, None, Thresholds::default()).expect("replay");
    assert_eq!(r.every_ms.get(&SourceKind::Sockets), Some(&10_000));
    let parts = wedgewatch::pipeline::parts(&r.model, r.at_ms);
    let w: Vec<_> = parts
        .findings
        .iter()
        .filter(|f| f.kind == "wedged_request")
        .collect();
    assert_eq!(w.len(), 1, "{:#?}", parts.findings);
    assert_eq!(w[0].component.as_deref(), Some(DECODE));
}

#[test]
fn a_recording_from_before_cadences_were_said_still_reads() {
    // Lines as version 1 writers wrote them, without `every_ms`.
    let dir = tempfile::tempdir().expect("tmp");
    let path = dir.path().join("old.wwrec");
    let header = serde_json::json!({"type": "header", "version": 1, "t_ms": T0, "pid": 1,
        "tool": "wedgewatch 0.1.0"});
    let status = serde_json::to_value(SourceStatus::ok()).expect("status");
    let delta = serde_json::json!({"type": "delta", "t_ms": T0 + 1, "kind": "processes",
        "status": status, "took_ms": 1, "key": true, "crc": crc32(b"[]"), "data": []});
    let mut bytes = Vec::new();
    for v in [header, delta] {
        let json = serde_json::to_vec(&v).expect("json");
        bytes.extend(format!("{:08x} ", crc32(&json)).into_bytes());
        bytes.extend(json);
        bytes.push(b'\n');
    }
    std::fs::write(&path, bytes).expect("write");
    let (recs, stats) = Recording::open(&path).expect("open").read().expect("read");
    assert_eq!(stats.summary(), None);
    assert!(matches!(
        recs.last(),
        Some(Record::Sample { sample, every_ms: None }) if sample.t_ms == T0 + 1
    ));
}
