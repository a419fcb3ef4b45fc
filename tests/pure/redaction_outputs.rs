//! Redaction of every output path, in process (no live processes): secrets planted in env,
//! argv, thread names, stack frames, metrics labels, `/v1/loads` bodies and topology labels
//! never appear in the snapshot JSON, the bundle (raw/ included), report.md, a recording
//! (decompressed), a replay, a perfetto export or a diff; their names stay visible; control
//! characters from the host never reach a text output.

use correl_common::*;
use serde_json::json;
use std::collections::BTreeMap;
use std::io::Write;
use wedgewatch::clock::Millis;
use wedgewatch::detect::Thresholds;
use wedgewatch::model::*;
use wedgewatch::record::*;
use wedgewatch::snapshot::{self, AssembleOptions, SnapshotParts};
use wedgewatch_testkit::correl as correl_common;

/// Planted values; each must vanish from every output.
const PLANTED: &[&str] = &[
    "planted-db-pass-1",
    "planted-gh-pat-2",
    "planted-json-key-3",
    "plantedsentrykey0123",
    "planted-query-4",
    "planted-bearer-5",
    "planted-positional-6",
    "planted-json-arg-7",
    "planted-label-8",
    "planted-label-url-9",
    "planted-loads-10",
    "planted-url-pw-11",
    "hf_PLANTEDabcdefghijklmnopqrstuvwxyz0123",
    "planted-yaml-12",
];
/// Names that must stay visible.
const NAMES: &[&str] = &["DB_PASS", "GH_PAT", "MODEL_CFG", "api_key", "model.api_key"];
const OSC52: &str = "\u{1b}]52;c;aGVsbG8=\u{7}";

fn facts() -> ProcessFacts {
    let env: BTreeMap<String, String> = [
        ("DB_PASS", "planted-db-pass-1"),
        ("GH_PAT", "planted-gh-pat-2"),
        (
            "MODEL_CFG",
            r#"{"api_key": "planted-json-key-3", "name": "m"}"#,
        ),
        (
            "ERROR_REPORTING",
            "https://plantedsentrykey0123@o1.ingest.example/1",
        ),
        ("EXTRA_YAML", "auth:\n  token: planted-yaml-12\n"),
        ("SGLANG_PORT", "31012"),
        ("EVIL_TITLE", OSC52),
    ]
    .iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    let argv = [
        "python3",
        "-m",
        "sglang.launch_server",
        "--url",
        "http://h/v1?api_key=planted-query-4&x=1",
        "-H",
        "Authorization: Bearer planted-bearer-5",
        "model.api_key=planted-positional-6",
        "--cfg",
        r#"{"token": "planted-json-arg-7"}"#,
        "--port",
        "31012",
        OSC52,
    ];
    ProcessFacts {
        pid: 400,
        start_ticks: Some(42),
        comm: Some("python3".into()),
        cmdline: Some(argv.iter().map(|s| s.to_string()).collect()),
        env: Some(env),
        exe: Some("/usr/bin/python3.11".into()),
        threads: Some(vec![
            ThreadInfo {
                tid: 400,
                name: "w-hf_PLANTEDabcdefghijklmnopqrstuvwxyz0123".into(),
            },
            // a value learned from the env, echoed where no rule would see it
            ThreadInfo {
                tid: 402,
                name: "planted-db-pass-1".into(),
            },
        ]),
        ..Default::default()
    }
}

fn topology() -> Topology {
    let mut t = pd_topology();
    if let Some(c) = t.components.iter_mut().find(|c| c.id == DECODE) {
        c.labels.insert(
            "url".into(),
            "http://svc:planted-url-pw-11@127.0.0.1:31012".into(),
        );
        c.http_url = Some("http://svc:planted-url-pw-11@127.0.0.1:31012".into());
    }
    t
}

fn metrics() -> MetricsScrape {
    let mut s = scrape(DECODE, &[("running", 1.0)]);
    let labels = [
        ("api_key", "planted-label-8"),
        ("endpoint", "http://h/x?token=planted-label-url-9"),
        ("model", "m"),
    ];
    s.series.push(Series {
        name: "sglang:num_running_reqs".into(),
        labels: labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        value: 1.0,
    });
    s.extra.insert(
        "/v1/loads".into(),
        json!({"loads": [{"api_key": "planted-loads-10", "running": 1}]}),
    );
    s
}

fn stacks() -> StackCapture {
    let mut st = stack(400, T0, "idle", "planted-gh-pat-2");
    st.threads[0].name = Some(format!("thread {OSC52}"));
    st
}

fn sample(t: Millis, payload: Payload) -> Sample {
    Sample {
        t_ms: t,
        status: SourceStatus::ok(),
        took_ms: 1,
        payload,
    }
}

fn samples() -> Vec<Sample> {
    vec![
        sample(T0 + 1000, Payload::Processes(vec![facts()])),
        sample(T0 + 1100, Payload::Metrics(vec![metrics()])),
        sample(T0 + 1200, Payload::Stacks(vec![stacks()])),
    ]
}

fn parts() -> SnapshotParts {
    let mut raw = BTreeMap::new();
    raw.insert("metrics".to_string(), json!([metrics()]));
    raw.insert("stacks".to_string(), json!([stacks()]));
    SnapshotParts {
        taken_at_ms: T0 + 2000,
        topology: topology(),
        processes: vec![facts()],
        requests: vec![request()],
        logical_requests: vec![logical()],
        raw,
        ..SnapshotParts::default()
    }
}

/// An exchange whose text fields echo planted values (learned from the env and argv, and by
/// structure), as a hostile peer's or a component's name could: the typed redaction of
/// requests must remove them as the JSON walk does.
fn request() -> Request {
    Request {
        id: "x1".into(),
        component: "decode planted-db-pass-1".into(),
        client: "127.0.0.1:1".into(),
        server: "127.0.0.1:2 token=planted-query-4".into(),
        state: RequestState::Streaming,
        age_ms: 1.0,
        bytes_in: 1,
        bytes_out: 2,
        idle_out_ms: 0.0,
        links: vec!["x2".into(), "--api-key".into(), "planted-json-arg-7".into()],
        role: Some(Role::Decode),
        client_component: Some("router planted-gh-pat-2".into()),
        link_confidence: None,
        started_at: None,
        request: Some("r1 hf_PLANTEDabcdefghijklmnopqrstuvwxyz0123".into()),
        leg: Some("r1@decode".into()),
    }
}

fn logical() -> LogicalRequest {
    LogicalRequest {
        id: "r1".into(),
        legs: vec!["x1".into(), "Bearer".into(), "planted-bearer-5".into()],
        verdict: Verdict::Stuck,
        component: "proxy planted-url-pw-11".into(),
        age_ms: 1.0,
        probe: false,
        stuck_leg: Some("r1@decode planted-positional-6".into()),
        stuck_at: Some("decode".into()),
        stuck_role: Some(Role::Decode),
        stuck_kind: None,
        waiting_reason: None,
        waiting_leg: None,
    }
}

fn assert_clean(what: &str, text: &str) {
    for s in PLANTED {
        assert!(!text.contains(s), "{s} leaked into {what}:\n{text}");
    }
    assert!(!text.contains('\u{1b}'), "a raw ESC reached {what}");
    assert!(!text.contains('\u{7}'), "a raw BEL reached {what}");
}

fn assert_names(what: &str, text: &str) {
    for n in NAMES {
        assert!(text.contains(n), "name {n} must stay visible in {what}");
    }
}

fn read_tree(dir: &std::path::Path, out: &mut Vec<(String, String)>) {
    for e in std::fs::read_dir(dir).expect("ls").flatten() {
        let p = e.path();
        if p.is_dir() {
            read_tree(&p, out);
        } else {
            out.push((
                p.display().to_string(),
                std::fs::read_to_string(&p).expect("read"),
            ));
        }
    }
}

#[test]
fn snapshot_bundle_report_and_export_hold_no_planted_secret() {
    let opts = AssembleOptions::default();
    let b = snapshot::assemble_bundle(parts(), &opts);
    let json = serde_json::to_string_pretty(&b.snapshot).expect("json");
    assert_clean("snapshot.json", &json);
    assert_names("snapshot.json", &json);
    for (stem, v) in &b.raw {
        assert_clean(&format!("raw/{stem}"), &v.to_string());
    }
    assert!(
        b.raw["metrics"].to_string().contains("api_key"),
        "label names stay"
    );
    let tmp = tempfile::tempdir().expect("tmp");
    let dir = tmp.path().join("bundle");
    snapshot::write_bundle(&b.snapshot, &b.raw, &dir, snapshot::Overwrite::Refuse).expect("bundle");
    let mut files = Vec::new();
    read_tree(&dir, &mut files);
    assert!(files.iter().any(|(p, _)| p.ends_with("report.md")));
    for (p, text) in &files {
        assert_clean(p, text);
    }
    let trace = wedgewatch::export::perfetto(&parts());
    assert_clean("perfetto", &trace.to_string());
}

/// A snapshot a daemon serves (`json`: assembled and redacted by the daemon, printed by the
/// client as it comes) holds no planted secret either: the daemon's model fed the same
/// samples, its answer's bytes checked.
#[test]
fn a_served_json_snapshot_holds_no_planted_secret() {
    use wedgewatch::daemon::{self, protocol, Shared};
    let mut model = wedgewatch::correlate::Correlator::new(Thresholds::default());
    model.set_topology(topology());
    samples().iter().for_each(|s| model.ingest(s));
    let shared = std::sync::Mutex::new(Shared::new(model, T0));
    let req = protocol::parse_request(b"json\n").expect("json");
    let stats = wedgewatch::sampler::StatsHandle::default();
    let bytes = daemon::respond_bytes(&req, &shared, &stats, T0 + 2000);
    let text = String::from_utf8(bytes).expect("utf-8");
    assert!(text.contains("wedgewatch.snapshot/1"), "{text:.200}");
    assert!(text.contains("DB_PASS"), "the env is served: {text:.2000}");
    assert_clean("served json", &text);
    assert_names("served json", &text);
}

/// The report and the bundle writer re-redact what they are given: a snapshot assembled by
/// an older version (redacted by its rules only) is written clean.
#[test]
fn an_old_snapshot_is_redacted_again_by_every_writer() {
    let mut old = snapshot::assemble(
        parts(),
        &AssembleOptions {
            redact: false,
            ..AssembleOptions::default()
        },
    );
    old.redacted = true;
    // report.md shows the variables a stack profile marks relevant: mark them all
    for c in &mut old.components {
        c.relevant_env = c.env.keys().cloned().collect();
    }
    let report = wedgewatch::report::render(&old);
    assert_clean("report.md", &report);
    assert!(report.contains("DB_PASS"));
    let tmp = tempfile::tempdir().expect("tmp");
    let dir = tmp.path().join("b");
    snapshot::write_bundle(&old, &BTreeMap::new(), &dir, snapshot::Overwrite::Refuse)
        .expect("bundle");
    let mut files = Vec::new();
    read_tree(&dir, &mut files);
    for (p, text) in &files {
        assert_clean(p, text);
    }
    // diff: text and JSON, against a redacted snapshot of the same stack
    let now = snapshot::assemble(parts(), &AssembleOptions::default());
    let d = wedgewatch::diff::diff_snapshots(&old, &now);
    assert_clean("diff JSON", &serde_json::to_string(&d).expect("json"));
    assert_clean("diff text", &wedgewatch::diff::render_human(&d, false));
    let trace = wedgewatch::export::perfetto_snapshot(&old);
    assert_clean("perfetto from a snapshot", &trace.to_string());
}

#[test]
fn diff_text_neutralises_control_characters() {
    let mut a = snapshot::assemble(parts(), &AssembleOptions::default());
    let mut b = a.clone();
    a.redacted = false;
    b.redacted = false;
    if let Some(c) = b.components.iter_mut().find(|c| c.id == DECODE) {
        c.env
            .insert("NEW_VAR".into(), format!("x{OSC52}\nforged line"));
    }
    let text = wedgewatch::diff::render_human(&wedgewatch::diff::diff_snapshots(&a, &b), false);
    assert!(
        !text.contains('\u{1b}') && !text.contains('\u{7}'),
        "{text:?}"
    );
    assert!(text.contains(r"\x1b]52;c;"), "shown, escaped: {text}");
    assert!(
        !text.contains("\nforged line"),
        "input newlines stay escaped: {text}"
    );
}

#[test]
fn recordings_and_replays_hold_no_planted_secret() {
    let tmp = tempfile::tempdir().expect("tmp");
    let path = tmp.path().join("rec.wwrec");
    {
        let mut w = RecordingWriter::create_file(&path, T0).expect("create");
        w.policy.keep_raw_series = true;
        w.write(&Record::Topology {
            t_ms: T0,
            topology: topology(),
        })
        .expect("topology");
        let base = Baseline::take(T0, &topology(), &[facts()], "start");
        w.write(&Record::Baseline { baseline: base })
            .expect("baseline");
        for s in samples() {
            w.write_sample(&s).expect("sample");
        }
    }
    let mut text = String::new();
    std::io::Read::read_to_string(
        &mut flate2::read::MultiGzDecoder::new(std::fs::File::open(&path).expect("open")),
        &mut text,
    )
    .expect("gunzip");
    assert_clean("the recording", &text);
    assert_names("the recording", &text);
    check_replay(&path);
}

/// A recording written without today's rules (an older version) replays clean: the reader
/// re-scrubs every record.
#[test]
fn an_old_recording_replays_clean() {
    let tmp = tempfile::tempdir().expect("tmp");
    let path = tmp.path().join("old.wwrec");
    let mut f = std::fs::File::create(&path).expect("create");
    let mut records = vec![
        Record::Header {
            version: 1,
            t_ms: T0,
            pid: 1,
            tool: "wedgewatch 0.0.9".to_string(),
            node: None,
        },
        Record::Topology {
            t_ms: T0,
            topology: topology(),
        },
    ];
    records.extend(samples().into_iter().map(|sample| Record::Sample {
        sample,
        every_ms: None,
    }));
    for r in &records {
        f.write_all(&encode(r).expect("encode")).expect("write");
    }
    drop(f);
    check_replay(&path);
}

fn check_replay(path: &std::path::Path) {
    let r = replay(
        &Recording::open(path).expect("open"),
        None,
        Thresholds::default(),
    )
    .expect("replay");
    let parts = wedgewatch::pipeline::parts(&r.model, r.at_ms);
    assert_clean(
        "the replayed model",
        &serde_json::to_string(&parts).expect("json"),
    );
    let b = snapshot::assemble_bundle(parts, &AssembleOptions::default());
    assert_clean(
        "a replayed snapshot",
        &serde_json::to_string(&b.snapshot).expect("json"),
    );
    let trace = wedgewatch::export::perfetto_model(&r.model, r.at_ms);
    assert_clean("perfetto from a replay", &trace.to_string());
}

/// Item 3: a changed secret is still noticed within one run, and its mask is a keyed
/// 64-bit MAC, not CRC32(salt + value) (whose XOR over two equal-length values cancels the
/// salt and lets anyone holding an old secret test guesses for the new one).
#[test]
fn baseline_masks_are_keyed_and_still_notice_a_changed_secret() {
    let with = |v: &str| {
        let mut f = facts();
        if let Some(env) = f.env.as_mut() {
            env.insert("HF_TOKEN".into(), v.into());
        }
        Baseline::take(T0, &topology(), &[f], "start")
    };
    let (a, b) = (with("secret-aaaa"), with("secret-bbbb"));
    let mask = |bl: &Baseline| bl.components[0].env["HF_TOKEN"].clone();
    let (ma, mb) = (mask(&a), mask(&b));
    assert!(
        !ma.contains("secret-aaaa") && ma.starts_with("<redacted:"),
        "{ma}"
    );
    let mac = |m: &str| {
        m.trim_end_matches('>')
            .rsplit(':')
            .next()
            .unwrap_or("")
            .to_string()
    };
    assert!(mac(&ma).len() >= 16, "at least 64 bits kept: {ma}");
    let low =
        |m: &str| u32::from_str_radix(&mac(m)[mac(m).len().saturating_sub(8)..], 16).unwrap_or(0);
    let crc_with_zero_salt = |v: &str| {
        let mut d = vec![0u8; 16];
        d.extend_from_slice(v.as_bytes());
        crc32(&d)
    };
    assert_ne!(
        low(&ma) ^ low(&mb),
        crc_with_zero_salt("secret-aaaa") ^ crc_with_zero_salt("secret-bbbb"),
        "masks must not be affine in the value"
    );
    assert_eq!(mask(&with("secret-aaaa")), ma, "stable within one run");
    let ch = a.changes_to(&b);
    let c = ch
        .iter()
        .find(|c| c.key.as_deref() == Some("HF_TOKEN"))
        .expect("a changed secret is noticed");
    assert_eq!(c.before.as_deref(), Some(REDACTED));
    assert_eq!(c.after.as_deref(), Some(REDACTED));
    assert!(
        a.changes_to(&with("secret-aaaa")).is_empty(),
        "unchanged: no change"
    );
}
