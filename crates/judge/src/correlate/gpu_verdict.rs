//! The GPU activity verdict of a device or of a component's processes on their GPUs.
//!
//! Utilization alone lies: a hung NCCL collective reads ~100 % at idle power. [`gpu_activity`]
//! combines utilization, power draw against the limit, per-process SM samples and the
//! engine's own forward-time counter into a verdict (`working`, `idle`, `spinning`, `unknown`).

use crate::model::{GpuDevice, GpuProcess, GpuReading};
use serde::{Deserialize, Serialize};

/// Is the GPU behind a component doing work?
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GpuActivity {
    Working,
    Idle,
    /// Busy-looking (utilization high) at idle power: a kernel spinning, typically a hung
    /// NCCL collective. Not progress.
    Spinning,
    Unknown,
}

impl GpuActivity {
    pub fn as_str(self) -> &'static str {
        match self {
            GpuActivity::Working => "working",
            GpuActivity::Idle => "idle",
            GpuActivity::Spinning => "spinning",
            GpuActivity::Unknown => "unknown",
        }
    }
}

impl std::fmt::Display for GpuActivity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Named thresholds of [`gpu_activity`].
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct ActivityThresholds {
    /// Utilization (or a process's SM utilization) at or above this counts as busy.
    pub busy_util_pct: u32,
    /// Utilization at or above this, at idle power, is a spinning kernel.
    pub spin_util_pct: u32,
    /// Power at or below this fraction of the power limit is idle-level power. Real GPUs
    /// idle at 10-25 % of their limit and run real kernels well above 40 %.
    pub idle_power_ratio: f64,
}

impl Default for ActivityThresholds {
    fn default() -> Self {
        ActivityThresholds {
            busy_util_pct: 10,
            spin_util_pct: 90,
            idle_power_ratio: 0.35,
        }
    }
}

/// What [`gpu_activity`] looks at, for one component on one GPU.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ActivityInputs {
    pub util_gpu_pct: Option<u32>,
    pub power_mw: Option<u32>,
    pub power_limit_mw: Option<u32>,
    /// The component's processes' SM utilization (max), Some(0) when NVML had no samples.
    pub process_sm_pct: Option<u32>,
    /// Whether other processes (not the component's) have SM samples on this GPU.
    pub other_processes_active: bool,
    /// The engine's forward-time counter rate (s/s, e.g.
    /// `rate(sglang:forward_execution_seconds_total)`), when metrics are available.
    pub forward_rate: Option<f64>,
}

impl ActivityInputs {
    /// The inputs for the given pids on one device.
    pub fn from_device(dev: &GpuDevice, pids: &[u32], forward_rate: Option<f64>) -> Self {
        let mine: Vec<&GpuProcess> = dev
            .processes
            .iter()
            .filter(|p| pids.contains(&p.pid))
            .collect();
        ActivityInputs {
            util_gpu_pct: dev.util_gpu_pct,
            power_mw: dev.power_mw,
            power_limit_mw: dev.power_limit_mw,
            process_sm_pct: mine.iter().filter_map(|p| p.sm_util_pct).max(),
            other_processes_active: dev
                .processes
                .iter()
                .any(|p| !pids.contains(&p.pid) && p.sm_util_pct.unwrap_or(0) > 0),
            forward_rate,
        }
    }
}

/// The verdict and a one-line reason with the numbers behind it.
pub fn gpu_activity(i: &ActivityInputs, th: &ActivityThresholds) -> (GpuActivity, String) {
    if let Some(rate) = i.forward_rate.filter(|r| *r > 0.0) {
        return (
            GpuActivity::Working,
            format!("engine forward time rising ({rate:.3} s/s)"),
        );
    }
    let ratio = match (i.power_mw, i.power_limit_mw) {
        (Some(p), Some(l)) if l > 0 => Some(f64::from(p) / f64::from(l)),
        _ => None,
    };
    let power = |r: f64| format!("{:.0} % of the power limit", r * 100.0);
    let Some(util) = i.util_gpu_pct else {
        return match i.process_sm_pct {
            Some(sm) if sm >= th.busy_util_pct => (
                GpuActivity::Working,
                format!("process SM utilization {sm} % (device utilization unknown)"),
            ),
            Some(sm) => (
                GpuActivity::Idle,
                format!("process SM utilization {sm} % (device utilization unknown)"),
            ),
            None => (GpuActivity::Unknown, "no utilization reading".into()),
        };
    };
    if util >= th.spin_util_pct {
        if let Some(r) = ratio.filter(|r| *r <= th.idle_power_ratio) {
            return (
                GpuActivity::Spinning,
                format!(
                    "utilization {util} % at {} (idle-level power): a spinning kernel, e.g. a \
                     hung collective",
                    power(r)
                ),
            );
        }
    }
    if util >= th.busy_util_pct {
        // The device is busy, but maybe not with this component's processes.
        if i.process_sm_pct == Some(0) && i.other_processes_active {
            return (
                GpuActivity::Idle,
                format!("device utilization {util} % comes from other processes; this one has no SM samples"),
            );
        }
        let mut why = format!("utilization {util} %");
        match ratio {
            Some(r) => why.push_str(&format!(" at {}", power(r))),
            None => why.push_str(" (power unknown: a spinning kernel cannot be ruled out)"),
        }
        if i.forward_rate == Some(0.0) {
            why.push_str("; engine forward counter not moving");
        }
        return (GpuActivity::Working, why);
    }
    if let Some(sm) = i.process_sm_pct.filter(|sm| *sm >= th.busy_util_pct) {
        return (
            GpuActivity::Working,
            format!("process SM utilization {sm} % (device utilization {util} %)"),
        );
    }
    let mut why = format!("utilization {util} %");
    if let Some(r) = ratio {
        why.push_str(&format!(" at {}", power(r)));
    }
    (GpuActivity::Idle, why)
}

/// A component's verdict over all its GPUs: working if any works, else spinning if any
/// spins, else idle if all are idle, else unknown. `pids` are NVML (host) pids.
pub fn component_activity(
    reading: &GpuReading,
    gpus: &[u32],
    pids: &[u32],
    forward_rate: Option<f64>,
    th: &ActivityThresholds,
) -> (GpuActivity, String) {
    let verdicts: Vec<(u32, GpuActivity, String)> = gpus
        .iter()
        .filter_map(|g| reading.devices.iter().find(|d| d.index == *g))
        .map(|d| {
            let (a, why) = gpu_activity(&ActivityInputs::from_device(d, pids, forward_rate), th);
            (d.index, a, why)
        })
        .collect();
    if verdicts.is_empty() {
        return (
            GpuActivity::Unknown,
            "no GPU reading for this component".into(),
        );
    }
    for want in [GpuActivity::Working, GpuActivity::Spinning] {
        if let Some((g, a, why)) = verdicts.iter().find(|v| v.1 == want) {
            return (*a, format!("gpu{g}: {why}"));
        }
    }
    if verdicts.iter().all(|v| v.1 == GpuActivity::Idle) {
        let why: Vec<String> = verdicts
            .iter()
            .map(|(g, _, w)| format!("gpu{g}: {w}"))
            .collect();
        return (GpuActivity::Idle, why.join("; "));
    }
    let why: Vec<String> = verdicts
        .iter()
        .map(|(g, _, w)| format!("gpu{g}: {w}"))
        .collect();
    (GpuActivity::Unknown, why.join("; "))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn inputs(util: u32, power: u32, limit: u32) -> ActivityInputs {
        ActivityInputs {
            util_gpu_pct: Some(util),
            power_mw: Some(power),
            power_limit_mw: Some(limit),
            ..Default::default()
        }
    }

    #[test]
    fn verdicts_with_named_thresholds() {
        let th = ActivityThresholds::default();
        assert_eq!(
            gpu_activity(&inputs(97, 600_000, 700_000), &th).0,
            GpuActivity::Working
        );
        assert_eq!(
            gpu_activity(&inputs(0, 80_000, 700_000), &th).0,
            GpuActivity::Idle
        );
        let (a, why) = gpu_activity(&inputs(100, 90_000, 700_000), &th);
        assert_eq!(a, GpuActivity::Spinning);
        assert!(why.contains("13 % of the power limit"), "{why}");
        // Exactly at the spin threshold and the idle-power ratio still spins.
        assert_eq!(
            gpu_activity(&inputs(90, 245_000, 700_000), &th).0,
            GpuActivity::Spinning
        );
        assert_eq!(
            gpu_activity(&inputs(89, 245_000, 700_000), &th).0,
            GpuActivity::Working
        );
        // The engine's counter moving wins over anything NVML says.
        let mut i = inputs(100, 90_000, 700_000);
        i.forward_rate = Some(0.4);
        assert_eq!(gpu_activity(&i, &th).0, GpuActivity::Working);
        // No power reading: high utilization is working, with a caveat.
        let i = ActivityInputs {
            util_gpu_pct: Some(99),
            ..Default::default()
        };
        let (a, why) = gpu_activity(&i, &th);
        assert_eq!(a, GpuActivity::Working);
        assert!(why.contains("cannot be ruled out"), "{why}");
        assert_eq!(
            gpu_activity(&ActivityInputs::default(), &th).0,
            GpuActivity::Unknown
        );
        // Busy device, but only because of someone else.
        let mut i = inputs(80, 500_000, 700_000);
        i.process_sm_pct = Some(0);
        i.other_processes_active = true;
        assert_eq!(gpu_activity(&i, &th).0, GpuActivity::Idle);
    }
}
