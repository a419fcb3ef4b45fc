//! diff: an env var added on one engine (restarted to apply it) is found, first, and nothing
//! else changes in configuration.

use wedgewatch_testkit::shapes;

use shapes::{free_port, snapshot_of, wedgewatch, Shape};
use std::path::Path;

fn validate_diff(v: &serde_json::Value) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/schema/diff-1.schema.json");
    let schema: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).expect("read")).expect("json");
    let validator = jsonschema::validator_for(&schema).expect("compiles");
    let errors: Vec<String> = validator.iter_errors(v).map(|e| e.to_string()).collect();
    assert!(errors.is_empty(), "{errors:#?}");
}

#[test]
fn added_env_var_on_decode_is_the_change() {
    let (p, d) = (free_port(), free_port());
    let prefill = Shape::engine("prefill", p, 1, &[], &[("CUDA_VISIBLE_DEVICES", "0")]);
    let decode = Shape::engine("decode", d, 2, &[], &[("CUDA_VISIBLE_DEVICES", "1,2")]);
    let a = snapshot_of(&[prefill.pid, decode.pid], true);
    // the operator restarts decode with one more variable
    drop(decode);
    let decode = Shape::engine(
        "decode",
        d,
        2,
        &[],
        &[("CUDA_VISIBLE_DEVICES", "1,2"), ("SGLANG_WEDGE_KNOB", "1")],
    );
    let b = snapshot_of(&[prefill.pid, decode.pid], true);
    assert_eq!(
        a.components.len(),
        7,
        "{:?}",
        a.components.iter().map(|c| &c.id).collect::<Vec<_>>()
    );
    assert_eq!(b.components.len(), 7);

    // library
    let did = format!("decode@127.0.0.1:{d}");
    let report = wedgewatch::diff::diff_snapshots(&a, &b);
    let config: Vec<_> = report
        .changes
        .iter()
        .filter(|c| matches!(c.field.as_str(), "env" | "cmdline" | "version" | "config"))
        .collect();
    assert_eq!(
        config.len(),
        1,
        "exactly one configuration change: {config:#?}"
    );
    let c = config[0];
    assert_eq!(
        (c.component.as_str(), c.field.as_str(), c.key.as_deref()),
        (did.as_str(), "env", Some("SGLANG_WEDGE_KNOB"))
    );
    assert_eq!((c.before.as_deref(), c.after.as_deref()), (None, Some("1")));
    assert_eq!(report.changes[0], *c, "the env change comes first");
    // the rest: restarts of decode and its children only; prefill untouched
    for ch in &report.changes[1..] {
        assert_eq!(ch.field, "process", "{ch:?}");
        assert!(ch.component.ends_with(&did), "{ch:?}");
    }
    assert!(report
        .changes
        .iter()
        .any(|c| c.component == did && c.field == "process"));
    assert!(report
        .changes
        .iter()
        .all(|c| !c.component.contains(&format!(":{p}"))));

    // CLI, JSON and human
    let tmp = tempfile::tempdir().expect("tmp");
    let (fa, fb) = (tmp.path().join("a.json"), tmp.path().join("b.json"));
    std::fs::write(&fa, serde_json::to_vec(&a).expect("ser")).expect("write");
    std::fs::write(&fb, serde_json::to_vec(&b).expect("ser")).expect("write");
    let out = wedgewatch()
        .arg("diff")
        .arg(&fa)
        .arg(&fb)
        .arg("--json")
        .output()
        .expect("run");
    // differences: exit 1, like diff(1)
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    validate_diff(&v);
    assert_eq!(v["changes"][0]["key"], "SGLANG_WEDGE_KNOB");
    assert_eq!(v["changes"][0]["before"], serde_json::Value::Null);

    let out = wedgewatch()
        .arg("diff")
        .arg(&fa)
        .arg(&fb)
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(1));
    let text = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<&str> = text.lines().collect();
    assert!(lines[0].contains("1 to configuration"), "{text}");
    assert!(lines[1].starts_with(&did), "{text}");
    assert_eq!(lines[2].trim(), "+ env SGLANG_WEDGE_KNOB=1", "{text}");
    assert!(!text.contains('\x1b'), "no colour when not a terminal");

    // same snapshot twice: nothing
    let out = wedgewatch()
        .arg("diff")
        .arg(&fa)
        .arg(&fa)
        .output()
        .expect("run");
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "no changes");
    assert_eq!(out.status.code(), Some(0));
    drop((prefill, decode));
}

#[test]
fn baseline_adds_config_changed() {
    let d = free_port();
    let decode = Shape::engine("decode", d, 1, &[], &[]);
    let base = snapshot_of(&[decode.pid], true);
    let tmp = tempfile::tempdir().expect("tmp");
    let fa = tmp.path().join("base.json");
    // pretend the baseline lacked a variable the engine has now
    let mut base = base;
    for c in base.components.iter_mut() {
        c.env.remove("PYTHONPATH");
    }
    std::fs::write(&fa, serde_json::to_vec(&base).expect("ser")).expect("write");
    let out = wedgewatch()
        .args(["snapshot", "--json", "--baseline"])
        .arg(&fa)
        .output()
        .expect("run");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    let did = format!("decode@127.0.0.1:{d}");
    let changed = v["config_changed"].as_array().expect("config_changed");
    assert!(
        changed
            .iter()
            .any(|c| c["component"] == did.as_str() && c["key"] == "PYTHONPATH"),
        "{changed:#?}"
    );
    let finding = v["findings"]
        .as_array()
        .and_then(|f| {
            f.iter()
                .find(|f| f["kind"] == "config_changed" && f["component"] == did.as_str())
        })
        .expect("config_changed finding");
    assert!(finding["summary"]
        .as_str()
        .is_some_and(|s| s.contains("PYTHONPATH")));
    drop(decode);
}
