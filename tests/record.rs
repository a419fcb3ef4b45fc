//! Recording: write, crash mid-record, replay up to the last whole sample; rotation bound;
//! corrupt lines skipped; baselines turn into config_changed on replay.

mod correl_common;
use correl_common::*;
use std::io::Write;
use wedgewatch::detect::Thresholds;
use wedgewatch::model::*;
use wedgewatch::record::*;

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
    {
        let mut w = RecordingWriter::create_file(&path, T0).expect("create");
        w.write(&Record::Topology {
            t_ms: T0,
            topology: pd_topology(),
        })
        .expect("topo");
        for s in &samples {
            w.write_sample(s).expect("write");
        }
    }
    // Simulate a kill mid-write: the last record loses its tail (and its newline).
    let full = std::fs::read(&path).expect("read");
    let cut = full.len() - 37;
    std::fs::write(&path, &full[..cut]).expect("truncate");
    let rec = Recording::open(&path).expect("open");
    let (records, stats) = rec.read().expect("read");
    assert_eq!(stats.skipped, 1);
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
    let parts = r.model.parts(r.at_ms);
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
        w.write_sample(&samples[samples.len() - 1]).expect("append");
    }
    let (records2, stats2) = Recording::open(&path).expect("open").read().expect("read");
    assert_eq!(stats2.skipped, 1);
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
    let parts = early.model.parts(early.at_ms);
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
    let dir = tempfile::tempdir().expect("tmp");
    let recdir = dir.path().join("recording");
    let policy = RotationPolicy {
        max_segment_bytes: 8 * 1024,
        keep_segments: 3,
    };
    let samples = wedge_samples();
    let mut w = RecordingWriter::create_dir(&recdir, policy, T0).expect("create");
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
            encode(&Record::Sample { sample: s.clone() })
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
    let parts = r.model.parts(r.at_ms);
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
    let parts = r.model.parts(r.at_ms);
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
    // Garbage file: opens, every line skipped, replay gives an empty model.
    let p = dir.path().join("garbage");
    std::fs::File::create(&p)
        .and_then(|mut f| f.write_all(b"hello\nworld\n"))
        .expect("write");
    let (recs, st) = Recording::open(&p).expect("open").read().expect("read");
    assert!(recs.is_empty());
    assert_eq!(st.skipped, 2);
}
