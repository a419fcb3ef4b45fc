//! `accumulating_state` against built models: growth over a window, held CLOSE_WAIT
//! sockets in one look, and the two merged.

use super::*;
use crate::model::{Component, Payload, Role, Sample, SourceStatus, TcpInfo, Thresholds, Topology};

const T: Millis = 1_795_963_800_000;

fn topo() -> Topology {
    let mut proxy = Component::new("proxy@127.0.0.1:8000", Role::Proxy, "generic");
    proxy.pids = vec![100];
    proxy.main_pid = Some(100);
    proxy.listen = vec!["127.0.0.1:8000".into()];
    let mut router = Component::new("router@127.0.0.1:30000", Role::Router, "sglang");
    router.pids = vec![200];
    router.main_pid = Some(200);
    router.listen = vec!["127.0.0.1:30000".into()];
    Topology {
        components: vec![proxy, router],
        edges: vec![],
    }
}

/// A proxy's upstream socket to the router in CLOSE_WAIT, silent `silent_ms`.
fn close_wait(port: u16, silent_ms: u32) -> SocketEntry {
    SocketEntry {
        local: format!("127.0.0.1:{port}"),
        remote: "127.0.0.1:30000".into(),
        state: TcpState::CloseWait,
        rx_queue: 0,
        tx_queue: 0,
        inode: u64::from(port),
        uid: 0,
        pid: Some(100),
        netns: None,
        tcp_info: Some(TcpInfo {
            bytes_acked: 526,
            bytes_received: 3497,
            bytes_sent: 525,
            last_data_sent_ms: silent_ms + 400,
            last_data_recv_ms: silent_ms,
            last_ack_recv_ms: silent_ms,
            ..Default::default()
        }),
    }
}

/// The router's end of the same connection after its close (orphaned, no pid).
fn fin_wait2(port: u16) -> SocketEntry {
    SocketEntry {
        local: "127.0.0.1:30000".into(),
        remote: format!("127.0.0.1:{port}"),
        state: TcpState::FinWait2,
        pid: None,
        inode: 0,
        tcp_info: None,
        ..close_wait(port, 0)
    }
}

fn run(sockets: Vec<SocketEntry>, th: Thresholds) -> Vec<Finding> {
    let mut m = Correlator::new(th);
    m.set_topology(topo());
    m.ingest(&Sample {
        t_ms: T,
        status: SourceStatus::ok(),
        took_ms: 3,
        payload: Payload::Sockets(SocketTable {
            sockets,
            notes: vec![],
        }),
    });
    // One second after the table: its "ms ago" values have aged by that much.
    let v = m.view(T + 1000);
    accumulating_state(&m, &v)
}

#[test]
fn many_long_silent_close_wait_sockets_fire_in_one_look() {
    let mut s: Vec<SocketEntry> = (0..24u16)
        .map(|i| close_wait(41000 + i, 40_000 + u32::from(i) * 1000))
        .collect();
    // Half the router's ends are still in FIN_WAIT2, the others gone.
    s.extend((0..12u16).map(|i| fin_wait2(41000 + i)));
    let fs = run(s, Thresholds::default());
    assert_eq!(fs.len(), 1, "{fs:#?}");
    let f = &fs[0];
    assert_eq!(f.kind, FindingKind::AccumulatingState);
    assert_eq!(f.component.as_deref(), Some("proxy@127.0.0.1:8000"));
    assert!(
        f.summary.contains("holds 24 sockets in CLOSE_WAIT")
            && f.summary.contains("24 to router@127.0.0.1:30000")
            && f.summary.contains("silent 41 s to 64 s"),
        "{}",
        f.summary
    );
    let ev: Vec<&str> = f.evidence.iter().map(|e| e.detail.as_str()).collect();
    let all = ev.join("\n");
    assert!(all.contains("one look, no history needed"), "{all}");
    // The most silent socket first, with its clocks (aged by the second since the table).
    assert!(
        ev[1].starts_with("127.0.0.1:41023 -> 127.0.0.1:30000 (to router@127.0.0.1:30000): CLOSE_WAIT, silent 64 s")
            && ev[1].contains("last byte out 64 s ago")
            && ev[1].contains("fd held by pid 100")
            && ev[1].contains("peer socket gone"),
        "{}",
        ev[1]
    );
    assert!(all.contains("... and 16 more CLOSE_WAIT sockets"), "{all}");
    assert!(
        all.contains("fds held against peers that are gone: 24 of 24 (peer closed by its process (FIN_WAIT2, kernel only): 12, peer socket gone: 12)"),
        "{all}"
    );
}

#[test]
fn a_handful_or_fresh_ones_do_not_fire() {
    // A few long-silent ones: a client pool closing idle connections lazily.
    let few: Vec<SocketEntry> = (0..5u16).map(|i| close_wait(41000 + i, 600_000)).collect();
    assert!(run(few, Thresholds::default()).is_empty());
    // Many, but fresh: closes in progress under load.
    let fresh: Vec<SocketEntry> = (0..40u16).map(|i| close_wait(41000 + i, 20)).collect();
    assert!(run(fresh, Thresholds::default()).is_empty());
    // Many just under the silence threshold (the table's age counts).
    let under: Vec<SocketEntry> = (0..40u16).map(|i| close_wait(41000 + i, 28_900)).collect();
    assert!(run(under, Thresholds::default()).is_empty());
}

#[test]
fn without_tcp_info_the_age_is_unknown_and_nothing_fires() {
    let s: Vec<SocketEntry> = (0..30u16)
        .map(|i| SocketEntry {
            tcp_info: None,
            ..close_wait(41000 + i, 0)
        })
        .collect();
    assert!(run(s, Thresholds::default()).is_empty());
}

#[test]
fn thresholds_are_configurable() {
    let s: Vec<SocketEntry> = (0..4u16).map(|i| close_wait(41000 + i, 6_000)).collect();
    let th = Thresholds::from_toml(
        "accumulate_close_wait_silent_min = 3\naccumulate_close_wait_silent_ms = 5000\n",
    )
    .expect("thresholds");
    let fs = run(s.clone(), th);
    assert_eq!(fs.len(), 1, "{fs:#?}");
    assert!(fs[0].evidence[0].detail.contains("fires at 3"), "{fs:#?}");
    assert!(run(s, Thresholds::default()).is_empty());
}

/// A socket table captured from the lab (`tests/fixtures/sockets/`, see its `source`),
/// ingested at its time and looked at right then.
fn lab_capture(json: &str, th: Thresholds) -> Vec<Finding> {
    let v: serde_json::Value = serde_json::from_str(json).expect("fixture JSON");
    let t = v["taken_at_ms"].as_i64().expect("taken_at_ms");
    let topo: Topology = serde_json::from_value(v["topology"].clone()).expect("topology");
    let table: SocketTable = serde_json::from_value(v["sockets"].clone()).expect("sockets");
    let mut m = Correlator::new(th);
    m.set_topology(topo);
    m.ingest(&Sample {
        t_ms: t,
        status: SourceStatus::ok(),
        took_ms: 3,
        payload: Payload::Sockets(table),
    });
    accumulating_state(&m, &m.view(t))
}

const HELD: &str = include_str!("../../../../../tests/fixtures/sockets/close-wait-held.json");
const FRESH: &str = include_str!("../../../../../tests/fixtures/sockets/close-wait-fresh.json");

#[test]
fn lab_capture_of_held_close_wait_names_the_proxy() {
    let fs = lab_capture(HELD, Thresholds::default());
    assert_eq!(fs.len(), 1, "{fs:#?}");
    let f = &fs[0];
    assert_eq!(f.component.as_deref(), Some("proxy@127.0.0.1:27318"));
    assert_eq!(f.role, Some(Role::Proxy));
    assert_eq!(
        f.summary,
        "proxy@127.0.0.1:27318 holds 24 sockets in CLOSE_WAIT (24 to router@127.0.0.1:22291), \
         silent 39 s to 40 s: the peer hung up and it never closed them"
    );
    let lines: Vec<&str> = f.evidence.iter().map(|e| e.detail.as_str()).collect();
    let listed: Vec<&&str> = lines
        .iter()
        .filter(|l| {
            l.contains("-> 127.0.0.1:22291 (to router@127.0.0.1:22291): CLOSE_WAIT, silent 40 s")
        })
        .collect();
    assert_eq!(listed.len(), LISTED_SOCKETS, "{lines:#?}");
    assert!(
        listed.iter().all(|l| l.contains("fd held by pid 6071")
            && l.ends_with("peer closed by its process (FIN_WAIT2, kernel only)")),
        "{listed:#?}"
    );
    assert!(
        lines.contains(&"fds held against peers that are gone: 24 of 24 (peer closed by its process (FIN_WAIT2, kernel only): 24)"),
        "{lines:#?}"
    );
}

#[test]
fn lab_capture_of_the_same_leak_seconds_old_says_nothing_yet() {
    assert!(lab_capture(FRESH, Thresholds::default()).is_empty());
    // The same 24 sockets count once they are old enough: age, not count, held it back.
    let mut th = Thresholds::default();
    th.detect.accumulate_close_wait_silent_ms = 3000;
    let fs = lab_capture(FRESH, th);
    assert_eq!(fs.len(), 1, "{fs:#?}");
    assert!(
        fs[0].summary.contains("holds 24 sockets"),
        "{}",
        fs[0].summary
    );
}

#[test]
fn growth_and_held_sockets_on_one_component_are_one_finding() {
    // A daemon watching the leak for 6 minutes: one more held socket every 10 s.
    let mut m = Correlator::new(Thresholds::default());
    m.set_topology(topo());
    for i in 0..36u16 {
        let sockets = (0..i)
            .map(|j| close_wait(41000 + j, u32::from(i - j) * 10_000))
            .collect();
        m.ingest(&Sample {
            t_ms: T + i64::from(i) * 10_000,
            status: SourceStatus::ok(),
            took_ms: 3,
            payload: Payload::Sockets(SocketTable {
                sockets,
                notes: vec![],
            }),
        });
    }
    let v = m.view(T + 350_000);
    let fs = accumulating_state(&m, &v);
    assert_eq!(fs.len(), 1, "{fs:#?}");
    assert!(
        fs[0].summary.contains("CLOSE_WAIT sockets grew from"),
        "{}",
        fs[0].summary
    );
    assert!(
        fs[0].evidence.iter().any(|e| e
            .detail
            .starts_with("one look, no history needed: 33 sockets")),
        "{:#?}",
        fs[0].evidence
    );
}

#[test]
fn a_stale_table_says_nothing_about_now() {
    let s: Vec<SocketEntry> = (0..24u16).map(|i| close_wait(41000 + i, 60_000)).collect();
    let mut m = Correlator::new(Thresholds::default());
    m.set_topology(topo());
    m.ingest(&Sample {
        t_ms: T,
        status: SourceStatus::ok(),
        took_ms: 3,
        payload: Payload::Sockets(SocketTable {
            sockets: s,
            notes: vec![],
        }),
    });
    let v = m.view(T + 3_600_000);
    assert!(!v.sockets_fresh);
    assert!(accumulating_state(&m, &v).is_empty());
}

#[test]
fn inbound_sockets_name_their_client_and_unknown_peers_are_not_called_gone() {
    // The router holds connections from the proxy (whose end is still there, FIN_WAIT2)
    // and to a host elsewhere (cannot be judged from here).
    let mut s = Vec::new();
    for i in 0..3u16 {
        s.push(SocketEntry {
            local: "127.0.0.1:30000".into(),
            remote: format!("127.0.0.1:{}", 42000 + i),
            pid: Some(200),
            ..close_wait(0, 50_000)
        });
        s.push(SocketEntry {
            local: format!("127.0.0.1:{}", 42000 + i),
            remote: "127.0.0.1:30000".into(),
            state: TcpState::FinWait2,
            pid: Some(100),
            ..close_wait(0, 0)
        });
        s.push(SocketEntry {
            local: format!("10.0.0.5:{}", 43000 + i),
            remote: "10.0.0.9:443".into(),
            pid: Some(200),
            ..close_wait(0, 50_000)
        });
    }
    // An outside client (its socket is on its own host): one group whatever its ports.
    for i in 0..2u16 {
        s.push(SocketEntry {
            local: "127.0.0.1:30000".into(),
            remote: format!("10.0.0.7:{}", 50000 + i),
            pid: Some(200),
            ..close_wait(0, 50_000)
        });
    }
    let mut th = Thresholds::default();
    th.detect.accumulate_close_wait_silent_min = 8;
    let fs = run(s, th);
    assert_eq!(fs.len(), 1, "{fs:#?}");
    assert!(
        fs[0]
            .summary
            .contains("(3 from proxy@127.0.0.1:8000, 3 to 10.0.0.9:443, 2 from 10.0.0.7)"),
        "{}",
        fs[0].summary
    );
    let all: Vec<&str> = fs[0].evidence.iter().map(|e| e.detail.as_str()).collect();
    assert!(
        all.iter().any(|d| d.contains(
            "0 of 8 (peer half-closed (FIN_WAIT2), still held by pid 100: 3, peer not on this host: 5)"
        )),
        "{all:#?}"
    );
}

#[test]
fn a_leak_toward_many_places_names_the_biggest_three() {
    let mut s = Vec::new();
    for (i, host) in [
        "10.0.0.9",
        "10.0.0.9",
        "10.0.0.9",
        "10.0.0.10",
        "10.0.0.11",
        "10.0.0.12",
    ]
    .iter()
    .enumerate()
    {
        s.push(SocketEntry {
            local: format!("127.0.0.1:{}", 44000 + i),
            remote: format!("{host}:443"),
            ..close_wait(0, 50_000)
        });
    }
    let mut th = Thresholds::default();
    th.detect.accumulate_close_wait_silent_min = 6;
    let fs = run(s, th);
    assert_eq!(fs.len(), 1, "{fs:#?}");
    assert!(
        fs[0]
            .summary
            .contains("(3 to 10.0.0.9:443, 1 to 10.0.0.10:443, 1 to 10.0.0.11:443, 1 elsewhere)"),
        "{}",
        fs[0].summary
    );
}
