//! Estimated memory of what the model's history holds, so the history is bounded in bytes,
//! not only in time. An estimate, not an allocator's count: the value's own size plus the
//! bytes it owns, with a fixed overhead per collection entry; it follows the size of what a
//! source sent, which is what grows with a hostile or very large stack.

use super::exchange::{Conn, Exchange};
use super::metrics::MetricsPoint;
use super::CountPoint;
use crate::clock::Millis;
use crate::model::{EndpointProbe, Frame, GpuReading, StackCapture, ThreadStack};
use std::collections::BTreeMap;
use std::mem::size_of;

/// Bookkeeping per entry of a map or vector beyond its key and value (tree node pointers,
/// allocator rounding).
const PER_ENTRY: usize = 16;

/// What a value of the history costs, in bytes (estimated).
pub trait Footprint {
    fn footprint(&self) -> usize;
}

fn text(s: &str) -> usize {
    s.len()
}

fn opt_text(s: &Option<String>) -> usize {
    s.as_deref().map_or(0, text)
}

fn map_of_f64(m: &BTreeMap<String, f64>) -> usize {
    m.keys()
        .map(|k| size_of::<(String, f64)>() + text(k) + PER_ENTRY)
        .sum()
}

fn probe(p: &EndpointProbe) -> usize {
    text(&p.url) + opt_text(&p.detail)
}

impl Footprint for MetricsPoint {
    fn footprint(&self) -> usize {
        size_of::<Self>()
            + map_of_f64(&self.mapped)
            + map_of_f64(&self.worker_active)
            + self.probe.as_ref().map_or(0, probe)
            + self
                .extra_probes
                .iter()
                .map(|p| size_of::<EndpointProbe>() + probe(p))
                .sum::<usize>()
    }
}

impl Footprint for CountPoint {
    fn footprint(&self) -> usize {
        size_of::<Self>()
    }
}

fn frame(f: &Frame) -> usize {
    size_of::<Frame>() + text(&f.name) + text(&f.file)
}

fn thread(t: &ThreadStack) -> usize {
    size_of::<ThreadStack>()
        + opt_text(&t.name)
        + opt_text(&t.rule)
        + opt_text(&t.decided_by)
        + t.frames.iter().map(frame).sum::<usize>()
}

impl Footprint for StackCapture {
    fn footprint(&self) -> usize {
        size_of::<Self>()
            + opt_text(&self.error)
            + opt_text(&self.skipped)
            + self
                .warnings
                .iter()
                .map(|w| size_of::<String>() + text(w))
                .sum::<usize>()
            + self.threads.iter().map(thread).sum::<usize>()
    }
}

impl Footprint for (Millis, GpuReading) {
    fn footprint(&self) -> usize {
        let g = &self.1;
        let devices: usize = g
            .devices
            .iter()
            .map(|d| {
                size_of_val(d)
                    + opt_text(&d.name)
                    + opt_text(&d.uuid)
                    + d.processes.len() * (size_of::<crate::model::GpuProcess>() + PER_ENTRY)
                    + d.errors
                        .iter()
                        .map(|e| size_of_val(e) + text(&e.field) + text(&e.reason))
                        .sum::<usize>()
            })
            .sum();
        size_of::<Self>() + opt_text(&g.driver_version) + opt_text(&g.cuda_version) + devices
    }
}

/// One exchange of a connection: its slot (a pointer), its shared allocation (two counts
/// and the exchange) and its texts.
fn exchange(x: &std::sync::Arc<Exchange>) -> usize {
    size_of::<std::sync::Arc<Exchange>>()
        + 2 * size_of::<usize>()
        + size_of::<Exchange>()
        + text(&x.id)
        + text(&x.component)
        + text(&x.client)
        + text(&x.server)
        + opt_text(&x.client_component)
        + x.links.capacity() * size_of::<u64>()
}

impl Footprint for Conn {
    fn footprint(&self) -> usize {
        size_of::<Self>()
            + text(&self.key.local)
            + text(&self.key.remote)
            + text(&self.component)
            + opt_text(&self.client_component)
            + self.exchanges.iter().map(exchange).sum::<usize>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bigger_values_cost_more() {
        let point = || MetricsPoint {
            t_ms: 0,
            mapped: BTreeMap::new(),
            probe: None,
            extra_probes: Vec::new(),
            loads: None,
            worker_active: BTreeMap::new(),
            http_active_inference: None,
        };
        let small = point();
        let mut big = point();
        for i in 0..100 {
            big.mapped.insert(format!("series_{i}"), 1.0);
        }
        assert!(big.footprint() > small.footprint() + 100 * 8);
        let frame = |n: usize| Frame {
            name: "f".repeat(n),
            file: "x.py".into(),
            line: 1,
        };
        let mut cap = StackCapture {
            pid: 1,
            t_ms: 0,
            mode: crate::model::CaptureMode::Nonblocking,
            error: None,
            skipped: None,
            warnings: Vec::new(),
            threads: Vec::new(),
        };
        let empty = cap.footprint();
        cap.threads.push(ThreadStack {
            tid: 1,
            name: None,
            active: false,
            owns_gil: false,
            frames: vec![frame(1000)],
            state: crate::model::ThreadState::default(),
            rule: None,
            decided_by: None,
        });
        assert!(cap.footprint() >= empty + 1000);
    }
}
