//! GPU readings -> the activity verdict of a device and of a component (the rule of
//! [`super::gpu_verdict`], with the configured thresholds).

use super::gpu_verdict::{self, ActivityInputs, ActivityThresholds, GpuActivity};
use super::Correlator;
use crate::clock::Millis;
use crate::model::{Component, GpuReading, Thresholds};

impl Correlator {
    pub(super) fn latest_gpu(&self, now: Millis) -> Option<&GpuReading> {
        self.gpu
            .iter()
            .rev()
            .find(|(t, _)| *t <= now && now - *t <= self.thresholds.correlate.stale_after_ms)
            .map(|(_, g)| g)
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

/// GPU activity of a component: its GPUs (from the topology, or NVML's process list),
/// judged by [`gpu_verdict::component_activity`], so the snapshot
/// and the detectors agree with what the GPU view shows.
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
