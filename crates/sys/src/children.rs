//! The child processes this tool spawns (py-spy), tracked so that none outlives the tool.
//!
//! Each child runs in its own process group (so a timeout kills what it started), which a
//! terminal's Ctrl-C does not reach; so its group is killed on timeout and drop ([`Spawned`]),
//! by [`kill_all`] from a signal handler, and by the kernel when we die ([`die_with_parent`]).

use std::collections::BTreeSet;
use std::sync::Mutex;

pub mod descendants;

/// Process groups spawned and not yet reaped.
static GROUPS: Mutex<BTreeSet<i32>> = Mutex::new(BTreeSet::new());

fn groups() -> std::sync::MutexGuard<'static, BTreeSet<i32>> {
    // A panic while holding the lock must not stop us from killing children.
    GROUPS.lock().unwrap_or_else(|p| p.into_inner())
}

/// A registered child process group. Dropping it kills the group (a no-op when the child
/// was already reaped: see [`Spawned::reaped`]) and forgets it.
#[derive(Debug)]
pub struct Spawned {
    pgid: i32,
    reaped: bool,
}

impl Spawned {
    /// Registers the group led by `pgid` (a child spawned with `process_group(0)`).
    pub fn register(pgid: i32) -> Spawned {
        groups().insert(pgid);
        Spawned {
            pgid,
            reaped: false,
        }
    }

    /// Kills the whole group now (the child is not reaped yet, so the id is still ours).
    pub fn kill(&self) {
        kill_group(self.pgid);
    }

    /// The leader was reaped: its id may be reused, never signal it again.
    pub fn reaped(&mut self) {
        self.reaped = true;
        groups().remove(&self.pgid);
    }
}

impl Drop for Spawned {
    fn drop(&mut self) {
        if !self.reaped {
            kill_group(self.pgid);
        }
        groups().remove(&self.pgid);
    }
}

fn kill_group(pgid: i32) {
    if pgid > 1 {
        let _ = nix::sys::signal::killpg(
            nix::unistd::Pid::from_raw(pgid),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
}

/// SIGKILLs every registered group; returns how many there were. For signal handlers and
/// exit paths.
pub fn kill_all() -> usize {
    let g = groups();
    for &pgid in g.iter() {
        kill_group(pgid);
    }
    // and, once we reap orphans (`fleet`), whatever left a group
    if descendants::is_subreaper() {
        descendants::kill(std::process::id() as i32, &BTreeSet::new());
    }
    g.len()
}

/// How many groups are registered now.
pub fn live() -> usize {
    groups().len()
}

/// Makes the kernel SIGKILL the child when the thread that spawned it dies (tokio's workers
/// live as long as the runtime, so at the latest when the runtime is gone).
pub fn die_with_parent(cmd: &mut tokio::process::Command) {
    let parent = std::process::id();
    // SAFETY: the closure runs between fork and exec and only makes two async-signal-safe
    // system calls (prctl, getppid); it allocates nothing and takes no lock.
    unsafe {
        cmd.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // We died between fork and prctl: nobody would kill this child later.
            if libc::getppid() as u32 != parent {
                libc::_exit(1);
            }
            Ok(())
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kill_all_kills_registered_groups_and_drop_forgets_them() {
        let mut cmd = tokio::process::Command::new("sleep");
        cmd.arg("60").process_group(0);
        die_with_parent(&mut cmd);
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let mut child = cmd.spawn().unwrap();
            let pid = child.id().unwrap() as i32;
            let mut reg = Spawned::register(pid);
            assert!(kill_all() >= 1);
            let status = tokio::time::timeout(std::time::Duration::from_secs(20), child.wait())
                .await
                .expect("the child outlived kill_all")
                .unwrap();
            assert!(!status.success());
            reg.reaped();
            drop(reg);
            assert!(!groups().contains(&pid));
        });
    }
}
