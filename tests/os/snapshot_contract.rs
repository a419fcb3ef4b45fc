//! The snapshot contract: real outputs validate against `wedgewatch.snapshot/1`, and the
//! bundle is written whole or not at all.

use wedgewatch_testkit::shapes;

use shapes::{fixture_proc, free_port, wedgewatch, Shape};
use std::path::Path;

fn validate(schema_file: &str, instance: &serde_json::Value) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/schema")
        .join(schema_file);
    let schema: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).expect("schema file"))
            .expect("schema json");
    let validator = jsonschema::validator_for(&schema).expect("schema compiles");
    let errors: Vec<String> = validator
        .iter_errors(instance)
        .map(|e| format!("{} at {}", e, e.instance_path))
        .collect();
    assert!(errors.is_empty(), "{schema_file}: {errors:#?}");
}

pub fn validate_snapshot(v: &serde_json::Value) {
    validate("snapshot-1.schema.json", v);
}

#[test]
fn schema_rejects_what_it_should() {
    // the validator is not a rubber stamp
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/schema/snapshot-1.schema.json");
    let schema: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).expect("read")).expect("json");
    let validator = jsonschema::validator_for(&schema).expect("compiles");
    assert!(!validator.is_valid(&serde_json::json!({"schema": "wedgewatch.snapshot/1"})));
}

#[test]
fn fixture_snapshot_validates() {
    let out = wedgewatch()
        .args(["snapshot", "--json", "--proc-root"])
        .arg(fixture_proc("container"))
        .output()
        .expect("run");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("stdout is JSON");
    validate_snapshot(&v);
    let comps = v["components"].as_array().expect("components");
    let ids: Vec<&str> = comps.iter().filter_map(|c| c["id"].as_str()).collect();
    for id in [
        "decode@127.0.0.1:31012",
        "scheduler_TP0@decode@127.0.0.1:31012",
        "scheduler_TP1@decode@127.0.0.1:31012",
        "router@127.0.0.1:30000",
    ] {
        assert!(ids.contains(&id), "{id} missing from {ids:?}");
    }
    let decode = comps
        .iter()
        .find(|c| c["id"] == "decode@127.0.0.1:31012")
        .expect("decode");
    assert_eq!(decode["role"], "decode");
    assert_eq!(decode["env"]["HF_TOKEN"], "<redacted>");
    assert_eq!(decode["env"]["SGLANG_LOG_LEVEL"], "info");
    assert_eq!(decode["gpus"], serde_json::json!([3, 4]));
    assert!(decode["started_at"]
        .as_str()
        .is_some_and(|s| s.starts_with("2026-11-2")));
    // the titled router: cmdline from its launcher
    let router = comps
        .iter()
        .find(|c| c["id"] == "router@127.0.0.1:30000")
        .expect("router");
    assert!(router["cmdline"]
        .as_array()
        .is_some_and(|a| a.iter().any(|x| x == "--pd-disaggregation")));
    // A fixture tree's pids are not this machine's processes: whatever each live source
    // made of them, it says so: a status, and a reason whenever it is not ok.
    for k in ["sockets", "stacks", "gpu", "metrics"] {
        let st = &v["sources"][k];
        assert!(
            ["ok", "degraded", "unavailable"].contains(&st["status"].as_str().unwrap_or("")),
            "{k}: {st}"
        );
        if st["status"] != "ok" {
            assert!(
                st["reason"].as_str().is_some_and(|r| !r.is_empty()),
                "{k}: {st}"
            );
        }
    }
    // No NVML library in the fixture world: the GPU source is unavailable, with its reason.
    assert_eq!(v["sources"]["gpu"]["status"], "unavailable");
    assert_eq!(v["sources"]["processes"]["status"], "ok");
    assert!(!String::from_utf8_lossy(&out.stdout).contains("hf_fixture_secret"));
    // Issue 14: the node it was taken on, its clocks, the machine-id only as a hash.
    let node = &v["node"];
    assert!(
        node["name"].as_str().is_some_and(|n| !n.is_empty()),
        "{node}"
    );
    assert!(node["clock"]["wall_ms"]
        .as_i64()
        .is_some_and(|w| w > 1_700_000_000_000));
    assert!(node["clock"]["monotonic_ms"]
        .as_i64()
        .is_some_and(|m| m > 0));
    if let Ok(raw) = std::fs::read_to_string("/etc/machine-id") {
        let hashed = node["machine_id"].as_str().expect("a machine-id");
        assert!(hashed.starts_with("sha256:"), "{hashed}");
        assert!(!String::from_utf8_lossy(&out.stdout).contains(raw.trim()));
    }
}

/// Issue 14's fields are additive: a document from before them (no `node`, `connections`,
/// `fleet`) is still a valid `wedgewatch.snapshot/1` and still reads; one with them
/// validates, and a malformed one does not.
#[test]
fn documents_without_node_identity_stay_valid_and_new_fields_are_checked() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/snapshots");
    let old_path = dir.join("wedged.json");
    let old: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&old_path).unwrap()).unwrap();
    for k in ["node", "connections", "fleet"] {
        assert!(old.get(k).is_none(), "the fixture predates {k}");
    }
    validate_snapshot(&old);
    let read = wedgewatch::snapshot::read_snapshot(&old_path).expect("an old document reads");
    assert!(read.node.is_none() && read.connections.is_empty() && read.fleet.is_none());
    let back = serde_json::to_value(&read).unwrap();
    assert!(
        back.get("node").is_none() && back.get("fleet").is_none(),
        "nothing added on the way"
    );

    let mut new = old.clone();
    new["node"] = serde_json::json!({"name": "gpu-b", "hostname": "gpu-b",
        "machine_id": "sha256:00112233445566778899aabbccddeeff", "boot_id": "b0",
        "addresses": ["10.77.0.2"], "clock": {"wall_ms": 1_795_000_000_000i64, "monotonic_ms": 5}});
    new["connections"] = serde_json::json!([{"component": "router@10.77.0.1:30000",
        "local": "10.77.0.1:41000", "remote": "10.77.0.2:30002", "state": "ESTABLISHED",
        "bytes_sent": 10, "last_send_at_ms": 1_795_000_000_000i64}]);
    validate_snapshot(&new);
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/schema/snapshot-1.schema.json");
    let schema: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let validator = jsonschema::validator_for(&schema).expect("compiles");
    let mut bad = new.clone();
    bad["node"]["clock"] = serde_json::json!({"wall_ms": "noon"});
    assert!(!validator.is_valid(&bad), "a clock is numbers");
    let mut bad = new;
    bad["connections"][0]
        .as_object_mut()
        .unwrap()
        .remove("remote");
    assert!(!validator.is_valid(&bad), "a connection has both ends");
}

#[test]
fn live_bundle_is_complete_and_atomic() {
    let port = free_port();
    let engine = Shape::engine("decode", port, 1, &[], &[("CUDA_VISIBLE_DEVICES", "0")]);
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("bundle");
    let out = wedgewatch()
        .args(["snapshot", "--json", "-o"])
        .arg(&dir)
        .output()
        .expect("run");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout: serde_json::Value = serde_json::from_slice(&out.stdout).expect("stdout JSON");
    validate_snapshot(&stdout);
    let file: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(dir.join("snapshot.json")).expect("snapshot.json"),
    )
    .expect("bundle JSON");
    validate_snapshot(&file);
    let id = format!("decode@127.0.0.1:{port}");
    let c = file["components"]
        .as_array()
        .and_then(|a| a.iter().find(|c| c["id"] == id.as_str()))
        .unwrap_or_else(|| panic!("{id} not in bundle"));
    assert_eq!(c["main_pid"], engine.pid);
    assert!(c["env"]["CUDA_VISIBLE_DEVICES"] == "0");
    let procs = c["processes"].as_array().expect("per-process facts");
    assert!(procs[0]["threads"]
        .as_array()
        .is_some_and(|t| !t.is_empty()));
    assert!(procs[0]["fd_count"].as_u64().is_some_and(|n| n >= 3));

    let report = std::fs::read_to_string(dir.join("report.md")).expect("report.md");
    let f = report.find("## Findings").expect("findings section");
    let t = report.find("<summary>Topology").expect("topology section");
    assert!(f < t, "findings come first");
    assert!(report.contains(&format!("`{id}`")));
    // the environment: the variables the SGLang profile marks relevant, not all of it
    assert!(report.contains(&format!("<details><summary>{id} (decode)</summary>")));
    assert!(report.contains("CUDA_VISIBLE_DEVICES=0"), "{report}");
    assert!(!report.contains("PATH="), "{report}");
    assert!(dir.join("raw/processes.json").is_file());
    assert!(dir.join("raw/topology.json").is_file());
    // nothing but the bundle beside it: no temporary directories left
    let left: Vec<_> = std::fs::read_dir(tmp.path())
        .expect("ls")
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert_eq!(left, vec![std::ffi::OsString::from("bundle")]);

    // a second snapshot replaces the previous bundle only when asked to (--force)
    let before = std::fs::read_to_string(dir.join("snapshot.json")).expect("read");
    let out = wedgewatch()
        .args(["snapshot", "-o"])
        .arg(&dir)
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--force"));
    let out = wedgewatch()
        .args(["snapshot", "--force", "-o"])
        .arg(&dir)
        .output()
        .expect("run");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let after = std::fs::read_to_string(dir.join("snapshot.json")).expect("read");
    assert_ne!(before, after, "taken_at differs");
    let left: Vec<_> = std::fs::read_dir(tmp.path())
        .expect("ls")
        .flatten()
        .collect();
    assert_eq!(left.len(), 1);

    // bundle directories are valid diff inputs
    let out = wedgewatch()
        .arg("diff")
        .arg(&dir)
        .arg(dir.join("snapshot.json"))
        .output()
        .expect("run");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "no changes");

    // a directory that is not a bundle is never overwritten
    let other = tmp.path().join("precious");
    std::fs::create_dir(&other).expect("mkdir");
    std::fs::write(other.join("notes.txt"), "keep me").expect("write");
    let out = wedgewatch()
        .args(["snapshot", "-o"])
        .arg(&other)
        .output()
        .expect("run");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("not a wedgewatch bundle"));
    assert_eq!(
        std::fs::read_to_string(other.join("notes.txt")).expect("read"),
        "keep me"
    );
    assert!(!other.join("snapshot.json").exists());
    drop(engine);
}

/// A thread's deciding rule and frame are in the contract (additive: absent when no rule
/// matched, so a snapshot without them reads as before), and its state is the same string.
#[test]
fn thread_rule_and_deciding_frame_fit_the_contract() {
    use wedgewatch::model::{SnapThread, ThreadState};
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/schema/snapshot-1.schema.json");
    let schema: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).expect("read")).expect("json");
    let thread_schema = serde_json::json!({"$defs": schema["$defs"], "$ref": "#/$defs/thread"});
    let validator = jsonschema::validator_for(&thread_schema).expect("compiles");
    let mut t = SnapThread {
        pid: 7,
        tid: 7,
        name: Some("MainThread".into()),
        state: ThreadState::Collective,
        frames: vec!["all_reduce (torch/distributed/distributed_c10d.py:3075)".into()],
        component: Some("scheduler_TP0@decode".into()),
        states_over_window: vec![ThreadState::Collective; 3],
        rule: Some("collective.all_reduce".into()),
        decided_by: Some("all_reduce (torch/distributed/distributed_c10d.py:3075)".into()),
    };
    let v = serde_json::to_value(&t).expect("serialize");
    assert_eq!(v["state"], "collective");
    assert_eq!(v["rule"], "collective.all_reduce");
    assert!(validator.is_valid(&v), "{v}");
    let back: SnapThread = serde_json::from_value(v).expect("read back");
    assert_eq!(back, t);
    // No rule: neither key is written, and a snapshot from before them still reads.
    t.state = ThreadState::Unknown;
    t.rule = None;
    t.decided_by = None;
    let v = serde_json::to_value(&t).expect("serialize");
    assert!(
        v.get("rule").is_none() && v.get("decided_by").is_none(),
        "{v}"
    );
    assert!(validator.is_valid(&v), "{v}");
    let old = serde_json::json!({"pid": 1, "tid": 1, "name": null, "state": "idle", "frames": []});
    let old: SnapThread = serde_json::from_value(old).expect("old snapshot thread");
    assert_eq!(old.state, ThreadState::Idle);
    assert_eq!(old.rule, None);
    assert!(!validator.is_valid(
        &serde_json::json!({"pid": 1, "tid": 1, "state": "idle", "frames": [], "rule": 3})
    ));
}

/// Issue 14: a recording's header names its node (machine-id hashed) with the clocks when
/// it began, and a snapshot replayed from it reports that node.
#[test]
fn a_recording_carries_its_node_into_snapshots_replayed_from_it() {
    let tmp = tempfile::tempdir().expect("tmp");
    let rec = tmp.path().join("r.wwrec");
    let out = wedgewatch()
        .args(["record", "-o"])
        .arg(&rec)
        .args(["--for", "1s", "--proc-root"])
        .arg(fixture_proc("container"))
        .env("WEDGEWATCH_NODE", "recorded-node")
        .output()
        .expect("run");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let header = wedgewatch::record::Recording::open(&rec)
        .expect("a recording")
        .records()
        .find_map(|r| match r {
            Ok(wedgewatch::record::Record::Header { node, .. }) => Some(node),
            _ => None,
        })
        .expect("a header");
    let node = header.expect("the header names its node");
    assert_eq!(node.name, "recorded-node");
    assert!(node.clock.is_some());
    assert!(node
        .machine_id
        .as_deref()
        .is_none_or(|m| m.starts_with("sha256:")));
    // replayed elsewhere (another WEDGEWATCH_NODE): the recorded node, not this one
    let out = wedgewatch()
        .args(["snapshot", "--json", "--from"])
        .arg(&rec)
        .env("WEDGEWATCH_NODE", "replaying-node")
        .output()
        .expect("run");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    validate_snapshot(&v);
    assert_eq!(v["node"]["name"], "recorded-node");
}

/// Every kind of event a cause's time line can hold is one the schema allows (a KV stall's
/// first event was missing: a live snapshot beside a KV-stalled lab failed the contract).
#[test]
fn every_cause_event_kind_is_in_the_schema() {
    use wedgewatch::model::cause::EventKind;
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/schema/snapshot-1.schema.json");
    let schema: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).expect("schema file"))
            .expect("schema json");
    let allowed =
        &schema["$defs"]["cause"]["properties"]["events"]["items"]["properties"]["kind"]["enum"];
    let allowed: Vec<&str> = allowed
        .as_array()
        .unwrap_or_else(|| panic!("no event kinds in the schema: {allowed}"))
        .iter()
        .filter_map(|k| k.as_str())
        .collect();
    let every = [
        EventKind::Restarted,
        EventKind::Changed,
        EventKind::Appeared,
        EventKind::Gone,
        EventKind::FirstNoResponse,
        EventKind::FirstStreamStalled,
        EventKind::FirstKvTransferStalled,
    ];
    for kind in every {
        // no wildcard: a new kind does not compile until it is listed above
        match kind {
            EventKind::Restarted
            | EventKind::Changed
            | EventKind::Appeared
            | EventKind::Gone
            | EventKind::FirstNoResponse
            | EventKind::FirstStreamStalled
            | EventKind::FirstKvTransferStalled => {}
        }
        let name = serde_json::to_value(kind).expect("kind");
        let name = name.as_str().expect("a kind is a string");
        assert!(
            allowed.contains(&name),
            "{name} is not in the schema's {allowed:?}"
        );
    }
}
