//! Which targets are not Python, from `/proc` alone, so that py-spy is not run on them: an
//! `exe` not named like an interpreter and no `libpython` in `maps`. Searching `maps` is
//! costly and takes the target's mmap lock, so the verdict is kept per process incarnation.

use crate::sys::{ProcFs, ProcFsError};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Longest wait for one process's `exe` and `maps` (normally well under a millisecond).
const NOT_PYTHON_DEADLINE: Duration = Duration::from_millis(300);

/// A process incarnation: its pid's start time and executable.
type Incarnation = (u64, PathBuf);

/// Each target's incarnation and its verdict (None: Python).
type ByPid = BTreeMap<i32, (Incarnation, Option<String>)>;

/// Verdicts from `maps` of the targets of the last window.
#[derive(Debug, Clone, Default)]
pub(super) struct Verdicts(Arc<Mutex<ByPid>>);

impl Verdicts {
    fn get(&self, pid: i32, who: &Incarnation) -> Option<Option<String>> {
        let g = self.0.lock().unwrap_or_else(|p| p.into_inner());
        g.get(&pid)
            .filter(|(w, _)| w == who)
            .map(|(_, v)| v.clone())
    }

    fn put(&self, pid: i32, who: Incarnation, verdict: Option<String>) {
        let mut g = self.0.lock().unwrap_or_else(|p| p.into_inner());
        g.insert(pid, (who, verdict));
    }

    /// Forgets processes that are no longer targets (bounded by the targets).
    fn keep_only(&self, pids: &[i32]) {
        let mut g = self.0.lock().unwrap_or_else(|p| p.into_inner());
        g.retain(|pid, _| pids.contains(pid));
    }
}

/// Why a process is not Python (None: looks like Python, or unknown: py-spy says itself).
fn not_python_reason(proc: &ProcFs, pid: i32, verdicts: &Verdicts) -> Option<String> {
    let exe = proc.exe(pid).ok()?;
    let base = exe.file_name()?.to_string_lossy().to_string();
    if base.contains("python") || base.starts_with("pypy") {
        return None;
    }
    let who = (proc.stat(pid).map_or(0, |s| s.starttime), exe.clone());
    if let Some(v) = verdicts.get(pid, &who) {
        return v;
    }
    // An embedded interpreter (uwsgi, a custom launcher) still maps libpython.
    let verdict = match proc.maps_mention(pid, "libpython") {
        Ok(true) => None,
        Ok(false) => Some(format!(
            "not a Python process (exe {}, no libpython mapped)",
            exe.display()
        )),
        // searched to its cap: given up, with the reason, not searched again each window
        Err(ProcFsError::Malformed { what, .. }) => Some(format!(
            "not searched for an interpreter further: maps {what} (exe {})",
            exe.display()
        )),
        Err(_) => return None,
    };
    verdicts.put(pid, who, verdict.clone());
    verdict
}

/// [`not_python_reason`] of each pid, in order, each under a deadline: reading `maps` takes
/// the target's mmap lock, which a wedged process may hold forever. A blocked read skips the
/// pid (py-spy would block on the same lock).
pub(super) async fn not_python_reasons(
    proc: &ProcFs,
    pids: Vec<i32>,
    verdicts: &Verdicts,
) -> Vec<Option<String>> {
    let n = pids.len();
    verdicts.keep_only(&pids);
    let items = pids.into_iter().map(|p| (proc.pid_dir(p), p)).collect();
    let (proc, verdicts) = (proc.clone(), verdicts.clone());
    let run = move || {
        crate::deadline::map(
            items,
            NOT_PYTHON_DEADLINE,
            NOT_PYTHON_DEADLINE * 4,
            move |&p| not_python_reason(&proc, p, &verdicts),
        )
    };
    match tokio::task::spawn_blocking(run).await {
        Ok(rs) => rs.into_iter().map(|r| r.unwrap_or_else(Some)).collect(),
        Err(_) => vec![None; n],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_verdict_from_maps_is_kept_for_the_incarnation() {
        let tmp = tempfile::tempdir().expect("tmp");
        let pid_dir = tmp.path().join("42");
        std::fs::create_dir_all(&pid_dir).expect("mkdir");
        std::os::unix::fs::symlink("/usr/bin/sleep", pid_dir.join("exe")).expect("ln");
        let maps = pid_dir.join("maps");
        std::fs::write(&maps, "7f00-7f01 r-xp 0 08:01 1 /usr/lib/libc.so.6\n").expect("write");
        let (proc, verdicts) = (ProcFs::new(tmp.path()), Verdicts::default());
        let first = not_python_reason(&proc, 42, &verdicts).expect("not Python");
        // maps is not read again: gone, the verdict stays
        std::fs::remove_file(&maps).expect("rm");
        assert_eq!(not_python_reason(&proc, 42, &verdicts), Some(first));
        // another executable at that pid (an exec) is judged again: maps unreadable, unknown
        std::fs::remove_file(pid_dir.join("exe")).expect("rm");
        std::os::unix::fs::symlink("/usr/bin/env", pid_dir.join("exe")).expect("ln");
        assert_eq!(not_python_reason(&proc, 42, &verdicts), None);
        verdicts.keep_only(&[]);
        assert!(verdicts.get(42, &(0, "/usr/bin/sleep".into())).is_none());
    }
}
