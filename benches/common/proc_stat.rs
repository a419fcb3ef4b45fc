//! What /proc says about a process the benches measure: CPU seconds (its own, its reaped
//! and its live children's), RSS, and the bytes under a directory. Shared by the bench
//! binaries (`#[path]`-included).

// rusage and clock_gettime through libc, which std does not wrap.
#![allow(unsafe_code)]
#![allow(dead_code)]

use std::path::Path;

/// CPU seconds of `pid` and its reaped children (fields 14-17 of /proc/PID/stat).
pub fn cpu_seconds(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the parenthesised comm; field 3 is index 0 here.
    let rest = &stat[stat.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = f
        .get(11..15)?
        .iter()
        .filter_map(|v| v.parse::<u64>().ok())
        .sum();
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    Some(ticks as f64 / hz)
}

/// CPU seconds of the live (not yet reaped) children of `pid`.
pub fn live_children_cpu(pid: u32) -> f64 {
    live_children(pid)
        .into_iter()
        .map(|c| cpu_seconds(c).unwrap_or(0.0))
        .sum()
}

/// The live (not yet reaped) children of `pid`, from every thread's `children` list.
pub fn live_children(pid: u32) -> Vec<u32> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    tasks
        .flatten()
        .flat_map(|t| {
            let children = std::fs::read_to_string(t.path().join("children")).unwrap_or_default();
            children
                .split_whitespace()
                .filter_map(|c| c.parse::<u32>().ok())
                .collect::<Vec<_>>()
        })
        .collect()
}

pub fn rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

pub fn dir_bytes(dir: &Path) -> u64 {
    let mut total = 0;
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            match e.metadata() {
                Ok(m) if m.is_dir() => total += dir_bytes(&e.path()),
                Ok(m) if e.file_name() != "daemon.log" => total += m.len(),
                _ => {}
            }
        }
    }
    total
}
