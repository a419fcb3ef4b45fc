//! Export of the request timeline as Chrome trace-event JSON, which the Perfetto UI
//! (ui.perfetto.dev) and chrome://tracing open.
//!
//! One process track per component, one thread track per TCP connection (concurrent
//! requests on one track would overlap, which viewers cannot nest), one slice per exchange
//! phase, flow arrows along hop links, findings as global instant events.

pub mod prometheus;

use crate::clock::{parse_rfc3339, Millis};
use crate::correlate::Correlator;
use crate::model::{Finding, Request, RequestState, Snapshot};
use crate::snapshot::SnapshotParts;
use serde_json::{json, Value};
use std::collections::BTreeMap;

/// One phase of one exchange.
#[derive(Debug, Clone)]
struct Slice {
    name: &'static str,
    from: Millis,
    to: Millis,
}

struct Builder {
    events: Vec<Value>,
    pids: BTreeMap<String, u32>,
    tids: BTreeMap<(u32, String), u32>,
    /// request id -> (pid, tid, start) for flow arrows.
    anchors: BTreeMap<String, (u32, u32, Millis)>,
}

fn us(ms: Millis) -> i64 {
    ms.saturating_mul(1000)
}

impl Builder {
    fn new() -> Builder {
        Builder {
            events: Vec::new(),
            pids: BTreeMap::new(),
            tids: BTreeMap::new(),
            anchors: BTreeMap::new(),
        }
    }

    fn pid(&mut self, component: &str) -> u32 {
        if let Some(p) = self.pids.get(component) {
            return *p;
        }
        let p = self.pids.len() as u32 + 1;
        self.pids.insert(component.to_string(), p);
        self.events.push(json!({"ph": "M", "name": "process_name", "ts": 0, "pid": p, "tid": 0, "args": {"name": component}}));
        self.events.push(json!({"ph": "M", "name": "process_sort_index", "ts": 0, "pid": p, "tid": 0, "args": {"sort_index": p}}));
        p
    }

    fn tid(&mut self, pid: u32, conn: &str) -> u32 {
        if let Some(t) = self.tids.get(&(pid, conn.to_string())) {
            return *t;
        }
        let t = self.tids.len() as u32 + 1;
        self.tids.insert((pid, conn.to_string()), t);
        self.events.push(json!({"ph": "M", "name": "thread_name", "ts": 0, "pid": pid, "tid": t, "args": {"name": conn}}));
        t
    }

    fn request(&mut self, r: &Request, slices: &[Slice]) {
        let pid = self.pid(&r.component);
        let tid = self.tid(pid, &format!("{} -> {}", r.client, r.server));
        for s in slices {
            self.events.push(json!({
                "ph": "X", "cat": "exchange", "name": s.name,
                "ts": us(s.from), "dur": us((s.to - s.from).max(0)),
                "pid": pid, "tid": tid,
                "args": {
                    "request": r.id, "state": r.state.as_str(), "bytes_in": r.bytes_in,
                    "bytes_out": r.bytes_out, "links": r.links, "client_component": r.client_component,
                },
            }));
        }
        if let Some(first) = slices.first() {
            self.anchors.insert(r.id.clone(), (pid, tid, first.from));
        }
    }

    fn links(&mut self, requests: &[Request]) {
        let mut flow_id = 0u64;
        for r in requests {
            let Some(&(ppid, ptid, _)) = self.anchors.get(&r.id) else {
                continue;
            };
            for l in &r.links {
                let Some(&(cpid, ctid, cstart)) = self.anchors.get(l) else {
                    continue;
                };
                flow_id += 1;
                self.events.push(json!({"ph": "s", "cat": "hop", "name": "forwarded", "id": flow_id, "ts": us(cstart), "pid": ppid, "tid": ptid}));
                self.events.push(json!({"ph": "f", "bp": "e", "cat": "hop", "name": "forwarded", "id": flow_id, "ts": us(cstart), "pid": cpid, "tid": ctid}));
            }
        }
    }

    fn findings(&mut self, now: Millis, findings: &[Finding]) {
        for f in findings {
            self.events.push(json!({
                "ph": "i", "s": "g", "cat": "finding", "name": f.kind,
                "ts": us(now), "pid": 0, "tid": 0,
                "args": {"severity": f.severity.as_str(), "component": f.component, "summary": f.summary, "requests": f.requests},
            }));
        }
    }

    fn finish(self) -> Value {
        json!({"traceEvents": self.events, "displayTimeUnit": "ms", "otherData": {"generator": "wedgewatch"}})
    }
}

/// Phases from a contract `Request` (no first-byte time: the response phase starts at the
/// request when unknown).
fn approx_slices(now: Millis, r: &Request) -> Vec<Slice> {
    let start = r
        .started_at
        .as_deref()
        .and_then(parse_rfc3339)
        .unwrap_or(now - r.age_ms as Millis);
    let last_out = now - r.idle_out_ms as Millis;
    match r.state {
        RequestState::WaitingFirstByte => vec![Slice {
            name: "waiting_first_byte",
            from: start,
            to: now,
        }],
        RequestState::Streaming => vec![Slice {
            name: "streaming",
            from: start,
            to: now,
        }],
        RequestState::Stalled => vec![
            Slice {
                name: "streaming",
                from: start,
                to: last_out.max(start),
            },
            Slice {
                name: "stalled",
                from: last_out.max(start),
                to: now,
            },
        ],
        RequestState::Done => vec![Slice {
            name: "done",
            from: start,
            to: last_out.max(start),
        }],
        RequestState::Closed => vec![Slice {
            name: "closed",
            from: start,
            to: last_out.max(start),
        }],
        RequestState::Idle => Vec::new(),
    }
}

fn from_requests(now: Millis, requests: &[Request], findings: &[Finding]) -> Value {
    let mut b = Builder::new();
    for r in requests {
        let s = approx_slices(now, r);
        if !s.is_empty() {
            b.request(r, &s);
        }
    }
    b.links(requests);
    b.findings(now, findings);
    b.finish()
}

/// A trace is posted like a bundle: redacted, with every secret its inputs reveal (env,
/// argv, labels of the parts or snapshot it came from) learned first. Always on: a trace
/// holds requests and findings, nothing `--no-redact` is meant to show.
fn redacted(mut trace: Value, learn_from: &impl serde::Serialize) -> Value {
    let mut r = crate::redact::Redactor::new();
    if let Ok(v) = serde_json::to_value(learn_from) {
        r.learn_json(&v);
    }
    r.redact_json(&mut trace);
    trace
}

/// From the correlator's output.
pub fn perfetto(parts: &SnapshotParts) -> Value {
    let trace = from_requests(parts.taken_at_ms, &parts.requests, &parts.findings);
    redacted(trace, parts)
}

/// From a snapshot file (`wedgewatch export --perfetto FILE` on a bundle).
pub fn perfetto_snapshot(s: &Snapshot) -> Value {
    let now = parse_rfc3339(&s.taken_at).unwrap_or(0);
    redacted(from_requests(now, &s.requests, &s.findings), s)
}

/// From a live or replayed model: exact phase boundaries (first byte, last byte), over the
/// whole history kept (not only the snapshot window).
pub fn perfetto_model(model: &Correlator, now: Millis) -> Value {
    let mut whole = model.clone();
    whole.window_ms = whole.history_ms;
    let m = &whole;
    let parts = crate::pipeline::parts(m, now);
    let view = m.view(now);
    let mut b = Builder::new();
    for r in &parts.requests {
        let Some(v) = view.request(&r.id) else {
            continue;
        };
        let x = &v.x;
        let end = x.end_ms().unwrap_or(now).min(now);
        let mut slices = Vec::new();
        let first = x.first_byte_ms.unwrap_or(end).max(x.request_ms);
        slices.push(Slice {
            name: "waiting_first_byte",
            from: x.request_ms,
            to: first,
        });
        if let Some(fb) = x.first_byte_ms {
            let last = x.last_out_ms.unwrap_or(fb).max(fb);
            let stream_end = match v.state {
                RequestState::Streaming => now,
                _ => last,
            };
            slices.push(Slice {
                name: "streaming",
                from: fb.max(x.request_ms),
                to: stream_end.max(first),
            });
            if v.state == RequestState::Stalled {
                slices.push(Slice {
                    name: "stalled",
                    from: stream_end.max(first),
                    to: now,
                });
            }
        }
        b.request(r, &slices);
    }
    b.links(&parts.requests);
    b.findings(now, &parts.findings);
    redacted(b.finish(), &parts)
}
