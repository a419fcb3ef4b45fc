//! `wedgewatch merge` (issue 14): node A (proxy, router) and node B (prefill, decode) as
//! their own snapshots say them, merged: hops joined across nodes by TCP 4-tuple, requests
//! judged again so `wedged_request` names decode on node B with the path from node A's
//! proxy, clock skew estimated, bad input refused with exit 2.

use wedgewatch_testkit::fleet;

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

/// `wedgewatch merge A B --json`, which must succeed; its output.
fn merge_json(a: &Path, b: &Path) -> Value {
    let out = ww()
        .arg("merge")
        .arg(a)
        .arg(b)
        .arg("--json")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
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
    let v = merge_json(&a, &b);
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

/// A one-shot bundle has no node identity: the same snapshot given twice is still one
/// incident, not two nodes with a critical finding each (issue 37, item 6).
#[test]
fn one_snapshot_twice_without_node_identity_is_refused() {
    let d = tempfile::tempdir().unwrap();
    let mut old = node_b(1, 0, "waiting_first_byte", A_IP);
    old.as_object_mut().unwrap().remove("node");
    let b = write(d.path(), "b.json", &old);
    let b2 = write(d.path(), "b-copy.json", &old);
    refused(&[b.as_os_str(), b2.as_os_str()], "one snapshot twice");
}

#[test]
fn an_old_snapshot_without_node_identity_merges_under_its_file_name() {
    let d = tempfile::tempdir().unwrap();
    let mut old = node_b(1, 0, "waiting_first_byte", A_IP);
    old.as_object_mut().unwrap().remove("node");
    let b = write(d.path(), "engines-host.json", &old);
    let a = write(d.path(), "a.json", &node_a(1));
    let v = merge_json(&a, &b);
    assert_eq!(v["fleet"]["nodes"][1]["name"], "engines-host");
    assert_eq!(
        v["findings"][0]["component"],
        format!("engines-host/{DECODE}")
    );
}

/// Every output of `merge` goes through the redaction pass (issue 34 item 7): a token planted
/// in a node's snapshot (a hand-made file, or one redacted by older rules) does not come out
/// of `--json`, `-o -`, the report on stdout or the bundle.
#[test]
fn every_output_of_merge_is_redacted() {
    const TOKEN: &str = "hf_plantedMergeToken0123456789abcdefXYZ";
    let d = tempfile::tempdir().unwrap();
    let mut b = node_b(1, 0, "waiting_first_byte", A_IP);
    b["components"][1]["cmdline"] =
        serde_json::json!(["python3", "-m", "sglang.launch_server", TOKEN]);
    b["components"][1]["env"] = serde_json::json!({ "SOME_SETTING": TOKEN });
    b["findings"][0]["summary"] = Value::from(format!("stuck; echoed {TOKEN}"));
    let (a, b) = (
        write(d.path(), "a.json", &node_a(1)),
        write(d.path(), "b.json", &b),
    );
    let bundle = d.path().join("merged");
    let runs: [&[&std::ffi::OsStr]; 4] = [
        &["--json".as_ref()],
        &["-o".as_ref(), "-".as_ref()],
        &[],
        &["-o".as_ref(), bundle.as_os_str()],
    ];
    for extra in runs {
        let out = ww()
            .arg("merge")
            .arg(&a)
            .arg(&b)
            .args(extra)
            .output()
            .unwrap();
        let (stdout, stderr) = (
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
        );
        assert!(out.status.success(), "{extra:?}: {stderr}");
        assert!(
            !stdout.contains(TOKEN) && !stderr.contains(TOKEN),
            "{extra:?} leaks the token: {stdout}"
        );
        if extra.first() == Some(&"--json".as_ref()) {
            let v: Value = serde_json::from_str(&stdout).unwrap();
            let env = v["components"]
                .as_array()
                .unwrap()
                .iter()
                .find_map(|c| c["env"].get("SOME_SETTING"));
            assert_eq!(
                env,
                Some(&Value::from("<redacted>")),
                "the name stays visible"
            );
        }
    }
    for f in ["snapshot.json", "report.md"] {
        let text = std::fs::read_to_string(bundle.join(f)).unwrap();
        assert!(!text.contains(TOKEN), "{f} leaks the token");
    }
}

// ---- keep-alive legs seen mid-flight (issue 14: the false verdict at node a's router) ----

/// One exchange as a node's snapshot says it (`bytes_in` 0: seen mid-flight, size unknown).
#[allow(clippy::too_many_arguments)]
fn leg(
    id: &str,
    comp: &str,
    role: &str,
    client: &str,
    state: &str,
    at: i64,
    bytes_in: u64,
    links: &[&str],
) -> Value {
    let server = comp.split_once('@').map_or("", |(_, s)| s);
    serde_json::json!({"id": id, "component": comp, "client": client, "server": server,
        "state": state, "age_ms": (T0 - at) as f64, "bytes_in": bytes_in, "bytes_out": 0,
        "idle_out_ms": (T0 - at) as f64, "links": links, "role": role,
        "started_at": rfc(at), "request": format!("r{}", &id[1..]), "leg": format!("r{}@{role}", &id[1..])})
}

fn stuck(id: &str, leg_id: &str, comp: &str, role: &str) -> Value {
    let legs: Vec<&str> = [id, leg_id].into_iter().filter(|l| !l.is_empty()).collect();
    serde_json::json!({"id": format!("r{}", &leg_id[1..]), "legs": legs,
        "verdict": "stuck", "component": comp, "age_ms": 13_000.0, "probe": false,
        "stuck_leg": format!("r{}@{role}", &leg_id[1..]), "stuck_at": comp, "stuck_role": role,
        "stuck_kind": "no_response"})
}

fn conn(local_port: u64, remote: &str, sent_at: i64, recv_at: i64) -> Value {
    serde_json::json!({"component": ROUTER, "local": format!("{A_IP}:{local_port}"), "remote": remote,
        "state": "ESTABLISHED", "bytes_sent": 4_000, "bytes_received": 9_000,
        "last_send_at_ms": sent_at, "last_recv_at_ms": recv_at})
}

/// The two-node lab's noon wedge as a loaded machine saw it: three requests enter node a's
/// proxy, the router takes them on keep-alive connections (sizes unknown: seen mid-flight)
/// and node a judges them stuck at the router, the last hop it can see. The router
/// forwards each to decode on node b over a pooled connection; the third reuses one whose
/// previous answer ended in the same kernel tick (`last_send == last_recv`), and its router
/// exchange's start, read from another socket, is 2 ms after that send. `third` is how node
/// b saw that third decode leg.
fn keep_alive_pair(third: &str) -> (Value, Value) {
    let (t1, t2) = (T0 - 13_000, T0 - 12_600);
    let mut a = node_a(1);
    let dec = format!("{B_IP}:30002");
    let pre = format!("{B_IP}:30001");
    let mut reqs = Vec::new();
    let mut logical = Vec::new();
    for (k, (at, size)) in [(t1, 1_279), (t1, 1_120), (t2, 1_184)]
        .into_iter()
        .enumerate()
    {
        let (p, r) = (format!("x{}", 2 * k + 1), format!("x{}", 2 * k + 2));
        reqs.push(leg(
            &p,
            PROXY,
            "proxy",
            &format!("10.77.0.9:{}", 5_000 + k),
            "waiting_first_byte",
            at,
            size,
            &[&r],
        ));
        let mut rx = leg(
            &r,
            ROUTER,
            "router",
            &format!("{A_IP}:{}", 6_000 + k),
            "waiting_first_byte",
            at + 2,
            0,
            &[],
        );
        rx["client_component"] = serde_json::json!(PROXY);
        reqs.push(rx);
        logical.push(stuck(&p, &r, ROUTER, "router"));
        logical.last_mut().unwrap()["component"] = serde_json::json!(PROXY);
    }
    a["requests"] = Value::Array(reqs);
    a["logical_requests"] = Value::Array(logical);
    a["findings"][0]["requests"] = serde_json::json!(["r2", "r4", "r6"]);
    a["connections"] = serde_json::json!([
        // (the third before the second: its leg is joined while both older parents are free)
        conn(41_001, &dec, t1 + 3, t1 - 20),
        conn(41_003, &dec, t2, t2),
        conn(41_002, &dec, t1 + 3, t1 - 20),
        conn(42_001, &pre, t1 + 3, t1 + 40),
        conn(42_002, &pre, t1 + 3, t1 + 40),
        conn(42_003, &pre, t2, t2 + 30),
    ]);
    let mut b = node_b(1, 0, "waiting_first_byte", A_IP);
    let mut reqs = Vec::new();
    let mut logical = Vec::new();
    for k in 0..3u64 {
        let at = if k < 2 { t1 + 4 } else { t2 };
        let client = |port: u64| format!("{A_IP}:{port}");
        reqs.push(leg(
            &format!("x{}", 2 * k + 1),
            PREFILL,
            "prefill",
            &client(42_001 + k),
            "done",
            at,
            0,
            &[],
        ));
        let id = format!("x{}", 2 * k + 2);
        let state = if k < 2 { "waiting_first_byte" } else { third };
        if state == "idle" {
            // what is left of an exchange judged answered: an idle connection
            reqs.push(serde_json::json!({"id": format!("c{}", k + 1), "component": DECODE,
                "client": client(41_001 + k), "server": dec, "state": "idle", "age_ms": 4_000.0,
                "bytes_in": 0, "bytes_out": 0, "idle_out_ms": 12_600.0, "links": [], "role": "decode"}));
        } else {
            reqs.push(leg(
                &id,
                DECODE,
                "decode",
                &client(41_001 + k),
                state,
                at,
                0,
                &[],
            ));
        }
        if state == "waiting_first_byte" {
            logical.push(stuck("", &id, DECODE, "decode"));
        }
    }
    b["requests"] = Value::Array(reqs);
    b["logical_requests"] = Value::Array(logical);
    b["findings"][0]["requests"] = serde_json::json!(["r2", "r4"]);
    (a, b)
}

/// No stuck finding on node a: each of its stuck router legs went on to node b.
fn assert_nothing_stuck_on_node_a(s: &Snapshot) {
    for f in &s.findings {
        let on_a = f
            .component
            .as_deref()
            .is_some_and(|c| c.starts_with("nodea/"));
        let stuck = matches!(
            f.kind,
            FindingKind::WedgedRequest | FindingKind::StalledStream
        );
        assert!(!(on_a && stuck), "false verdict on node a: {f:#?}");
    }
}

#[test]
fn a_router_leg_forwarded_on_a_connection_answered_in_the_same_tick_is_not_blamed() {
    // node b judged the third decode leg answered (the tie read as "response last"), and
    // a later snapshot shows only its idle connection: node a's socket says the router's
    // send was the last thing on it, and no later byte came back.
    for third in ["done", "idle"] {
        let (a, b) = keep_alive_pair(third);
        let s = merged(&a, &b);
        assert_nothing_stuck_on_node_a(&s);
        let w = wedged(&s);
        assert_eq!(w.len(), 1, "{third}: {:#?}", s.findings);
        assert_eq!(w[0].component.as_deref(), Some(&*format!("nodeb/{DECODE}")));
        assert_eq!(w[0].requests.len(), 2, "{third}: {:?}", w[0].requests);
    }
}

#[test]
fn a_child_sent_a_tick_before_its_parents_start_is_joined_to_it_not_to_an_older_one() {
    let (a, b) = keep_alive_pair("waiting_first_byte");
    let s = merged(&a, &b);
    assert_nothing_stuck_on_node_a(&s);
    let w = wedged(&s);
    assert_eq!(w.len(), 1, "{:#?}", s.findings);
    assert_eq!(w[0].requests.len(), 3, "{:?}", w[0].requests);
    let full = format!(
        "nodea/{PROXY} [node nodea] -> nodea/{ROUTER} [node nodea] -> nodeb/{DECODE} [node nodeb]"
    );
    let paths: Vec<&str> = w[0]
        .evidence
        .iter()
        .filter(|e| e.detail.contains("path: "))
        .map(|e| e.detail.as_str())
        .collect();
    assert_eq!(paths.len(), 3);
    assert!(paths.iter().all(|p| p.ends_with(&full)), "{paths:#?}");
}
