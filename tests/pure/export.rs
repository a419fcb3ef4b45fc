//! Perfetto export validates as trace-event JSON: a traceEvents array whose events carry
//! ph/ts/pid/tid, complete slices with non-negative durations that nest per track, flows
//! between linked hops, and findings as instant events.

use correl_common::*;
use serde_json::Value;
use std::collections::BTreeMap;
use wedgewatch::export;
use wedgewatch_testkit::correl as correl_common;

fn wedged_sim() -> Sim {
    let mut sim = Sim::new(pd_topology());
    let a = sim.connect(None, 8000, 100);
    let b = sim.connect(Some(100), 30000, 200);
    let p = sim.connect(Some(200), 31011, 300);
    let d = sim.connect(Some(200), 31012, 400);
    sim.request(a, 800);
    sim.advance(20);
    sim.request(b, 830);
    sim.advance(25);
    sim.request(p, 950);
    sim.request(d, 950);
    sim.run(250, |_| {});
    sim.respond(p, 100);
    sim.run(40_000, |_| {});
    sim
}

fn validate(trace: &Value) -> Vec<&Value> {
    // Round trip through text, as a file would.
    let text = serde_json::to_string(trace).expect("serialize");
    let back: Value = serde_json::from_str(&text).expect("parse");
    assert_eq!(&back, trace);
    let evs = trace["traceEvents"].as_array().expect("traceEvents array");
    assert!(!evs.is_empty());
    for e in evs {
        let ph = e["ph"].as_str().expect("ph");
        assert!(["X", "M", "i", "s", "f"].contains(&ph), "{e}");
        assert!(e["ts"].is_i64() || e["ts"].is_u64(), "ts: {e}");
        assert!(e["pid"].is_u64(), "pid: {e}");
        assert!(e["tid"].is_u64(), "tid: {e}");
        assert!(e["name"].is_string(), "name: {e}");
        if ph == "X" {
            assert!(e["dur"].as_i64().expect("dur") >= 0, "{e}");
        }
    }
    // Complete slices on one track must not partially overlap (viewers need nesting).
    let mut tracks: BTreeMap<(u64, u64), Vec<(i64, i64)>> = BTreeMap::new();
    for e in evs.iter().filter(|e| e["ph"] == "X") {
        let ts = e["ts"].as_i64().unwrap_or(0);
        let dur = e["dur"].as_i64().unwrap_or(0);
        tracks
            .entry((
                e["pid"].as_u64().unwrap_or(0),
                e["tid"].as_u64().unwrap_or(0),
            ))
            .or_default()
            .push((ts, ts + dur));
    }
    for (k, mut v) in tracks {
        v.sort();
        for w in v.windows(2) {
            assert!(w[1].0 >= w[0].1, "overlap on track {k:?}: {w:?}");
        }
    }
    evs.iter().collect()
}

#[test]
fn perfetto_from_model_has_tracks_phases_flows_and_findings() {
    let sim = wedged_sim();
    let trace = export::perfetto_model(&sim.model, sim.now);
    let evs = validate(&trace);
    let names: Vec<String> = evs
        .iter()
        .filter(|e| e["ph"] == "M" && e["name"] == "process_name")
        .map(|e| e["args"]["name"].as_str().unwrap_or("").to_string())
        .collect();
    for c in [PROXY, ROUTER, PREFILL, DECODE] {
        assert!(
            names.contains(&c.to_string()),
            "{c} track missing: {names:?}"
        );
    }
    let slices: Vec<&&Value> = evs.iter().filter(|e| e["ph"] == "X").collect();
    let decode_wait = slices
        .iter()
        .find(|e| {
            e["name"] == "waiting_first_byte"
                && e["args"]["state"] == "waiting_first_byte"
                && e["args"]["bytes_in"] == 950
        })
        .expect("decode waiting slice");
    assert!(
        decode_wait["dur"].as_i64().unwrap_or(0) >= 40_000_000,
        "{decode_wait}"
    );
    assert!(
        slices.iter().any(|e| e["name"] == "streaming"),
        "prefill answered"
    );
    assert_eq!(
        evs.iter().filter(|e| e["ph"] == "s").count(),
        3,
        "proxy->router, router->prefill, router->decode"
    );
    assert_eq!(evs.iter().filter(|e| e["ph"] == "f").count(), 3);
    let finding = evs
        .iter()
        .find(|e| e["ph"] == "i")
        .expect("finding instant");
    assert_eq!(finding["name"], "wedged_request");
    assert_eq!(finding["s"], "g");
}

#[test]
fn perfetto_from_parts_and_snapshot_requests() {
    let sim = wedged_sim();
    let parts = wedgewatch::pipeline::parts(&sim.model, sim.now);
    let trace = export::perfetto(&parts);
    let evs = validate(&trace);
    assert!(evs
        .iter()
        .any(|e| e["ph"] == "X" && e["name"] == "waiting_first_byte"));
    assert!(evs
        .iter()
        .any(|e| e["ph"] == "i" && e["name"] == "wedged_request"));
    assert!(evs.iter().any(|e| e["ph"] == "s"));
}
