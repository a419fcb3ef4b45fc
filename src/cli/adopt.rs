//! The demo's lab as the demo's own process tree: `lab.py` starts the lab's components in
//! sessions of their own and exits, so the demo adopts them (a child subreaper) and watches
//! its own tree only (`--within` itself), never another stack on the same host. Adopted
//! components that died (the decode engine restarted) are reaped, and only they.

use serde_json::Value;
use std::path::Path;

/// Makes this process the parent of what its children leave behind; false when the kernel
/// refuses (then the lab's restarted components are outside the demo's tree).
pub fn adopt_orphans() -> bool {
    nix::sys::prctl::set_child_subreaper(true).is_ok()
}

/// Reaps each `(pid, start time)` of the lab that is a dead child of ours, and only while
/// it is still that process (a pid reused by one of our live children is left to its owner).
pub fn reap_dead(proc_root: &Path, pids: &[(i32, u64)]) {
    let proc = wedgewatch::sys::ProcFs::new(proc_root);
    let me = nix::unistd::getpid().as_raw();
    for &(pid, start) in pids {
        let Ok(stat) = proc.stat(pid) else { continue };
        if stat.state == 'Z' && stat.ppid == me && stat.starttime == start {
            let _ = nix::sys::wait::waitpid(
                nix::unistd::Pid::from_raw(pid),
                Some(nix::sys::wait::WaitPidFlag::WNOHANG),
            );
        }
    }
}

/// Every `(pid, start time)` lab.json records: components and their children.
pub fn lab_pids(info: &Value) -> Vec<(i32, u64)> {
    let components = info.get("components").and_then(Value::as_object);
    let mut out = Vec::new();
    for c in components.into_iter().flat_map(|m| m.values()) {
        out.extend(pid_and_start(c));
        let kids = c.get("children").and_then(Value::as_array);
        out.extend(kids.into_iter().flatten().filter_map(pid_and_start));
    }
    out
}

fn pid_and_start(v: &Value) -> Option<(i32, u64)> {
    let pid = i32::try_from(v.get("pid")?.as_i64()?).ok()?;
    Some((pid, v.get("start_time")?.as_u64()?))
}
