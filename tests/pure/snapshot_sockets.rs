//! Issue 15: a snapshot's raw socket table holds the stack's sockets only (owned by a
//! component's process, or at a component's listen address in its namespace) and says how
//! many others it left out; the stack's closed connections nobody owns (TIME_WAIT churn at
//! the proxy's port) are counted per component, not listed. In a one-shot snapshot's parts,
//! in a bundle's `raw/sockets.json` and in the answer a daemon serves (read back as a
//! client reads it).

use wedgewatch_testkit::correl as correl_common;

use correl_common::*;
use std::sync::Mutex;
use wedgewatch::daemon::protocol::Request;
use wedgewatch::daemon::{self, Shared};
use wedgewatch::model::*;
use wedgewatch::snapshot::{self, AssembleOptions, Overwrite};

/// A socket of `pid` (None: no owner known) in `state`, without tcp_info (as TIME_WAIT is).
fn sock(local: &str, remote: &str, pid: Option<i32>, state: TcpState) -> SocketEntry {
    SocketEntry {
        local: local.into(),
        remote: remote.into(),
        state,
        rx_queue: 0,
        tx_queue: 0,
        inode: 9,
        uid: 0,
        pid,
        netns: None,
        tcp_info: None,
    }
}

/// Sockets of the host that are not the stack's: two unrelated processes talking, and the
/// TIME_WAIT churn of another client and server (no owner left), `n` of them.
fn foreign(n: u16) -> Vec<SocketEntry> {
    let mut v = vec![
        sock(
            "10.0.0.5:5432",
            "10.0.0.6:41000",
            Some(999),
            TcpState::Established,
        ),
        sock(
            "10.0.0.6:41000",
            "10.0.0.5:5432",
            Some(998),
            TcpState::Established,
        ),
    ];
    for i in 0..n {
        v.push(sock(
            &format!("127.0.0.1:{}", 50000 + i),
            "127.0.0.1:6379",
            None,
            TcpState::TimeWait,
        ));
    }
    v
}

/// The proxy's end of `n` connections it closed (TIME_WAIT: no owner, no counters).
fn closed_at_proxy(n: u16) -> Vec<SocketEntry> {
    (0..n)
        .map(|i| {
            sock(
                "127.0.0.1:8000",
                &format!("127.0.0.1:{}", 45000 + i),
                None,
                TcpState::TimeWait,
            )
        })
        .collect()
}

/// A PD stack with one connection proxy -> router, `n + 2` foreign sockets and `n / 2`
/// closed connections at the proxy in its table.
fn sim_with_foreign(n: u16) -> Sim {
    let mut sim = Sim::new(pd_topology());
    let c = sim.connect(Some(100), 30000, 200);
    sim.request(c, 900);
    for _ in 0..4 {
        sim.advance(250);
        let mut table = sim.socket_table();
        table.sockets.extend(foreign(n));
        table.sockets.extend(closed_at_proxy(n / 2));
        sim.ingest(Payload::Sockets(table));
    }
    sim
}

fn raw_sockets(raw: &std::collections::BTreeMap<String, serde_json::Value>) -> SocketTable {
    serde_json::from_value(raw["sockets"].clone()).expect("a socket table")
}

/// None of the foreign sockets, the stack's own (the router's listener, both ends of the
/// proxy's connection), a note with the count left out, and the closed connections at the
/// proxy counted, not listed.
fn assert_stack_only(t: &SocketTable, omitted: usize, closed: usize) {
    let foreign = |e: &SocketEntry| {
        e.local.starts_with("10.0.0.") || e.remote.ends_with(":6379") || e.pid == Some(999)
    };
    assert!(!t.sockets.iter().any(foreign), "{:?}", t.sockets);
    assert!(t.sockets.iter().any(|e| e.local == "127.0.0.1:30000"));
    assert!(t.sockets.iter().any(|e| e.remote == "127.0.0.1:30000"));
    let note = format!("{omitted} sockets not of the stack omitted");
    assert!(
        t.notes.iter().any(|n| n.starts_with(&note)),
        "no {note:?} in {:?}",
        t.notes
    );
    assert!(!t.sockets.iter().any(|e| e.state == TcpState::TimeWait));
    let note = format!("{closed} closed connections (TIME_WAIT, owned by no process) counted, not listed: {PROXY} {closed}");
    assert!(t.notes.contains(&note), "no {note:?} in {:?}", t.notes);
}

#[test]
fn a_one_shot_snapshot_and_its_bundle_leave_foreign_sockets_out_and_count_them() {
    let sim = sim_with_foreign(300);
    let parts = wedgewatch::pipeline::parts(&sim.model, sim.now);
    assert_stack_only(&raw_sockets(&parts.raw), 302, 150);
    let bundle = snapshot::assemble_bundle(parts, &AssembleOptions::default());
    assert_stack_only(&raw_sockets(&bundle.raw), 302, 150);
    let dir = tempfile::tempdir().expect("tmp");
    let out = dir.path().join("b");
    snapshot::write_bundle(&bundle.snapshot, &bundle.raw, &out, Overwrite::Refuse).expect("bundle");
    let text = std::fs::read_to_string(out.join("raw/sockets.json")).expect("raw/sockets.json");
    let t: SocketTable = serde_json::from_str(&text).expect("a table");
    assert_stack_only(&t, 302, 150);
}

#[test]
fn a_served_snapshot_leaves_foreign_sockets_out_and_a_client_reads_its_bytes() {
    let sim = sim_with_foreign(40);
    let now = sim.now;
    let shared = Mutex::new(Shared::new(sim.model, T0));
    let stats = wedgewatch::sampler::StatsHandle::default();
    let req = Request::Snapshot { window_s: None };
    let bytes = daemon::respond_bytes(&req, &shared, &stats, now);
    let parts = daemon::answer::parts_from_bytes(&bytes, std::path::Path::new("/x"))
        .expect("parts from the bytes");
    assert_stack_only(&raw_sockets(&parts.raw), 42, 20);
    // the bytes are the same answer as the in-process one, field for field
    let v: serde_json::Value = serde_json::from_slice(&bytes).expect("json");
    let same = daemon::respond(&req, &shared, &stats, now);
    assert_eq!(v["schema"], same["schema"]);
    assert_eq!(v["parts"]["raw"], same["parts"]["raw"]);
    assert_eq!(v["parts"]["requests"], same["parts"]["requests"]);
    assert_eq!(v["daemon"]["started_ms"], serde_json::json!(T0));
    // a daemon's error reaches the client as an error naming the socket
    let e = daemon::answer::parts_from_bytes(br#"{"error":"busy"}"#, std::path::Path::new("/s"))
        .expect_err("an error");
    assert!(e.to_string().contains("daemon at /s: busy"), "{e}");
}

/// `json`: the daemon assembles and redacts the snapshot itself and a client prints its
/// bytes. They are the snapshot a one-shot assembly of the same model at the same instant
/// gives (the requests open, their logical requests and verdicts, the findings, the
/// components), with this node's identity, and a client checks them whole.
#[test]
fn a_served_json_snapshot_is_the_one_shot_snapshot_of_the_same_model() {
    let mut sim = sim_with_foreign(40);
    let c = sim.connect(Some(100), 30000, 200);
    sim.request(c, 700);
    sim.advance(250);
    sim.ingest(Payload::Sockets(sim.socket_table()));
    let now = sim.now;
    let one_shot = snapshot::assemble(
        wedgewatch::pipeline::parts(&sim.model, now),
        &AssembleOptions::default(),
    );
    let shared = Mutex::new(Shared::new(sim.model, T0));
    let stats = wedgewatch::sampler::StatsHandle::default();
    let bytes = daemon::respond_bytes(&Request::Json { window_s: None }, &shared, &stats, now);
    let served = daemon::answer::check_snapshot_bytes(bytes.clone(), std::path::Path::new("/x"))
        .expect("a whole snapshot");
    let s: Snapshot = serde_json::from_slice(&served.bytes).expect("the contract");
    assert!(
        one_shot
            .requests
            .iter()
            .any(|r| r.state != RequestState::Closed),
        "requests open: {:?}",
        one_shot.requests
    );
    assert_eq!(s.requests, one_shot.requests);
    assert_eq!(s.logical_requests, one_shot.logical_requests);
    assert_eq!(s.findings, one_shot.findings);
    assert_eq!(served.findings, one_shot.findings);
    assert_eq!(s.components, one_shot.components);
    assert_eq!((s.taken_at, s.redacted), (one_shot.taken_at, true));
    assert!(s.node.is_some(), "the daemon's node: this one");
    // printed as `snapshot --json` prints a one-shot snapshot
    let text = String::from_utf8(served.bytes).expect("utf-8");
    assert!(
        text.starts_with("{\n  \"schema\": \"wedgewatch.snapshot/1\""),
        "{text:.80}"
    );
    // a truncated answer, an error and a foreign document are refused, never printed
    let cut = bytes[..bytes.len() / 2].to_vec();
    let p = std::path::Path::new("/s");
    assert!(daemon::answer::check_snapshot_bytes(cut, p).is_err());
    let e = daemon::answer::check_snapshot_bytes(br#"{"error":"busy"}"#.to_vec(), p)
        .expect_err("an error");
    assert!(e.to_string().contains("daemon at /s: busy"), "{e}");
    let other = br#"{"schema":"wedgewatch.daemon/1","parts":{}}"#.to_vec();
    assert!(daemon::answer::check_snapshot_bytes(other, p).is_err());
}
