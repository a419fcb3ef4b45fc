//! Connections to an engine's channels are not requests: decode's kept-alive session to
//! prefill's PD bootstrap server (a small `GET /route`, a whole small JSON answer, then the
//! connection kept open) and a KV transfer engine's stream (pages written in bursts, a few
//! status bytes back, silence between requests). Read as requests, the first is a
//! "headers-only" stream forgotten at prefill and the second requests that got no answer
//! (issues 38, 39). Shapes: `tests/fixtures/sglang-real/` (the real 0.5.23 pair).

use correl_common::*;
use wedgewatch::model::{Channel, ChannelKind, Component, Role, Topology};
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
    assert_eq!(
        (f.from.as_deref(), f.to.as_str(), f.kind),
        (Some(DECODE_SCHED), PREFILL, ChannelKind::Bootstrap)
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

#[test]
fn a_kv_transfer_stream_is_no_request() {
    let mut sim = Sim::new(pd_with_channels(true));
    // Prefill's scheduler writes a request's KV pages into decode's Mooncake TCP transport
    // in bursts (24-byte header + pages), each write answered with an 8-byte status; then
    // silence until the next request (the real pair's shape).
    let c = sim.connect(Some(PREFILL_SCHED_PID), KV_PORT, DECODE_SCHED_PID);
    sim.sample_sockets();
    for _ in 0..8 {
        sim.advance(250);
        sim.request(c, 24 + 512);
        sim.respond(c, 8);
        sim.sample_sockets();
    }
    sim.run(60_000, idle_schedulers);

    assert_eq!(sim.model.exchanges().count(), 0);
    let parts = wedgewatch::pipeline::parts(&sim.model, sim.now);
    assert!(parts.findings.is_empty(), "{:?}", kinds(&parts.findings));
    let f = &parts.channels[0];
    assert_eq!(
        (f.from.as_deref(), f.to.as_str(), f.kind),
        (
            Some("scheduler_TP0@prefill@127.0.0.1:31011"),
            DECODE_SCHED,
            ChannelKind::Internal
        )
    );
    assert_eq!((f.bytes_in, f.bytes_out), (8 * (24 + 512), 8 * 8));
}
