//! Everything a child started, even past `setsid`: as *subreaper* ([`become_subreaper`]) this
//! process stays every descendant's ancestor, so walking `/proc` down finds them all. They are
//! stopped (a stopped process cannot fork) until a walk finds no new one, then killed, each
//! through a pidfd opened while it was seen to be ours (a reused pid is never signalled).

use crate::sys::proc_fs::{ProcFs, StatReader};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};

/// Most walks of one kill (each stops what the one before found): a fork bomb cannot keep
/// it going forever.
const MAX_ROUNDS: usize = 64;

/// Whether [`become_subreaper`] succeeded: `children::kill_all` then kills every
/// descendant too.
static SUBREAPER: AtomicBool = AtomicBool::new(false);

/// Makes this process the reaper of its orphaned descendants (`PR_SET_CHILD_SUBREAPER`).
/// Whether the kernel agreed.
pub fn become_subreaper() -> bool {
    // SAFETY: prctl with integer arguments only; changes a flag of this process.
    let ok = unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0 };
    SUBREAPER.fetch_or(ok, Ordering::Relaxed);
    ok
}

/// Whether this process reaps its orphaned descendants.
pub fn is_subreaper() -> bool {
    SUBREAPER.load(Ordering::Relaxed)
}

/// The descendants of `root` (not `root` itself), as (pid, start time in ticks).
pub fn of(root: i32) -> BTreeMap<i32, u64> {
    let proc = ProcFs::real();
    let (Ok(reader), Ok(pids)) = (proc.stat_reader(), proc.pids()) else {
        return BTreeMap::new();
    };
    let mut children: BTreeMap<i32, Vec<(i32, u64)>> = BTreeMap::new();
    for pid in pids {
        if let Ok(s) = reader.brief(pid) {
            children.entry(s.ppid).or_default().push((pid, s.starttime));
        }
    }
    let mut out = BTreeMap::new();
    let mut todo = vec![root];
    while let Some(p) = todo.pop() {
        for &(c, start) in children.get(&p).map_or(&[][..], |v| v.as_slice()) {
            if out.insert(c, start).is_none() {
                todo.push(c);
            }
        }
    }
    out
}

/// SIGKILLs every descendant of `root` but those in `spare` (their own descendants are
/// not spared), and reaps those that became our children. How many were killed.
pub fn kill(root: i32, spare: &BTreeSet<i32>) -> usize {
    let Ok(reader) = ProcFs::real().stat_reader() else {
        return 0;
    };
    let mut held: BTreeMap<i32, Held> = BTreeMap::new();
    for _ in 0..MAX_ROUNDS {
        let found: Vec<(i32, u64)> = of(root)
            .into_iter()
            .filter(|(p, _)| !spare.contains(p) && !held.contains_key(p))
            .collect();
        if found.is_empty() {
            break;
        }
        for (pid, start) in found {
            if let Some(h) = Held::open(&reader, pid, start) {
                h.signal(libc::SIGSTOP);
                held.insert(pid, h);
            }
        }
    }
    for h in held.values() {
        h.signal(libc::SIGKILL);
    }
    let me = std::process::id() as i32;
    for (&pid, h) in &held {
        if h.parent == me {
            reap(pid);
        }
    }
    held.len()
}

/// A process held by a pidfd (by its pid on a kernel without pidfds, before 5.3), its
/// parent when seen.
struct Held {
    pid: i32,
    fd: Option<std::os::fd::OwnedFd>,
    parent: i32,
}

impl Held {
    /// `pid` when it is still the process that started at `start`.
    fn open(reader: &StatReader, pid: i32, start: u64) -> Option<Held> {
        use std::os::fd::FromRawFd;
        // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor or -1.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
        let fd = match i32::try_from(fd).ok().filter(|&fd| fd >= 0) {
            // SAFETY: a descriptor just returned to us, owned by nobody else.
            Some(fd) => Some(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) }),
            None if std::io::Error::last_os_error().raw_os_error() == Some(libc::ENOSYS) => None,
            None => return None,
        };
        // checked after the pidfd is open: the same start time means the pidfd is that process
        let s = reader.brief(pid).ok().filter(|s| s.starttime == start)?;
        Some(Held {
            pid,
            fd,
            parent: s.ppid,
        })
    }

    fn signal(&self, sig: i32) {
        use std::os::fd::AsRawFd;
        match &self.fd {
            // SAFETY: a pidfd we own, a signal number, no siginfo, no flags.
            Some(fd) => unsafe {
                libc::syscall(
                    libc::SYS_pidfd_send_signal,
                    fd.as_raw_fd(),
                    sig,
                    std::ptr::null::<libc::siginfo_t>(),
                    0,
                );
            },
            // SAFETY: kill with a pid and a signal number.
            None => unsafe {
                libc::kill(self.pid, sig);
            },
        }
    }
}

/// Waits for a child of ours that was just SIGKILLed (it exits at once; bounded anyway).
fn reap(pid: i32) {
    use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
    let pid = nix::unistd::Pid::from_raw(pid);
    for _ in 0..100 {
        match waitpid(pid, Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::StillAlive) => std::thread::sleep(std::time::Duration::from_millis(10)),
            _ => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::BufRead;

    #[test]
    fn kills_a_grandchild_in_a_session_of_its_own_and_spares_what_it_is_told() {
        let mut sh = std::process::Command::new("sh")
            .args(["-c", "setsid sleep 60 & echo $!; exec sleep 60"])
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        let out = sh.stdout.take().unwrap();
        std::io::BufReader::new(out).read_line(&mut line).unwrap();
        let sleeper: i32 = line.trim().parse().unwrap();
        let sh_pid = sh.id() as i32;
        // the sleeper may still be setsid(1) about to exec: it is below sh either way
        assert!(of(sh_pid).contains_key(&sleeper), "{:?}", of(sh_pid));
        let spare = BTreeSet::from([sleeper]);
        assert_eq!(kill(sh_pid, &spare), 0, "spared");
        assert_eq!(kill(sh_pid, &BTreeSet::new()), 1);
        let _ = sh.kill();
        let _ = sh.wait();
        let gone = |p: i32| {
            std::fs::read_to_string(format!("/proc/{p}/stat"))
                .map_or(true, |s| s.contains(") Z ") || s.contains(") X "))
        };
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while !gone(sleeper) && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        assert!(gone(sleeper), "the sleeper {sleeper} survived");
    }
}
