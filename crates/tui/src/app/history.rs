//! The compact past frames the sparklines draw from.

use super::in_flight;
use crate::model::Snapshot;
use std::collections::BTreeMap;

/// One GPU's readings in one past frame (None: no reading, never a zero).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct GpuPoint {
    pub util_pct: Option<f64>,
    pub power_w: Option<f64>,
    pub mem_used_bytes: Option<f64>,
}

/// A compact record of one past frame for sparklines (full snapshots would be too big).
#[derive(Debug, Clone, Default)]
pub struct HistoryPoint {
    /// GPU index -> its readings.
    pub gpus: BTreeMap<u32, GpuPoint>,
    /// (GPU index, pid) -> memory used bytes.
    pub gpu_processes: BTreeMap<(u32, i64), Option<f64>>,
    /// Component -> TCP state -> count.
    pub sockets: BTreeMap<String, BTreeMap<String, u32>>,
    /// Component -> metric name -> value.
    pub metrics: BTreeMap<String, BTreeMap<String, f64>>,
    /// Component -> exchanges in flight (waiting, streaming or stalled).
    pub in_flight: BTreeMap<String, u32>,
}

impl HistoryPoint {
    pub(super) fn of(s: &Snapshot) -> HistoryPoint {
        let mut p = HistoryPoint::default();
        for g in &s.gpus {
            p.gpus.insert(
                g.index,
                GpuPoint {
                    util_pct: g.util_pct,
                    power_w: g.power_w,
                    mem_used_bytes: g.mem_used_bytes.map(|b| b as f64),
                },
            );
            for proc_ in &g.processes {
                p.gpu_processes
                    .insert((g.index, proc_.pid), proc_.used_mem_bytes.map(|b| b as f64));
            }
        }
        for c in &s.components {
            if !c.sockets.is_empty() {
                p.sockets.insert(c.id.clone(), c.sockets.clone());
            }
            if !c.metrics.is_empty() {
                p.metrics.insert(c.id.clone(), c.metrics.clone());
            }
        }
        for r in &s.requests {
            if in_flight(r.state) {
                *p.in_flight.entry(r.component.clone()).or_default() += 1;
            }
        }
        p
    }
}
