//! Process facts from /proc: cmdline, environment, executable, start time, state, threads,
//! fds, CPU time, RSS, NSpid and namespaces.
//!
//! Every field is read on its own (through [`ProcFs`]): one that cannot be read is recorded in
//! `errors` with the reason and the others are still filled.

use crate::clock::{Clock, Millis};
use crate::model::{FieldError, Payload, ProcessFacts, Sample, SourceKind, SourceStatus, Topology};
use crate::sources::{BoxFuture, Source};
use crate::sys::ProcFs;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Most threads we name per process: a runaway one must not make a 1 Hz source slow.
const MAX_THREADS: usize = 512;
/// Longest wait for one process's facts (normally well under a millisecond).
const PER_PID: Duration = Duration::from_millis(300);
/// Longest wait for all of them: under the sampler's 2 s timeout for this source, so a
/// blocked process shows up as a named field error rather than a source timeout.
const ALL_PIDS: Duration = Duration::from_millis(1500);

/// Boot time (epoch ms) from `<proc_root>/stat`'s `btime` line.
pub fn boot_time_ms(proc_root: &Path) -> Option<Millis> {
    ProcFs::new(proc_root).boot_time_ms()
}

/// Facts about one process under `proc_root` (normally `/proc`). Never fails: what could not
/// be read is in `errors`.
pub fn facts(proc_root: &Path, pid: i32) -> ProcessFacts {
    let proc = ProcFs::new(proc_root);
    facts_with_boot(&proc, pid, proc.boot_time_ms())
}

/// Records each field's failure by name, and reads on.
struct Errors(Vec<FieldError>);

impl Errors {
    fn push(&mut self, field: &str, reason: impl ToString) {
        self.0.push(FieldError {
            field: field.to_string(),
            reason: reason.to_string(),
        });
    }
}

/// As [`facts`], with the boot time already known (the source reads it once).
pub fn facts_with_boot(proc: &ProcFs, pid: i32, boot_ms: Option<Millis>) -> ProcessFacts {
    let mut f = ProcessFacts {
        pid,
        ..ProcessFacts::default()
    };
    let mut errors = Errors(Vec::new());
    if let Err(e) = proc.exists(pid) {
        for field in [
            "process", "cmdline", "env", "exe", "stat", "status", "threads", "fds",
        ] {
            errors.push(field, &e);
        }
        f.errors = errors.0;
        return f;
    }
    read_stat(proc, pid, boot_ms, &mut f, &mut errors);
    match proc.status(pid) {
        Ok(st) => {
            f.nspid = st.nspid.clone();
            if let Some(kb) = st.vmrss {
                f.rss_bytes = Some(kb * 1024);
            }
        }
        Err(e) => errors.push("status", e),
    }
    match proc.cmdline(pid) {
        Ok(c) => f.cmdline = Some(c),
        Err(e) => errors.push("cmdline", e),
    }
    match proc.environ(pid) {
        Ok(env) => f.env = Some(env),
        Err(e) => errors.push("env", e),
    }
    match proc.exe(pid) {
        Ok(p) => f.exe = Some(p.to_string_lossy().into_owned()),
        Err(e) => errors.push("exe", e),
    }
    read_tasks_and_namespaces(proc, pid, &mut f, &mut errors);
    f.errors = errors.0;
    f
}

/// `stat` (ppid, state, start, CPU, RSS) and `comm`.
fn read_stat(
    proc: &ProcFs,
    pid: i32,
    boot_ms: Option<Millis>,
    f: &mut ProcessFacts,
    errors: &mut Errors,
) {
    match proc.stat(pid) {
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
                errors.push("started_at", "boot time unknown (no btime in stat)");
            }
            f.rss_bytes = Some(st.rss * procfs::page_size());
        }
        Err(e) => errors.push("stat", e),
    }
    // comm from its own file is authoritative (stat's is parsed around parentheses)
    match proc.comm(pid) {
        Ok(c) => f.comm = Some(c),
        Err(e) if f.comm.is_none() => errors.push("comm", e),
        Err(_) => {}
    }
}

/// Fd count, threads, and the network and pid namespaces.
fn read_tasks_and_namespaces(proc: &ProcFs, pid: i32, f: &mut ProcessFacts, errors: &mut Errors) {
    match proc.fd_count(pid) {
        Ok(n) => f.fd_count = Some(n as u32),
        Err(e) => errors.push("fds", e),
    }
    match proc.threads(pid, MAX_THREADS) {
        Ok(t) => f.threads = Some(t),
        Err(e) => errors.push("threads", e),
    }
    match proc.ns_inode(pid, "net") {
        Ok(n) => f.netns = Some(n),
        Err(e) => errors.push("netns", e),
    }
    match proc.ns_inode(pid, "pid") {
        Ok(n) => f.pidns = Some(n),
        Err(e) => errors.push("pidns", e),
    }
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
        if ProcFs::new(&self.proc_root).readable().is_err() {
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
        let proc = ProcFs::new(&self.proc_root);
        let boot = proc.boot_time_ms();
        let items = pids.iter().map(|&p| (proc.pid_dir(p), p)).collect();
        let read = move |&pid: &i32| facts_with_boot(&proc, pid, boot);
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
            let pids = topo.pids();
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
        let fixture =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/proc/container");
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
