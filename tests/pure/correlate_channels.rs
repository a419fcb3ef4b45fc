//! Connections to an engine's channels are not requests: decode's kept-alive session to
//! prefill's PD bootstrap server (a small `GET /route`, a whole small JSON answer, then the
//! connection kept open) and a KV transfer engine's stream (pages written in bursts, a few
//! status bytes back, silence between requests). Read as requests, the first is a
//! "headers-only" stream forgotten at prefill and the second requests that got no answer
//! (issues 38, 39). Shapes: `tests/fixtures/sglang-real/` (the real 0.5.23 pair).

use correl_common::*;
use wedgewatch::model::{
    Channel, ChannelKind, Component, Payload, Role, Sample, SocketEntry, SocketTable, SourceStatus,
    TcpInfo, TcpState, Topology,
};
use wedgewatch_testkit::correl as correl_common;

const BOOTSTRAP_PORT: u16 = 38998;
const PREFILL_PID: i32 = 300;
const DECODE_PID: i32 = 400;
const DECODE_SCHED_PID: i32 = 401;
const PREFILL_SCHED_PID: i32 = 301;
const KV_PORT: u16 = 41555;
const DECODE_SCHED: &str = "scheduler_TP0@decode@127.0.0.1:31012";

/// Bytes of a decode rank's `GET /route` and prefill's whole answer (`Content-Length: 44`)
/// on the real 0.5.23 pair, as the server's tcp_info counted them
/// (`tests/fixtures/sglang-real/`); then the session stays open and silent.
const ROUTE_REQUEST: u64 = 221;
const ROUTE_ANSWER: u64 = 203;

/// Prefill serving on 31011 with its bootstrap server on `BOOTSTRAP_PORT` (as discovery
/// builds it from `--disaggregation-bootstrap-port`); decode's scheduler with its KV
/// transfer engine's port (a child: every port a channel).
fn pd_with_channels(bootstrap_is_channel: bool) -> Topology {
    let mut t = pd_topology();
    for c in &mut t.components {
        if c.id == PREFILL {
            c.listen.push(format!("127.0.0.1:{BOOTSTRAP_PORT}"));
            if bootstrap_is_channel {
                c.channels.push(Channel {
                    addr: format!("127.0.0.1:{BOOTSTRAP_PORT}"),
                    kind: ChannelKind::Bootstrap,
                });
            }
        }
    }
    for c in &mut t.components {
        if c.id == DECODE {
            c.pids = vec![DECODE_PID];
        }
        if c.id == PREFILL {
            c.pids = vec![PREFILL_PID];
        }
    }
    let mut sched: Component = comp(
        DECODE_SCHED,
        Role::Scheduler,
        KV_PORT,
        &[DECODE_SCHED_PID],
        &[1],
    );
    sched.parent = Some(DECODE.into());
    sched.http_url = None;
    sched.channels.push(Channel {
        addr: format!("127.0.0.1:{KV_PORT}"),
        kind: ChannelKind::Internal,
    });
    t.components.push(sched);
    let mut psched = comp(
        "scheduler_TP0@prefill@127.0.0.1:31011",
        Role::Scheduler,
        0,
        &[PREFILL_SCHED_PID],
        &[0],
    );
    psched.parent = Some(PREFILL.into());
    psched.listen.clear();
    psched.http_url = None;
    t.components.push(psched);
    t
}

/// Both engines idle: nothing to do (their schedulers wait for work).
fn idle_schedulers(sim: &mut Sim) {
    for pid in [PREFILL_SCHED_PID, DECODE_SCHED_PID] {
        let mut s = stack(pid, sim.now, "idle", "recv_requests");
        s.threads[0].active = false;
        sim.ingest(wedgewatch::model::Payload::Stacks(vec![s]));
    }
}

/// A decode scheduler rank's bootstrap session: asked once, answered whole, kept open.
fn bootstrap_session(sim: &mut Sim) -> usize {
    let c = sim.connect(Some(DECODE_SCHED_PID), BOOTSTRAP_PORT, PREFILL_PID);
    sim.sample_sockets();
    sim.advance(50);
    sim.request(c, ROUTE_REQUEST);
    sim.advance(3);
    sim.respond(c, ROUTE_ANSWER);
    c
}

#[test]
fn a_bootstrap_session_is_no_request_at_any_age() {
    let mut sim = Sim::new(pd_with_channels(true));
    bootstrap_session(&mut sim);
    sim.run(120_000, idle_schedulers);

    assert_eq!(sim.model.exchanges().count(), 0, "no exchange on a channel");
    let parts = wedgewatch::pipeline::parts(&sim.model, sim.now);
    assert!(parts.findings.is_empty(), "{:?}", kinds(&parts.findings));
    let flows = &parts.channels;
    assert_eq!(flows.len(), 1, "{flows:?}");
    let f = &flows[0];
    // Between the engines: a scheduler rank's session is its engine's.
    assert_eq!(
        (f.from.as_deref(), f.to.as_str(), f.kind),
        (Some(DECODE), PREFILL, ChannelKind::Bootstrap)
    );
    assert_eq!(
        (f.connections, f.bytes_in, f.bytes_out),
        (1, ROUTE_REQUEST, ROUTE_ANSWER)
    );
    assert!(f.idle_ms.is_some_and(|ms| ms >= 119_000), "{f:?}");
}

/// The reason for the headers-only rule stays: the same bytes on a serving port are a stream
/// announced and never sent (what the bootstrap session was taken for before channels).
#[test]
fn the_same_bytes_on_a_serving_port_are_still_a_forgotten_stream() {
    let mut sim = Sim::new(pd_with_channels(false));
    bootstrap_session(&mut sim);
    sim.run(40_000, idle_schedulers);

    let parts = wedgewatch::pipeline::parts(&sim.model, sim.now);
    assert!(
        parts
            .findings
            .iter()
            .any(|f| f.kind.as_str() == "wedged_request" && f.component.as_deref() == Some(PREFILL)),
        "{:?}",
        kinds(&parts.findings)
    );
    assert!(parts.channels.is_empty());
}

/// Prefill's scheduler writes a request's KV pages into decode's Mooncake TCP transport in
/// slices (24-byte header + pages), each answered with 8 bytes of status, then silence until
/// the next request: the real pair's shape (82 slices per request per rank here).
fn kv_stream(sim: &mut Sim, requests: usize) -> usize {
    let c = sim.connect(Some(PREFILL_SCHED_PID), KV_PORT, DECODE_SCHED_PID);
    sim.sample_sockets();
    for _ in 0..requests {
        for _ in 0..82 {
            sim.request(c, 24 + 132);
            sim.respond(c, 8);
        }
        sim.advance(250);
        sim.sample_sockets();
    }
    c
}

#[test]
fn a_kv_transfer_stream_is_no_request_and_shows_as_a_transfer() {
    let mut sim = Sim::new(pd_with_channels(true));
    kv_stream(&mut sim, 2);
    sim.run(60_000, idle_schedulers);

    assert_eq!(sim.model.exchanges().count(), 0);
    let parts = wedgewatch::pipeline::parts(&sim.model, sim.now);
    assert!(parts.findings.is_empty(), "{:?}", kinds(&parts.findings));
    let f = &parts.channels[0];
    assert_eq!(
        (f.from.as_deref(), f.to.as_str(), f.kind),
        (Some(PREFILL), DECODE, ChannelKind::KvTransfer)
    );
    assert_eq!((f.bytes_in, f.bytes_out), (2 * 82 * (24 + 132), 2 * 82 * 8));
    assert!(f.idle_ms.is_some_and(|ms| ms >= 59_000), "{f:?}");
}

/// A stream that stops mid-transfer stays what it was: the port carried KV before.
#[test]
fn a_kv_stream_stopped_mid_slice_is_still_a_transfer() {
    let mut sim = Sim::new(pd_with_channels(true));
    let c = kv_stream(&mut sim, 1);
    sim.advance(5_000);
    sim.request(c, 24 + 66); // a header and half a slice, no answer
    sim.run(30_000, idle_schedulers);
    let parts = wedgewatch::pipeline::parts(&sim.model, sim.now);
    let f = &parts.channels[0];
    assert_eq!(f.kind, ChannelKind::KvTransfer, "{f:?}");
    assert!(f.idle_ms.is_some_and(|ms| ms >= 29_000), "{f:?}");
}

/// The same stream inside one engine (a collective between its ranks), or into an engine
/// whose flags say it only sends, is no KV transfer.
#[test]
fn the_shape_alone_is_not_enough() {
    let mut t = pd_with_channels(true);
    for c in &mut t.components {
        if c.id == PREFILL {
            c.labels.insert("kv_side".into(), "sender".into());
        }
        if c.id == DECODE {
            // decode's flags said it sends: a stream into it is something else
            c.labels.insert("kv_side".into(), "sender".into());
        }
    }
    let mut sim = Sim::new(t);
    kv_stream(&mut sim, 2);
    sim.run(1_000, idle_schedulers);
    let parts = wedgewatch::pipeline::parts(&sim.model, sim.now);
    assert_eq!(parts.channels[0].kind, ChannelKind::Internal);
}

/// Decode rank 0 pushes a TransferInfo per request to prefill's ZMQ PULL socket, which
/// answered its 92-byte handshake once: one way, a message queue, not a KV stream.
#[test]
fn a_zmq_push_pull_pair_is_no_request_and_no_transfer() {
    let mut t = pd_with_channels(true);
    let zmq = 41999;
    for c in &mut t.components {
        if c.id.starts_with("scheduler_TP0@prefill") {
            c.listen.push(format!("127.0.0.1:{zmq}"));
            c.channels.push(Channel {
                addr: format!("127.0.0.1:{zmq}"),
                kind: ChannelKind::Internal,
            });
        }
    }
    let mut sim = Sim::new(t);
    let c = sim.connect(Some(DECODE_SCHED_PID), zmq, PREFILL_SCHED_PID);
    sim.request(c, 92);
    sim.respond(c, 92);
    for _ in 0..200 {
        sim.advance(250);
        sim.request(c, 143);
        sim.sample_sockets();
    }
    sim.run(20_000, idle_schedulers);
    assert_eq!(sim.model.exchanges().count(), 0);
    let parts = wedgewatch::pipeline::parts(&sim.model, sim.now);
    assert!(parts.findings.is_empty(), "{:?}", kinds(&parts.findings));
    let f = &parts.channels[0];
    assert_eq!(
        (f.from.as_deref(), f.to.as_str(), f.kind),
        (Some(DECODE), PREFILL, ChannelKind::Internal)
    );
    assert_eq!((f.bytes_in, f.bytes_out), (92 + 200 * 143, 92));
}

/// The real 0.5.23 pair's connections as recorded (`tests/fixtures/sglang-real/
/// tcp-shapes.json`: every change of each server socket's tcp_info over 66 s of traffic),
/// replayed as socket tables into a model whose topology is the pair's as discovery builds
/// it: the Mooncake TCP streams are a KV transfer prefill -> decode, the ZMQ PUSH/PULL pairs
/// and the bootstrap sessions are channels, none is a request, nothing is found.
#[test]
fn the_real_pairs_recorded_channels_are_what_they_are() {
    let text = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/sglang-real/tcp-shapes.json"),
    )
    .expect("fixture");
    let rec: serde_json::Value = serde_json::from_str(&text).expect("fixture JSON");
    let kinds_kept = ["kv_mooncake_tcp", "pd_zmq", "pd_bootstrap_http"];
    let conns: Vec<&serde_json::Value> = rec["connections"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| kinds_kept.contains(&c["kind"].as_str().unwrap()))
        .collect();
    let mut model = wedgewatch::correlate::Correlator::default();
    model.set_topology(real_pair_topology(&rec));
    let mut times: Vec<f64> = conns
        .iter()
        .flat_map(|c| c["server_side_samples"].as_array().unwrap())
        .map(|s| s["t"].as_f64().unwrap())
        .collect();
    times.sort_by(f64::total_cmp);
    times.dedup();
    let at = |t: f64| T0 + (t * 1000.0) as i64;
    for &t in &times {
        let table = recorded_table(&conns, t);
        model.ingest(&Sample {
            t_ms: at(t),
            status: SourceStatus::ok(),
            took_ms: 3,
            payload: Payload::Sockets(table),
        });
    }
    let now = at(*times.last().unwrap());
    assert_eq!(model.exchanges().count(), 0, "a channel read as a request");
    let parts = wedgewatch::pipeline::parts(&model, now);
    assert!(parts.findings.is_empty(), "{:?}", kinds(&parts.findings));
    let (p, d) = ("prefill@127.0.0.1:42209", "decode@127.0.0.1:39147");
    let flow = |from: &str, to: &str, kind| {
        parts
            .channels
            .iter()
            .find(|f| f.from.as_deref() == Some(from) && f.to == to && f.kind == kind)
            .unwrap_or_else(|| panic!("no {kind} {from} -> {to}: {:#?}", parts.channels))
    };
    let kv = flow(p, d, ChannelKind::KvTransfer);
    assert_eq!(kv.connections, 8, "4 pooled per decode rank");
    assert!(kv.bytes_in > 20 * kv.bytes_out / 2, "{kv:?}");
    assert_eq!(
        flow(p, d, ChannelKind::Internal).connections,
        2,
        "status PUSH"
    );
    assert_eq!(
        flow(d, p, ChannelKind::Internal).connections,
        2,
        "TransferInfo PUSH"
    );
    assert_eq!(
        flow(d, p, ChannelKind::Bootstrap).connections,
        4,
        "route + heartbeat"
    );
    assert_eq!(parts.channels.len(), 4, "{:#?}", parts.channels);
}

/// The pair's components as discovery builds them from the recorded listeners: engines with
/// their serving port (prefill's bootstrap port a channel, their KV sides from the flags),
/// scheduler ranks whose every port is a channel.
fn real_pair_topology(rec: &serde_json::Value) -> Topology {
    let listeners = rec["listeners"].as_array().unwrap();
    let listen_of = |pid: i64| -> Vec<String> {
        listeners
            .iter()
            .filter(|l| l["pid"].as_i64() == Some(pid))
            .map(|l| l["addr"].as_str().unwrap().replace("*:", "0.0.0.0:"))
            .collect()
    };
    let engine = |id: &str, role, pid: i32, side: &str| {
        let mut c = Component::new(id, role, "sglang");
        c.pids = vec![pid];
        c.main_pid = Some(pid);
        c.listen = listen_of(pid as i64);
        c.labels.insert("kv_side".into(), side.into());
        c
    };
    let mut prefill = engine("prefill@127.0.0.1:42209", Role::Prefill, 9609, "sender");
    prefill.channels.push(Channel {
        addr: "127.0.0.1:37471".into(),
        kind: ChannelKind::Bootstrap,
    });
    let decode = engine("decode@127.0.0.1:39147", Role::Decode, 9610, "receiver");
    let sched = |name: &str, parent: &str, pid: i32| {
        let mut c = Component::new(format!("{name}@{parent}"), Role::Scheduler, "sglang");
        c.pids = vec![pid];
        c.main_pid = Some(pid);
        c.parent = Some(parent.into());
        c.listen = listen_of(pid as i64);
        c.channels = c
            .listen
            .iter()
            .map(|a| Channel {
                addr: a.clone(),
                kind: ChannelKind::Internal,
            })
            .collect();
        c
    };
    Topology {
        components: vec![
            sched("scheduler", &prefill.id, 10205),
            sched("scheduler_TP0", &decode.id, 10193),
            sched("scheduler_TP1", &decode.id, 10194),
            prefill,
            decode,
        ],
        edges: Vec::new(),
    }
}

/// The recorded connections at `t` (seconds): each one's newest sample at or before `t`,
/// its silences grown since, as the server's socket and the client's (its owner only).
fn recorded_table(conns: &[&serde_json::Value], t: f64) -> SocketTable {
    let mut sockets = Vec::new();
    for c in conns {
        let Some(s) = c["server_side_samples"]
            .as_array()
            .unwrap()
            .iter()
            .rfind(|s| s["t"].as_f64().unwrap() <= t)
        else {
            continue;
        };
        let num = |k: &str| s[k].as_u64().unwrap_or(0);
        // A direction that never carried data: the kernel's huge "since" (no time).
        let grown = |k: &str| match s[k].as_u64() {
            Some(ms) => (ms as f64 + (t - s["t"].as_f64().unwrap()) * 1000.0) as u32,
            None => u32::MAX - 1,
        };
        let client = c["client"]["addr"].as_str().unwrap().to_string();
        let port = c["listen"].as_str().unwrap().rsplit(':').next().unwrap();
        let server = format!("{}:{port}", client.rsplit_once(':').unwrap().0);
        let entry = |local: &str, remote: &str, pid: i64, info| SocketEntry {
            local: local.into(),
            remote: remote.into(),
            state: TcpState::Established,
            rx_queue: 0,
            tx_queue: 0,
            inode: 1,
            uid: 0,
            pid: Some(pid as i32),
            netns: None,
            tcp_info: info,
        };
        sockets.push(entry(
            &server,
            &client,
            c["server"]["pid"].as_i64().unwrap(),
            Some(TcpInfo {
                bytes_acked: num("bytes_acked"),
                bytes_received: num("bytes_received"),
                bytes_sent: num("bytes_acked"),
                last_data_sent_ms: grown("lastsnd"),
                last_data_recv_ms: grown("lastrcv"),
                last_ack_recv_ms: grown("lastsnd"),
                ..Default::default()
            }),
        ));
        sockets.push(entry(
            &client,
            &server,
            c["client"]["pid"].as_i64().unwrap(),
            None,
        ));
    }
    SocketTable {
        sockets,
        notes: Vec::new(),
    }
}
