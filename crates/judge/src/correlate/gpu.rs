//! GPU readings -> the activity verdict of a device and of a component (the rule of
//! [`super::gpu_verdict`], with the configured thresholds).

use super::gpu_pids::{component_gpus, map_gpu_pids};
use super::gpu_verdict::{self, ActivityInputs, ActivityThresholds, GpuActivity};
use super::Correlator;
use crate::clock::Millis;
use crate::model::{Component, GpuReading, Thresholds};
use std::collections::{BTreeMap, BTreeSet};

/// Component id -> the NVML indices of the GPUs its processes, and its children's, hold.
pub(super) type HeldGpus = BTreeMap<String, Vec<u32>>;

impl Correlator {
    pub(super) fn latest_gpu(&self, now: Millis) -> Option<&GpuReading> {
        self.gpu
            .iter()
            .rev()
            .find(|(t, _)| *t <= now && now - *t <= self.thresholds.correlate.stale_after_ms)
            .map(|(_, g)| g)
    }
}

impl Correlator {
    /// What NVML's process list says each component holds at `now` ([`map_gpu_pids`]), each
    /// component's GPUs folded into its ancestors.
    pub(super) fn held_gpus(&self, now: Millis) -> HeldGpus {
        let Some(g) = self.latest_gpu(now) else {
            return HeldGpus::new();
        };
        let own = component_gpus(&map_gpu_pids(&self.topology, &self.latest_processes, g));
        let mut held: BTreeMap<String, BTreeSet<u32>> = BTreeMap::new();
        for (id, gpus) in own {
            // At most one step per component: a parent cycle in a hostile topology ends.
            let mut at = Some(id);
            for _ in 0..=self.topology.components.len() {
                let Some(id) = at.take() else { break };
                held.entry(id.clone()).or_default().extend(&gpus);
                at = self.parent_of(&id);
            }
        }
        held.into_iter()
            .map(|(k, v)| (k, v.into_iter().collect()))
            .collect()
    }

    /// The component whose child `id` is (by the child's `parent` or the parent's list).
    fn parent_of(&self, id: &str) -> Option<String> {
        let c = self.topology.component(id)?;
        c.parent.clone().or_else(|| {
            self.topology
                .components
                .iter()
                .find(|p| p.children.iter().any(|ch| ch == id))
                .map(|p| p.id.clone())
        })
    }
}

/// The GPUs a component lists: what NVML shows it (or its children) holding, else the
/// topology's hint (with its children's hints, as [`Correlator::with_children`] folds them).
pub(super) fn listed_gpus(with_children: &Component, held: &HeldGpus) -> Vec<u32> {
    match held.get(&with_children.id) {
        Some(g) if !g.is_empty() => g.clone(),
        _ => with_children.gpus.clone(),
    }
}

/// The GPU source's thresholds, from the detectors' named ones.
fn activity_thresholds(th: &Thresholds) -> ActivityThresholds {
    ActivityThresholds {
        busy_util_pct: th.correlate.busy_util_pct,
        spin_util_pct: th.correlate.spin_util_pct,
        idle_power_ratio: th.correlate.spin_power_frac,
    }
}

/// GPU activity of one device (every process on it), by [`gpu_verdict::gpu_activity`].
pub fn device_activity(d: &crate::model::GpuDevice, th: &Thresholds) -> GpuActivity {
    let inputs = ActivityInputs::from_device(d, &[], None);
    gpu_verdict::gpu_activity(&inputs, &activity_thresholds(th)).0
}

/// GPU activity of a component: its [`listed_gpus`] and any device showing one of its pids,
/// judged by [`gpu_verdict::component_activity`].
pub fn gpu_activity(c: &Component, g: &GpuReading, th: &Thresholds) -> GpuActivity {
    let gpus: Vec<u32> = g
        .devices
        .iter()
        .filter(|d| {
            c.gpus.contains(&d.index)
                || d.processes.iter().any(|p| c.pids.contains(&(p.pid as i32)))
        })
        .map(|d| d.index)
        .collect();
    if gpus.is_empty() {
        return GpuActivity::Unknown;
    }
    let pids: Vec<u32> = c.pids.iter().map(|p| *p as u32).collect();
    gpu_verdict::component_activity(g, &gpus, &pids, None, &activity_thresholds(th)).0
}
