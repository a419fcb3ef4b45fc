//! A response that sent its headers (a stream announced) and then nothing is an open exchange
//! waiting on the server, not an idle keep-alive connection: the byte sequences below are the
//! ones recorded with `ss -tin` on the real vLLM tier (tests/vllm_real.rs, docs/lab.md
//! "Real vLLM"): a streaming chat request of 267 bytes, `200` + event-stream headers of 163
//! bytes 16 ms later, then silence (LAB_VLLM_FORGET_AFTER); a healthy stream of the same
//! request sends 1452 bytes in all, a non-streaming answer 834, vLLM's 404 286.

use correl_common::*;
use wedgewatch::correlate::HEADERS_ONLY_MAX_BYTES;
use wedgewatch::model::{Component, RequestState, Role, Topology};
use wedgewatch_testkit::correl as correl_common;

const VLLM: &str = "vllm@127.0.0.1:8000";
const API_PID: i32 = 500;
const ENGINE_CORE_PID: i32 = 501;

/// Recorded on the real tier (see the module docs).
const STREAM_REQUEST: u64 = 267;
const STREAM_HEADERS: u64 = 163;
const STREAM_WHOLE: u64 = 1452;
const ERROR_404_WHOLE: u64 = 286;

fn vllm_topology() -> Topology {
    let mut c: Component = comp(VLLM, Role::Engine, 8000, &[API_PID, ENGINE_CORE_PID], &[]);
    c.stack = "vllm".into();
    Topology {
        components: vec![c],
        edges: Vec::new(),
    }
}

/// The engine core's main thread, idle on its input queue (as py-spy shows it).
fn idle_engine_core(sim: &mut Sim) {
    let mut s = stack(ENGINE_CORE_PID, sim.now, "idle", "_process_input_queue");
    s.threads[0].active = false;
    sim.ingest(wedgewatch::model::Payload::Stacks(vec![s]));
}

fn state_of(sim: &Sim, id: &str) -> Option<RequestState> {
    sim.model.view(sim.now).request(id).map(|r| r.state)
}

#[test]
fn recorded_sizes_sit_on_the_right_side_of_the_bound() {
    const { assert!(STREAM_HEADERS <= HEADERS_ONLY_MAX_BYTES) };
    const { assert!(ERROR_404_WHOLE > HEADERS_ONLY_MAX_BYTES) };
}

#[test]
fn forgotten_stream_after_its_headers_waits_and_is_wedged() {
    let mut sim = Sim::new(vllm_topology());
    let c = sim.connect(None, 8000, API_PID);
    sim.sample_sockets(); // opened, nothing asked yet
    sim.advance(100);
    sim.request(c, STREAM_REQUEST);
    sim.advance(16);
    sim.respond(c, STREAM_HEADERS);
    sim.run(31_000, idle_engine_core);

    let xs: Vec<_> = sim.model.exchanges().cloned().collect();
    assert_eq!(xs.len(), 1, "{xs:#?}");
    assert_eq!(
        (xs[0].bytes_in, xs[0].bytes_out),
        (STREAM_REQUEST, STREAM_HEADERS)
    );
    assert!(xs[0].headers_only() && xs[0].awaiting_body() && !xs[0].answered());
    assert_eq!(
        state_of(&sim, &xs[0].id),
        Some(RequestState::WaitingFirstByte)
    );
    let v = sim.model.view(sim.now);
    assert!(v.idle.is_empty(), "not an idle connection: {:?}", v.idle);

    let parts = wedgewatch::pipeline::parts(&sim.model, sim.now);
    let f = parts
        .findings
        .iter()
        .find(|f| f.kind.as_str() == "wedged_request")
        .unwrap_or_else(|| panic!("no wedged_request: {:?}", kinds(&parts.findings)));
    assert_eq!(f.component.as_deref(), Some(VLLM));
    assert!(f.summary.contains("response headers only"), "{}", f.summary);
    assert!(
        f.evidence
            .iter()
            .any(|e| e.detail.contains("163 out (response headers only)")),
        "{:?}",
        f.evidence
    );
}

#[test]
fn first_sight_of_a_stream_forgotten_before_we_looked() {
    // One-shot snapshot 40 s after the request: the connection carried one inference-sized
    // request and a headers-sized answer, so both sizes are known from the first sample.
    let mut sim = Sim::new(vllm_topology());
    let c = sim.connect(None, 8000, API_PID);
    sim.request(c, STREAM_REQUEST);
    sim.advance(16);
    sim.respond(c, STREAM_HEADERS);
    sim.advance(40_000);
    sim.sample_sockets();
    sim.run(3_000, idle_engine_core);

    let xs: Vec<_> = sim.model.exchanges().cloned().collect();
    assert_eq!(xs.len(), 1, "{xs:#?}");
    assert!(xs[0].seen_mid_flight);
    assert_eq!(
        (xs[0].bytes_in, xs[0].bytes_out),
        (STREAM_REQUEST, STREAM_HEADERS)
    );
    assert_eq!(
        state_of(&sim, &xs[0].id),
        Some(RequestState::WaitingFirstByte)
    );
    let parts = wedgewatch::pipeline::parts(&sim.model, sim.now);
    assert!(
        parts
            .findings
            .iter()
            .any(|f| f.kind.as_str() == "wedged_request" && f.component.as_deref() == Some(VLLM)),
        "{:?}",
        kinds(&parts.findings)
    );
}

#[test]
fn a_finished_stream_and_a_small_error_are_done_and_the_connection_idle() {
    for (what, whole) in [("stream", STREAM_WHOLE), ("404", ERROR_404_WHOLE)] {
        let mut sim = Sim::new(vllm_topology());
        let c = sim.connect(None, 8000, API_PID);
        sim.sample_sockets();
        sim.advance(100);
        sim.request(c, STREAM_REQUEST);
        sim.advance(16);
        sim.respond(c, STREAM_HEADERS.min(whole));
        sim.run(250, |_| {});
        sim.respond(c, whole - STREAM_HEADERS.min(whole));
        sim.run(5_000, idle_engine_core);
        let xs: Vec<_> = sim.model.exchanges().cloned().collect();
        assert_eq!(xs.len(), 1, "{what}: {xs:#?}");
        assert!(xs[0].answered(), "{what}");
        assert_eq!(
            state_of(&sim, &xs[0].id),
            Some(RequestState::Done),
            "{what}"
        );
        let v = sim.model.view(sim.now);
        assert_eq!(v.idle.len(), 1, "{what}: the keep-alive connection is idle");
        sim.run(31_000, idle_engine_core);
        let parts = wedgewatch::pipeline::parts(&sim.model, sim.now);
        assert!(
            !parts
                .findings
                .iter()
                .any(|f| f.kind.as_str() == "wedged_request"),
            "{what}: {:?}",
            kinds(&parts.findings)
        );
    }
}

#[test]
fn keep_alive_reuse_then_only_headers_waits() {
    // An agent's pooled connection: one whole answer, then the next turn gets headers only.
    let mut sim = Sim::new(vllm_topology());
    let c = sim.connect(None, 8000, API_PID);
    sim.sample_sockets();
    sim.advance(100);
    sim.request(c, STREAM_REQUEST);
    sim.run(250, |_| {});
    sim.respond(c, STREAM_WHOLE);
    sim.run(3_000, |_| {});
    sim.request(c, STREAM_REQUEST + 40);
    sim.run(250, |_| {});
    sim.respond(c, STREAM_HEADERS);
    sim.run(5_000, |_| {});
    let xs: Vec<_> = sim.model.exchanges().cloned().collect();
    assert_eq!(xs.len(), 2, "{xs:#?}");
    assert_eq!(state_of(&sim, &xs[0].id), Some(RequestState::Done));
    assert_eq!(xs[1].bytes_out, STREAM_HEADERS);
    assert_eq!(
        state_of(&sim, &xs[1].id),
        Some(RequestState::WaitingFirstByte)
    );
    // The first token then comes (vLLM's first chunk, with the role, is about 280 bytes):
    // streaming, answered.
    sim.respond(c, 280);
    sim.run(250, |_| {});
    assert_eq!(state_of(&sim, &xs[1].id), Some(RequestState::Streaming));
}

#[test]
fn a_probe_answered_with_a_small_body_is_not_waiting() {
    // GET /health (about 90 bytes) answered by 120 bytes: a probe, done, never "headers only".
    let mut sim = Sim::new(vllm_topology());
    let c = sim.connect(None, 8000, API_PID);
    sim.sample_sockets();
    sim.advance(100);
    sim.request(c, 90);
    sim.run(250, |_| {});
    sim.respond(c, 120);
    sim.run(5_000, |_| {});
    let xs: Vec<_> = sim.model.exchanges().cloned().collect();
    assert!(!xs[0].headers_only());
    assert_eq!(state_of(&sim, &xs[0].id), Some(RequestState::Done));
}

#[test]
fn tiny_chunks_over_time_are_a_body_not_headers() {
    // 20-byte chunks every 2 s add up to a headers-sized total, but they left over seconds:
    // a slow stream (its body), never "headers only".
    let mut sim = Sim::new(vllm_topology());
    let c = sim.connect(None, 8000, API_PID);
    sim.sample_sockets();
    sim.advance(100);
    sim.request(c, STREAM_REQUEST);
    let mut n = 0;
    sim.run(20_000, |s| {
        n += 1;
        if n % 8 == 0 {
            s.respond(c, 20);
        }
    });
    let xs: Vec<_> = sim.model.exchanges().cloned().collect();
    assert_eq!(xs[0].bytes_out, 200);
    assert!(!xs[0].headers_only() && xs[0].answered(), "{:?}", xs[0]);
}
