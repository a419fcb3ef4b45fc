//! Process facts from /proc: cmdline, environment, executable, start time, state, threads,
//! fds, CPU time, RSS, NSpid and namespaces.
//!
//! Every field is read on its own: a field that cannot be read (permission denied, the process
//! vanished mid-read, a truncated file) is recorded in `errors` with the reason and the other
//! fields are still filled. The procfs root is configurable so tests can point at fixture
//! trees (`tests/fixtures/proc/...`).

use crate::clock::{Clock, Millis};
use crate::model::{
    FieldError, Payload, ProcessFacts, Sample, SourceKind, SourceStatus, ThreadInfo, Topology,
};
use crate::sources::{BoxFuture, Source};
use procfs::process::{FDTarget, Process};
use procfs::ProcError;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Most threads we name per process: a scheduler has a few dozen; a runaway process with
/// thousands must not make a 1 Hz source slow.
const MAX_THREADS: usize = 512;
/// Longest wait for one process's facts (normally well under a millisecond).
const PER_PID: Duration = Duration::from_millis(300);
/// Longest wait for all of them: under the sampler's 2 s timeout for this source, so a
/// blocked process shows up as a named field error rather than a source timeout.
const ALL_PIDS: Duration = Duration::from_millis(1500);

/// Boot time (epoch ms) from `<proc_root>/stat`'s `btime` line.
pub fn boot_time_ms(proc_root: &Path) -> Option<Millis> {
    let text = std::fs::read_to_string(proc_root.join("stat")).ok()?;
    let secs: i64 = text
        .lines()
        .find_map(|l| l.strip_prefix("btime "))?
        .trim()
        .parse()
        .ok()?;
    Some(secs * 1000)
}

/// Human reason for a procfs error: what an operator can act on.
pub fn reason(e: &ProcError) -> String {
    match e {
        ProcError::PermissionDenied(p) => match p {
            Some(p) => format!("permission denied ({})", p.display()),
            None => "permission denied".into(),
        },
        ProcError::NotFound(p) => match p {
            Some(p) => format!("vanished or absent ({})", p.display()),
            None => "vanished or absent".into(),
        },
        ProcError::Incomplete(_) => "incomplete read".into(),
        ProcError::Io(e, p) => match p {
            Some(p) => format!("{e} ({})", p.display()),
            None => e.to_string(),
        },
        ProcError::Other(s) => s.clone(),
        other => format!("{other:?}"),
    }
}

fn proc_dir(proc_root: &Path, pid: i32) -> PathBuf {
    proc_root.join(pid.to_string())
}

/// Reads a namespace link (`net:[4026531840]`) and returns the inode.
fn ns_inode(proc_root: &Path, pid: i32, ns: &str) -> Result<u64, String> {
    let link = proc_dir(proc_root, pid).join("ns").join(ns);
    let target = std::fs::read_link(&link).map_err(|e| io_reason(&e, &link))?;
    let s = target.to_string_lossy();
    s.split_once('[')
        .and_then(|(_, rest)| rest.strip_suffix(']'))
        .and_then(|n| n.parse().ok())
        .ok_or_else(|| format!("unexpected link {s:?}"))
}

fn io_reason(e: &std::io::Error, path: &Path) -> String {
    match e.kind() {
        std::io::ErrorKind::PermissionDenied => format!("permission denied ({})", path.display()),
        std::io::ErrorKind::NotFound => format!("vanished or absent ({})", path.display()),
        _ => format!("{e} ({})", path.display()),
    }
}

/// Facts about one process under `proc_root` (normally `/proc`). Never fails: what could not
/// be read is in `errors`.
pub fn facts(proc_root: &Path, pid: i32) -> ProcessFacts {
    facts_with_boot(proc_root, pid, boot_time_ms(proc_root))
}

/// As [`facts`], with the boot time already known (the source reads it once).
pub fn facts_with_boot(proc_root: &Path, pid: i32, boot_ms: Option<Millis>) -> ProcessFacts {
    let mut f = ProcessFacts {
        pid,
        ..ProcessFacts::default()
    };
    let mut err = |field: &str, reason: String| {
        f.errors.push(FieldError {
            field: field.to_string(),
            reason,
        })
    };
    let proc = match Process::new_with_root(proc_dir(proc_root, pid)) {
        Ok(p) => p,
        Err(e) => {
            let r = reason(&e);
            for field in [
                "process", "cmdline", "env", "exe", "stat", "status", "threads", "fds",
            ] {
                err(field, r.clone());
            }
            return f;
        }
    };
    let mut errors: Vec<FieldError> = Vec::new();
    let mut push = |field: &str, reason: String| {
        errors.push(FieldError {
            field: field.to_string(),
            reason,
        })
    };

    match proc.stat() {
        Ok(st) => {
            f.ppid = Some(st.ppid);
            f.comm = Some(st.comm.clone());
            f.state = Some(st.state.to_string());
            f.start_ticks = Some(st.starttime);
            let tps = procfs::ticks_per_second().max(1);
            f.cpu_time_ms = Some((st.utime + st.stime) * 1000 / tps);
            if let Some(boot) = boot_ms {
                f.started_at_ms = Some(boot + (st.starttime * 1000 / tps) as Millis);
            } else {
                push("started_at", "boot time unknown (no btime in stat)".into());
            }
            f.rss_bytes = Some(st.rss * procfs::page_size());
        }
        Err(e) => push("stat", reason(&e)),
    }
    // comm from its own file is authoritative (stat's is parsed around parentheses)
    match std::fs::read_to_string(proc_dir(proc_root, pid).join("comm")) {
        Ok(c) => f.comm = Some(c.trim_end_matches('\n').to_string()),
        Err(e) if f.comm.is_none() => push(
            "comm",
            io_reason(&e, &proc_dir(proc_root, pid).join("comm")),
        ),
        Err(_) => {}
    }
    match proc.status() {
        Ok(st) => {
            f.nspid = st.nspid.clone();
            if let Some(kb) = st.vmrss {
                f.rss_bytes = Some(kb * 1024);
            }
        }
        Err(e) => push("status", reason(&e)),
    }
    match proc.cmdline() {
        Ok(c) => f.cmdline = Some(c),
        Err(e) => push("cmdline", reason(&e)),
    }
    match proc.environ() {
        Ok(env) => {
            let map: BTreeMap<String, String> = env
                .into_iter()
                .map(|(k, v)| {
                    (
                        k.to_string_lossy().into_owned(),
                        v.to_string_lossy().into_owned(),
                    )
                })
                .collect();
            f.env = Some(map);
        }
        Err(e) => push("env", reason(&e)),
    }
    match proc.exe() {
        Ok(p) => f.exe = Some(p.to_string_lossy().into_owned()),
        Err(e) => push("exe", reason(&e)),
    }
    // procfs's fast path (st_size of the fd dir) only holds on a real procfs; fixture
    // trees are plain directories, so count entries there
    if proc_root == Path::new("/proc") {
        match proc.fd_count() {
            Ok(n) => f.fd_count = Some(n as u32),
            Err(e) => push("fds", reason(&e)),
        }
    } else {
        let fd_dir = proc_dir(proc_root, pid).join("fd");
        match std::fs::read_dir(&fd_dir) {
            Ok(rd) => f.fd_count = Some(rd.count() as u32),
            Err(e) => push("fds", io_reason(&e, &fd_dir)),
        }
    }
    match read_threads(&proc_dir(proc_root, pid)) {
        Ok(t) => f.threads = Some(t),
        Err(r) => push("threads", r),
    }
    match ns_inode(proc_root, pid, "net") {
        Ok(n) => f.netns = Some(n),
        Err(r) => push("netns", r),
    }
    match ns_inode(proc_root, pid, "pid") {
        Ok(n) => f.pidns = Some(n),
        Err(r) => push("pidns", r),
    }
    f.errors = errors;
    f
}

/// Thread ids and names from `task/*/comm` (bounded by [`MAX_THREADS`]).
fn read_threads(dir: &Path) -> Result<Vec<ThreadInfo>, String> {
    let task = dir.join("task");
    let rd = std::fs::read_dir(&task).map_err(|e| io_reason(&e, &task))?;
    let mut out = Vec::new();
    for entry in rd.flatten() {
        let Some(tid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<i32>().ok())
        else {
            continue;
        };
        // a thread that exits between readdir and read is simply gone; keep the tid
        let name = std::fs::read_to_string(entry.path().join("comm"))
            .map(|s| s.trim_end_matches('\n').to_string())
            .unwrap_or_default();
        out.push(ThreadInfo { tid, name });
        if out.len() >= MAX_THREADS {
            break;
        }
    }
    out.sort_by_key(|t| t.tid);
    Ok(out)
}

/// Socket inodes held open by `pid` (from `fd/*` links). Used by discovery and proxies.
pub fn socket_inodes(proc_root: &Path, pid: i32) -> Result<BTreeSet<u64>, String> {
    let proc = Process::new_with_root(proc_dir(proc_root, pid)).map_err(|e| reason(&e))?;
    let fds = proc.fd().map_err(|e| reason(&e))?;
    Ok(fds
        .flatten()
        .filter_map(|fd| match fd.target {
            FDTarget::Socket(inode) => Some(inode),
            _ => None,
        })
        .collect())
}

/// Every pid of the topology, plus the pids whose cmdline/environ stand in for titled
/// components (`env_pid`/`args_pid` labels), deduplicated and sorted.
pub fn topology_pids(topo: &Topology) -> Vec<i32> {
    let mut pids: BTreeSet<i32> = BTreeSet::new();
    for c in &topo.components {
        pids.extend(c.pids.iter().copied());
        for key in [
            crate::model::topology::labels::LABEL_ENV_PID,
            crate::model::topology::labels::LABEL_ARGS_PID,
        ] {
            if let Some(p) = c.labels.get(key).and_then(|v| v.parse().ok()) {
                pids.insert(p);
            }
        }
    }
    pids.into_iter().collect()
}

/// The process-facts source: facts for every pid of the topology, each tick.
#[derive(Debug, Clone)]
pub struct ProcessesSource {
    pub proc_root: PathBuf,
}

impl ProcessesSource {
    pub fn new(proc_root: impl Into<PathBuf>) -> Self {
        ProcessesSource {
            proc_root: proc_root.into(),
        }
    }

    /// One synchronous pass (the async `sample` runs this on a blocking thread).
    pub fn collect(&self, pids: &[i32]) -> (Vec<ProcessFacts>, SourceStatus) {
        if std::fs::read_dir(&self.proc_root).is_err() {
            return (
                Vec::new(),
                SourceStatus::unavailable(format!(
                    "cannot read procfs at {}",
                    self.proc_root.display()
                )),
            );
        }
        let facts = self.read_bounded(pids);
        let with_errors: Vec<String> = facts
            .iter()
            .filter(|f| !f.errors.is_empty())
            .map(|f| match f.errors.iter().find(|e| e.field == "process") {
                // Not read at all (blocked, vanished): the reason is the news.
                Some(e) => format!("pid {}: {}", f.pid, e.reason),
                None => {
                    let fields: Vec<&str> = f.errors.iter().map(|e| e.field.as_str()).collect();
                    format!("pid {}: {}", f.pid, fields.join(","))
                }
            })
            .collect();
        let status = if with_errors.is_empty() {
            SourceStatus::ok()
        } else {
            SourceStatus::degraded(format!(
                "some fields unreadable: {}",
                with_errors.join("; ")
            ))
        };
        (facts, status)
    }

    /// Facts of each pid, each under [`PER_PID`] and all under [`ALL_PIDS`]: a process
    /// whose reads block (its mmap lock held) gets an error naming the read, not our hang.
    fn read_bounded(&self, pids: &[i32]) -> Vec<ProcessFacts> {
        let root = self.proc_root.clone();
        let boot = boot_time_ms(&root);
        let items = pids.iter().map(|&p| (proc_dir(&root, p), p)).collect();
        let read = move |&pid: &i32| facts_with_boot(&root, pid, boot);
        let results = crate::deadline::map(items, PER_PID, ALL_PIDS, read);
        pids.iter()
            .zip(results)
            .map(|(&pid, r)| {
                r.unwrap_or_else(|reason| ProcessFacts {
                    pid,
                    errors: vec![FieldError {
                        field: "process".into(),
                        reason,
                    }],
                    ..ProcessFacts::default()
                })
            })
            .collect()
    }
}

impl Source for ProcessesSource {
    fn kind(&self) -> SourceKind {
        SourceKind::Processes
    }

    fn sample<'a>(&'a self, topo: &'a Topology, clock: &'a dyn Clock) -> BoxFuture<'a, Sample> {
        Box::pin(async move {
            let t_ms = clock.now_ms();
            let started = Instant::now();
            let pids = topology_pids(topo);
            let this = self.clone();
            let joined = tokio::task::spawn_blocking(move || this.collect(&pids)).await;
            let (facts, status) = match joined {
                Ok(r) => r,
                Err(e) => (
                    Vec::new(),
                    SourceStatus::unavailable(format!("process reader failed: {e}")),
                ),
            };
            Sample {
                t_ms,
                status,
                took_ms: started.elapsed().as_millis() as u64,
                payload: Payload::Processes(facts),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_process_facts_are_complete() {
        let me = std::process::id() as i32;
        let f = facts(Path::new("/proc"), me);
        assert!(f.errors.is_empty(), "{:?}", f.errors);
        assert_eq!(f.pid, me);
        assert!(f.cmdline.as_ref().is_some_and(|c| !c.is_empty()));
        assert!(f.env.as_ref().is_some_and(|e| !e.is_empty()));
        assert!(f
            .threads
            .as_ref()
            .is_some_and(|t| t.iter().any(|t| t.tid == me)));
        assert!(f.fd_count.unwrap_or(0) >= 3);
        assert!(f.netns.is_some() && f.pidns.is_some());
        let now = crate::clock::SystemClock.now_ms();
        let started = f.started_at_ms.expect("started_at");
        assert!(
            started <= now + 1000 && started > now - 3_600_000,
            "{started} vs {now}"
        );
        assert_eq!(f.nspid.as_ref().and_then(|n| n.last().copied()), Some(me));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn source_samples_every_topology_pid_quickly() {
        let me = std::process::id() as i32;
        let mut topo = Topology::default();
        let mut c = crate::model::Component::new("engine@x", crate::model::Role::Engine, "t");
        c.pids = vec![me];
        c.labels.insert(
            crate::model::topology::labels::LABEL_ENV_PID.into(),
            "1".into(),
        );
        topo.components.push(c);
        let mut gone = crate::model::Component::new("other@y", crate::model::Role::Other, "t");
        gone.pids = vec![i32::MAX - 3];
        topo.components.push(gone);
        let src = ProcessesSource::new("/proc");
        let clock = crate::clock::FakeClock::new(42);
        let s = src.sample(&topo, &clock).await;
        assert_eq!(s.t_ms, 42);
        let Payload::Processes(facts) = &s.payload else {
            panic!("wrong payload {:?}", s.payload.kind())
        };
        let pids: Vec<i32> = facts.iter().map(|f| f.pid).collect();
        assert_eq!(pids, vec![1, me, i32::MAX - 3]);
        // the vanished pid degrades the source, with a reason naming it
        assert_eq!(s.status.status, crate::model::Status::Degraded);
        assert!(s
            .status
            .reason
            .as_deref()
            .is_some_and(|r| r.contains(&(i32::MAX - 3).to_string())));
        // cheap enough for 1 Hz on ~10 pids
        let t0 = Instant::now();
        for _ in 0..10 {
            let _ = facts_with_boot(Path::new("/proc"), me, Some(0));
        }
        assert!(
            t0.elapsed() < std::time::Duration::from_millis(500),
            "{:?}",
            t0.elapsed()
        );
    }

    #[test]
    fn vanished_pid_records_reasons_per_field() {
        let f = facts(Path::new("/proc"), i32::MAX - 7);
        assert!(f.cmdline.is_none());
        assert!(f
            .errors
            .iter()
            .any(|e| e.field == "cmdline" && e.reason.contains("vanished")));
    }

    /// Copies a fixture procfs tree (files, directories, symlinks).
    pub(crate) fn copy_tree(from: &Path, to: &Path) {
        std::fs::create_dir_all(to).unwrap();
        for e in std::fs::read_dir(from).unwrap().flatten() {
            let (src, dst) = (e.path(), to.join(e.file_name()));
            let ft = e.file_type().unwrap();
            if ft.is_symlink() {
                std::os::unix::fs::symlink(std::fs::read_link(&src).unwrap(), &dst).unwrap();
            } else if ft.is_dir() {
                copy_tree(&src, &dst);
            } else {
                std::fs::copy(&src, &dst).unwrap();
            }
        }
    }

    #[test]
    fn a_process_whose_reads_block_is_named_not_waited_for() {
        let dir = tempfile::tempdir().unwrap();
        let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/proc/container");
        copy_tree(&fixture, dir.path());
        // A FIFO nobody writes: reading it blocks forever, as /proc/PID/cmdline does while
        // the process holds its mmap lock.
        let cmdline = dir.path().join("101/cmdline");
        std::fs::remove_file(&cmdline).unwrap();
        nix::unistd::mkfifo(&cmdline, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        let src = ProcessesSource::new(dir.path());
        let t0 = Instant::now();
        let (facts, status) = src.collect(&[100, 101]);
        assert!(t0.elapsed() < Duration::from_secs(10), "{:?}", t0.elapsed());
        assert!(facts[0].cmdline.is_some(), "{:?}", facts[0].errors);
        let why = &facts[1].errors[0].reason;
        assert!(
            why.contains("timed out reading") && why.contains("101"),
            "{why}"
        );
        assert_eq!(status.status, crate::model::Status::Degraded);
        // The reader left behind is not doubled by the next tick.
        let (facts, _) = src.collect(&[101]);
        assert!(facts[0].errors[0].reason.contains("still blocked"));
        drop(std::fs::OpenOptions::new().write(true).open(&cmdline));
    }
}
