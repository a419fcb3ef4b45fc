//! `wedgewatch merge` (issue 14): node A (proxy, router) and node B (prefill, decode) as
//! their own snapshots say them, merged: hops joined across nodes by TCP 4-tuple, requests
//! judged again so `wedged_request` names decode on node B with the path from node A's
//! proxy, clock skew estimated, bad input refused with exit 2.

#[path = "common/fleet.rs"]
mod fleet;

use fleet::*;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;
use wedgewatch::merge::{self, NodeInput};
use wedgewatch::model::{FindingKind, Snapshot, Verdict};

fn input(v: &Value, source: &str) -> NodeInput {
    NodeInput {
        source: source.into(),
        snapshot: serde_json::from_value(v.clone()).expect("a snapshot"),
        name: None,
        collected: None,
    }
}

fn merged(a: &Value, b: &Value) -> Snapshot {
    merge::merge(vec![input(a, "a.json"), input(b, "b.json")], vec![]).expect("merges")
}

fn wedged(s: &Snapshot) -> Vec<&wedgewatch::model::Finding> {
    s.findings
        .iter()
        .filter(|f| f.kind == FindingKind::WedgedRequest)
        .collect()
}

#[test]
fn the_wedge_is_named_at_decode_on_node_b_with_the_path_from_node_a() {
    let s = merged(&node_a(3), &node_b(3, 5_000, "waiting_first_byte", A_IP));
    let w = wedged(&s);
    assert_eq!(w.len(), 1, "one wedge, not one per node: {:#?}", s.findings);
    let f = w[0];
    assert_eq!(f.component.as_deref(), Some(&*format!("nodeb/{DECODE}")));
    assert!(f.summary.contains("on node nodeb"), "{}", f.summary);
    assert!(
        f.summary.contains("on node nodea"),
        "entry node said: {}",
        f.summary
    );
    let path = f
        .evidence
        .iter()
        .find(|e| e.detail.contains("path:"))
        .expect("a path");
    let want = format!(
        "nodea/{PROXY} [node nodea] -> nodea/{ROUTER} [node nodea] -> nodeb/{DECODE} [node nodeb]"
    );
    assert!(path.detail.contains(&want), "{}", path.detail);
    assert!(
        f.evidence.iter().any(|e| e.source == "gpu"),
        "B's own evidence kept"
    );
    // one logical request across both nodes, stuck at decode
    let l = s
        .logical_requests
        .iter()
        .find(|l| l.id == f.requests[0])
        .expect("its request");
    assert_eq!(l.verdict, Verdict::Stuck);
    assert_eq!(
        l.legs.len(),
        4,
        "proxy, router, prefill, decode: {:?}",
        l.legs
    );
    assert_eq!(l.stuck_at.as_deref(), Some(&*format!("nodeb/{DECODE}")));
    assert!(l
        .stuck_leg
        .as_deref()
        .is_some_and(|x| x.ends_with("@decode")));
    // every other request is done, none is stuck at the router any more
    assert_eq!(
        s.logical_requests
            .iter()
            .filter(|l| l.verdict == Verdict::Stuck)
            .count(),
        1
    );
    assert!(s
        .findings
        .iter()
        .all(|f| !f.component.as_deref().unwrap_or("").contains("router")));
    // every request a finding names is a merged logical request
    for f in &s.findings {
        for r in &f.requests {
            assert!(
                s.logical_requests.iter().any(|l| &l.id == r),
                "{r} of {f:?}"
            );
        }
    }
    // node B's other finding is carried, its node named
    assert!(s
        .findings
        .iter()
        .any(|f| f.kind == FindingKind::ConfigChanged && f.summary.starts_with("[nodeb]")));
}

#[test]
fn components_are_namespaced_and_the_decode_leg_knows_its_client_on_node_a() {
    let s = merged(&node_a(2), &node_b(2, 0, "waiting_first_byte", A_IP));
    let ids: Vec<&str> = s.components.iter().map(|c| c.id.as_str()).collect();
    assert_eq!(
        ids,
        [
            &*format!("nodea/{PROXY}"),
            &*format!("nodea/{ROUTER}"),
            &*format!("nodeb/{PREFILL}"),
            &*format!("nodeb/{DECODE}")
        ]
    );
    assert!(s.components.iter().all(|c| c
        .labels
        .get("node")
        .is_some_and(|n| c.id.starts_with(&format!("{n}/")))));
    let d = s
        .requests
        .iter()
        .find(|r| r.id == "nodeb/x2")
        .expect("decode leg");
    assert_eq!(
        d.client_component.as_deref(),
        Some(&*format!("nodea/{ROUTER}"))
    );
    let fleet = s.fleet.as_ref().expect("fleet");
    assert_eq!(fleet.links.len(), 4, "two engines per router exchange");
    assert!(fleet
        .links
        .iter()
        .all(|l| l.confidence > 0.5 && l.confidence <= 1.0));
    assert!(
        fleet.notes.iter().any(|n| n.contains("10.96.0.10:80")),
        "the VIP is said: {:?}",
        fleet.notes
    );
    assert!(s.node.is_none());
    assert_eq!(
        s.sources["gpu"].reason.as_deref(),
        Some("nodea: no NVML; nodeb: no NVML")
    );
    assert!(s.sources.contains_key("nodeb/sockets"));
}

#[test]
fn a_request_still_answered_on_node_b_is_not_stuck_at_the_router_of_node_a() {
    let s = merged(&node_a(2), &node_b(2, 0, "streaming", A_IP));
    assert!(wedged(&s).is_empty(), "{:#?}", s.findings);
    let l = s
        .logical_requests
        .iter()
        .find(|l| l.legs.contains(&"nodea/x1".to_string()))
        .unwrap();
    assert_eq!(l.verdict, Verdict::Active);
}

#[test]
fn behind_a_nat_the_hops_are_not_joined_and_each_node_keeps_its_own_view() {
    let s = merged(&node_a(2), &node_b(2, 0, "waiting_first_byte", "10.0.0.50"));
    let at: Vec<&str> = wedged(&s)
        .iter()
        .filter_map(|f| f.component.as_deref())
        .collect();
    assert_eq!(at.len(), 2, "{at:?}");
    assert!(at.contains(&&*format!("nodea/{ROUTER}")) && at.contains(&&*format!("nodeb/{DECODE}")));
    let fleet = s.fleet.as_ref().unwrap();
    assert!(fleet.links.is_empty());
    assert!(
        fleet
            .notes
            .iter()
            .any(|n| n.contains(&format!("{B_IP}:30002")) && n.contains("NAT")),
        "{:?}",
        fleet.notes
    );
}

#[test]
fn clock_skew_is_estimated_from_the_joined_connections() {
    for skew in [-7_300, 0, 5_000] {
        let s = merged(&node_a(4), &node_b(4, skew, "waiting_first_byte", A_IP));
        let nodes = &s.fleet.as_ref().unwrap().nodes;
        assert_eq!(nodes[0].skew_ms, Some(0));
        let b = nodes[1].skew_ms.expect("estimated");
        // B's legs arrive 1 ms after A's router sent them (see the fixture)
        assert!((b - skew).abs() <= 20, "skew {skew}: estimated {b}");
        assert!(nodes[1]
            .skew_basis
            .as_deref()
            .is_some_and(|t| t.contains("socket")));
        assert_eq!(
            wedged(&s)[0].component.as_deref(),
            Some(&*format!("nodeb/{DECODE}")),
            "linked despite the skew"
        );
    }
}

// ---- the command line ------------------------------------------------------------------

fn ww() -> Command {
    Command::new(env!("CARGO_BIN_EXE_wedgewatch"))
}

fn write(dir: &Path, name: &str, v: &Value) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, serde_json::to_string_pretty(v).unwrap()).unwrap();
    p
}

mod contract {
    /// Validates against the repository's `wedgewatch.snapshot/1` schema.
    pub fn validate_snapshot(v: &serde_json::Value) {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/schema/snapshot-1.schema.json");
        let schema: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        let validator = jsonschema::validator_for(&schema).expect("schema compiles");
        let errors: Vec<String> = validator
            .iter_errors(v)
            .map(|e| format!("{e} at {}", e.instance_path))
            .collect();
        assert!(errors.is_empty(), "{errors:#?}");
    }
}

#[test]
fn merge_prints_json_that_fits_the_contract_and_writes_a_bundle() {
    let d = tempfile::tempdir().unwrap();
    let a = write(d.path(), "a.json", &node_a(2));
    let b = write(
        d.path(),
        "b.json",
        &node_b(2, 1_000, "waiting_first_byte", A_IP),
    );
    let out = ww()
        .arg("merge")
        .arg(&a)
        .arg(&b)
        .arg("--json")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    contract::validate_snapshot(&v);
    assert_eq!(v["fleet"]["nodes"][1]["name"], "nodeb");
    let bundle = d.path().join("merged");
    let out = ww()
        .arg("merge")
        .arg(&a)
        .arg(&b)
        .arg("-o")
        .arg(&bundle)
        .arg("--fail-on")
        .arg("critical")
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(1),
        "a critical finding: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report = std::fs::read_to_string(bundle.join("report.md")).unwrap();
    assert!(report.contains(&format!("nodeb/{DECODE}")), "{report}");
    assert!(
        report.contains("## Nodes (2)") && report.contains("+1001 ms ± 10 ms"),
        "{report}"
    );
    assert!(
        report.contains("not joined:") && report.contains("10.96.0.10:80"),
        "{report}"
    );
    let snap: Value =
        serde_json::from_str(&std::fs::read_to_string(bundle.join("snapshot.json")).unwrap())
            .unwrap();
    contract::validate_snapshot(&snap);
    // bundles merge like files
    let again = ww().arg("merge").arg(&bundle).output().unwrap();
    assert_eq!(again.status.code(), Some(2), "a merged snapshot is refused");
    assert!(String::from_utf8_lossy(&again.stderr).contains("cannot be merged again"));
}

fn refused(args: &[&std::ffi::OsStr], want: &str) {
    let out = ww().arg("merge").args(args).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains(want), "want {want:?} in: {err}");
    assert_eq!(err.lines().count(), 1, "one clear line: {err}");
    assert!(out.stdout.is_empty());
}

#[test]
fn bad_input_is_refused_with_a_clear_message_and_exit_2() {
    let d = tempfile::tempdir().unwrap();
    let a = write(d.path(), "a.json", &node_a(1));
    let a2 = write(d.path(), "a-again.json", &node_a(1));
    let junk = write(d.path(), "junk.json", &serde_json::json!({"hello": 1}));
    let missing = d.path().join("nope.json");
    refused(&[a.as_os_str(), missing.as_os_str()], "nope.json");
    refused(
        &[a.as_os_str(), junk.as_os_str()],
        "junk.json: not a wedgewatch snapshot: no \"schema\" field",
    );
    refused(&[a.as_os_str(), a2.as_os_str()], "same node \"nodea\"");
    refused(&[d.path().as_os_str()], "snapshot.json");
}

#[test]
fn an_old_snapshot_without_node_identity_merges_under_its_file_name() {
    let d = tempfile::tempdir().unwrap();
    let mut old = node_b(1, 0, "waiting_first_byte", A_IP);
    old.as_object_mut().unwrap().remove("node");
    let b = write(d.path(), "engines-host.json", &old);
    let a = write(d.path(), "a.json", &node_a(1));
    let out = ww()
        .arg("merge")
        .arg(&a)
        .arg(&b)
        .arg("--json")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["fleet"]["nodes"][1]["name"], "engines-host");
    assert_eq!(
        v["findings"][0]["component"],
        format!("engines-host/{DECODE}")
    );
}
