//! NVML's process list -> components: which component each NVML pid is (through every PID
//! namespace), and which GPUs each component's processes hold (facts, where the topology's
//! `CUDA_VISIBLE_DEVICES` and title rank are hints).

use crate::model::{GpuReading, ProcessFacts, Topology};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};

/// One NVML process and who it is.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuPidMapping {
    pub gpu_index: u32,
    /// The pid NVML reported (a host pid).
    pub nvml_pid: u32,
    /// The same process as this tool's `/proc` names it, when found.
    pub pid: Option<i32>,
    pub component: Option<String>,
}

/// Maps NVML's host pids to topology components, and each component to its GPUs.
///
/// NVML reports host pids. A process is matched when that pid is its pid in our `/proc` or
/// appears in its `NSpid` line; in a container without the host's PID namespace, host pids
/// stay unmatched.
pub fn map_gpu_pids(
    topo: &Topology,
    facts: &[ProcessFacts],
    reading: &GpuReading,
) -> Vec<GpuPidMapping> {
    // Every pid a process is known by (any namespace level) -> its pid in our /proc.
    let mut alias: BTreeMap<i64, i32> = BTreeMap::new();
    for f in facts {
        alias.insert(i64::from(f.pid), f.pid);
        for &ns in f.nspid.iter().flatten() {
            alias.entry(i64::from(ns)).or_insert(f.pid);
        }
    }
    let mut out = Vec::new();
    for d in &reading.devices {
        for p in &d.processes {
            let host = i64::from(p.pid);
            let pid = alias.get(&host).copied().or_else(|| {
                let h = i32::try_from(p.pid).ok()?;
                topo.component_of_pid(h).map(|_| h)
            });
            // Prefer the component of the resolved pid; else any component listing one of the
            // process's namespace pids.
            let component = pid
                .and_then(|pid| topo.component_of_pid(pid))
                .or_else(|| {
                    let f = facts.iter().find(|f| Some(f.pid) == pid)?;
                    f.nspid
                        .iter()
                        .flatten()
                        .find_map(|&ns| topo.component_of_pid(ns))
                })
                .map(|c| c.id.clone());
            out.push(GpuPidMapping {
                gpu_index: d.index,
                nvml_pid: p.pid,
                pid,
                component,
            });
        }
    }
    out
}

/// Component id -> the NVML indices of the GPUs its processes run on (facts, not hints).
pub fn component_gpus(mappings: &[GpuPidMapping]) -> BTreeMap<String, Vec<u32>> {
    let mut out: BTreeMap<String, BTreeSet<u32>> = BTreeMap::new();
    for m in mappings {
        if let Some(c) = &m.component {
            out.entry(c.clone()).or_default().insert(m.gpu_index);
        }
    }
    out.into_iter()
        .map(|(k, v)| (k, v.into_iter().collect()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Component, Role};
    use crate::model::{GpuDevice, GpuProcess};

    #[test]
    fn pids_map_through_nspid() {
        let mut topo = Topology::default();
        let mut s = Component::new("scheduler_TP0@decode", Role::Scheduler, "sglang");
        s.pids = vec![42];
        let mut e = Component::new("decode", Role::Decode, "sglang");
        e.pids = vec![40, 42];
        let mut s1 = Component::new("scheduler_TP1@decode", Role::Scheduler, "sglang");
        s1.pids = vec![43];
        topo.components = vec![e, s, s1];
        // Process 42 is host pid 9042 in a container seen from the host: /proc shows 9042
        // with NSpid 9042 42 and the topology recorded the container pid 42.
        let facts = vec![
            ProcessFacts {
                pid: 9042,
                nspid: Some(vec![9042, 42]),
                ..Default::default()
            },
            ProcessFacts {
                pid: 43,
                nspid: Some(vec![43]),
                ..Default::default()
            },
        ];
        let dev = |index, pid| GpuDevice {
            index,
            name: None,
            uuid: None,
            util_gpu_pct: None,
            util_mem_pct: None,
            power_mw: None,
            power_limit_mw: None,
            mem_used_bytes: None,
            mem_total_bytes: None,
            processes: vec![GpuProcess {
                pid,
                used_mem_bytes: Some(1),
                sm_util_pct: Some(0),
            }],
            errors: vec![],
        };
        let reading = GpuReading {
            driver_version: None,
            cuda_version: None,
            devices: vec![dev(0, 9042), dev(1, 43), dev(2, 777)],
        };
        let m = map_gpu_pids(&topo, &facts, &reading);
        assert_eq!(m[0].component.as_deref(), Some("scheduler_TP0@decode"));
        assert_eq!(m[0].pid, Some(9042));
        assert_eq!(m[1].component.as_deref(), Some("scheduler_TP1@decode"));
        assert_eq!(m[2].component, None);
        let g = component_gpus(&m);
        assert_eq!(g["scheduler_TP0@decode"], vec![0]);
        assert_eq!(g["scheduler_TP1@decode"], vec![1]);
        assert_eq!(g.len(), 2);
    }
}
