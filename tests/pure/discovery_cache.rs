//! The daemon's rediscovery on a fake /proc tree: the pre-filter never reads unrelated
//! processes' command lines, a second pass reads no command line of a known process (and
//! the `stat` line of only a slice of the unrelated ones), the profiles are compiled once,
//! and pid reuse, exec and setproctitle are read again (issue 15, item 3).

use std::path::Path;
use std::time::Duration;
use wedgewatch::discover::{
    self, CacheStats, DiscoverOptions, DiscoveryCache, MAX_ROTATION, ROTATION_BUDGET, STAT_ROTATION,
};
use wedgewatch::model::{Role, Topology};
use wedgewatch::probes::ProbeSet;

use super::fake_proc::{base, write, P};

const ENGINE: &[&str] = &["python3", "-m", "sglang.launch_server", "--port", "31012"];
const LAUNCHER: &[&str] = &[
    "timeout",
    "600",
    "python3",
    "-m",
    "sglang_router.launch_router",
    "--port",
    "30000",
    "--decode",
    "http://127.0.0.1:31012",
];
const SLEEPERS: std::ops::Range<i32> = 1000..1300;

/// An engine with a forked child that has not set its title yet, a titled router under a
/// `timeout` launcher, and 300 unrelated `sleep` processes.
fn tree(root: &Path) {
    write(root, &base(100, 1, "python3", ENGINE));
    write(root, &base(101, 100, "python3", ENGINE));
    write(root, &base(110, 1, "timeout", LAUNCHER));
    write(root, &base(111, 110, "sglang::router", &["sglang::router"]));
    for pid in SLEEPERS {
        write(root, &base(pid, 1, "sleep", &["sleep", "600"]));
    }
}

fn opts(root: &Path) -> DiscoverOptions {
    DiscoverOptions {
        proc_root: root.to_path_buf(),
        query_endpoints: false,
        exclude_pids: Vec::new(),
        http_timeout: Duration::from_millis(100),
        deadlines: wedgewatch_testkit::timing::roomy_deadlines(),
        ..DiscoverOptions::default()
    }
}

/// One pass: the topology and the reads it did.
fn pass(root: &Path, cache: &mut DiscoveryCache) -> (Topology, CacheStats) {
    pass_with(&ProbeSet::builtin().expect("probes"), root, cache)
}

fn pass_with(probes: &ProbeSet, root: &Path, cache: &mut DiscoveryCache) -> (Topology, CacheStats) {
    let before = cache.stats();
    let topo = discover::discover_cached(probes, &opts(root), cache).expect("discover");
    let after = cache.stats();
    let delta = CacheStats {
        stat_reads: after.stat_reads - before.stat_reads,
        stat_skips: after.stat_skips - before.stat_skips,
        full_reads: after.full_reads - before.full_reads,
        fd_scans: after.fd_scans - before.fd_scans,
        fd_checks: after.fd_checks - before.fd_checks,
        env_reads: after.env_reads - before.env_reads,
        versions_reads: after.versions_reads - before.versions_reads,
        profile_compiles: after.profile_compiles - before.profile_compiles,
    };
    (topo, delta)
}

fn ids(t: &Topology) -> Vec<String> {
    t.components.iter().map(|c| c.id.clone()).collect()
}

fn has_role(t: &Topology, role: Role, pid: i32) -> bool {
    t.components
        .iter()
        .any(|c| c.role == role && c.main_pid == Some(pid))
}

#[test]
fn first_pass_reads_only_candidates_and_launchers() {
    let dir = tempfile::tempdir().unwrap();
    tree(dir.path());
    let mut cache = DiscoveryCache::new();
    let (topo, reads) = pass(dir.path(), &mut cache);
    assert!(has_role(&topo, Role::Engine, 100), "{:?}", ids(&topo));
    let router = topo
        .components
        .iter()
        .find(|c| c.role == Role::Router)
        .expect("router");
    assert_eq!(router.main_pid, Some(111));
    assert_eq!(
        router
            .labels
            .get(discover::LABEL_ARGS_PID)
            .map(String::as_str),
        Some("110"),
        "the launcher, not a candidate itself, is read on demand for the arguments"
    );
    // 100, 101, 111 (candidates) and 110 (the launcher, on demand); no sleeper
    assert_eq!(reads.full_reads, 4, "{reads:?}");
    assert_eq!(reads.stat_reads, 4 + SLEEPERS.len() as u64);
    assert_eq!(reads.stat_skips, 0);
    assert_eq!(cache.len(), 4 + SLEEPERS.len());
    // the peer: what discovery did before the cache, every command line
    let (peer, peer_reads) = pass(dir.path(), &mut DiscoveryCache::uncached());
    assert_eq!(ids(&peer), ids(&topo));
    assert_eq!(peer_reads.full_reads, 4 + SLEEPERS.len() as u64);
}

#[test]
fn a_second_pass_reads_no_command_line_of_a_known_process() {
    let dir = tempfile::tempdir().unwrap();
    tree(dir.path());
    let mut cache = DiscoveryCache::new();
    let (first, first_reads) = pass(dir.path(), &mut cache);
    assert!(first_reads.env_reads >= 2, "{first_reads:?}");
    assert!(first_reads.versions_reads >= 2, "{first_reads:?}");
    let engine = first.components.iter().find(|c| c.main_pid == Some(100));
    assert_eq!(engine.map(|c| c.gpus.clone()), Some(vec![3]), "{first:?}");
    // Were any command line or environment read again, the components would lose their
    // arguments and GPUs.
    for pid in [100, 101, 110, 111].into_iter().chain(SLEEPERS) {
        std::fs::remove_file(dir.path().join(format!("{pid}/cmdline"))).unwrap();
        std::fs::remove_file(dir.path().join(format!("{pid}/environ"))).unwrap();
    }
    let (second, reads) = pass(dir.path(), &mut cache);
    assert_eq!(reads.full_reads, 0, "{reads:?}");
    assert_eq!((reads.env_reads, reads.versions_reads), (0, 0), "{reads:?}");
    // the four that matter, and the rotation's slice of the sleepers
    let sleepers = SLEEPERS.len() as u64;
    assert_eq!(
        reads.stat_reads + reads.stat_skips,
        4 + sleepers,
        "{reads:?}"
    );
    assert!(reads.stat_reads >= 4, "{reads:?}");
    assert!(
        reads.stat_reads <= 4 + sleepers.div_ceil(STAT_ROTATION),
        "{reads:?}"
    );
    assert_eq!(ids(&second), ids(&first));
    assert_eq!(second, first);
    // a one-shot discovery (fresh cache) does read them: the engine is gone
    let (cold, _) = pass(dir.path(), &mut DiscoveryCache::new());
    assert!(!has_role(&cold, Role::Engine, 100), "{:?}", ids(&cold));
}

#[test]
fn pid_reuse_exec_and_title_changes_are_read_again() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    tree(root);
    let mut cache = DiscoveryCache::new();
    let (first, _) = pass(root, &mut cache);
    assert!(!first.components.iter().any(|c| c.main_pid == Some(101)));

    // setproctitle in the forked child: comm changes, same start time and exec mark
    let title = ["sglang::scheduler_TP0"];
    let sched = |comm| P {
        pid: 101,
        ppid: 100,
        comm,
        start: 5000,
        code: 4096,
        argv: &title,
    };
    write(root, &sched("sglang::schedul"));
    // pid reuse: a sleeper's pid now a new engine (new start time, same exec mark) in a new
    // directory (the kernel's procfs gives a new process a new one, with a new inode)
    std::fs::rename(root.join("1000"), root.join("reaped-1000")).unwrap();
    let engine2 = ["python3", "-m", "sglang.launch_server", "--port", "31099"];
    let reused = P {
        pid: 1000,
        ppid: 1,
        comm: "python3",
        start: 9000,
        code: 4096,
        argv: &engine2,
    };
    write(root, &reused);
    let (t, reads) = pass(root, &mut cache);
    assert!(has_role(&t, Role::Scheduler, 101), "{:?}", ids(&t));
    assert!(has_role(&t, Role::Engine, 1000), "{:?}", ids(&t));
    assert_eq!(reads.full_reads, 2, "{reads:?}");

    // exec to another program: comm changes (sleep -> vllm), same pid and start time
    let vllm = ["vllm", "serve", "--port", "8001"];
    let exec_other = P {
        pid: 1001,
        ppid: 1,
        comm: "vllm",
        start: 5000,
        code: 4096,
        argv: &vllm,
    };
    write(root, &exec_other);
    // exec of the same program (python3 -> python3): only the exec mark moves
    let engine3 = ["python3", "-m", "sglang.launch_server", "--port", "31077"];
    let exec_same = P {
        pid: 1000,
        ppid: 1,
        comm: "python3",
        start: 9000,
        code: 8192,
        argv: &engine3,
    };
    write(root, &exec_same);
    // 1000 is a candidate now: read on the next pass; 1001 (an unrelated process that
    // exec'd in its directory) at its turn in the rotation
    let mut full_reads = 0;
    let mut seen = None;
    for n in 1..=STAT_ROTATION {
        let (t, reads) = pass(root, &mut cache);
        full_reads += reads.full_reads;
        let e = t
            .components
            .iter()
            .find(|c| c.main_pid == Some(1000))
            .expect("engine");
        assert!(e.id.ends_with(":31077"), "{}", e.id);
        if let Some(v) = t.components.iter().find(|c| c.main_pid == Some(1001)) {
            assert_eq!(v.stack, "vllm");
            seen = Some(n);
            break;
        }
    }
    assert!(
        seen.is_some(),
        "the exec'd vllm within {STAT_ROTATION} passes"
    );
    assert_eq!(full_reads, 2);
}

#[test]
fn every_unrelated_process_is_read_within_a_rotation() {
    let dir = tempfile::tempdir().unwrap();
    tree(dir.path());
    let mut cache = DiscoveryCache::new();
    pass(dir.path(), &mut cache);
    let mut reads = 0;
    for _ in 0..STAT_ROTATION {
        let (_, r) = pass(dir.path(), &mut cache);
        assert!(r.stat_reads < SLEEPERS.len() as u64, "{r:?}");
        reads += r.stat_reads - 4;
    }
    assert_eq!(reads, SLEEPERS.len() as u64, "each sleeper once a rotation");
    // every sleeper exec'd at once (`sleep` -> `vllm`): all seen within one rotation
    for pid in SLEEPERS {
        let argv = ["vllm", "serve", "--port", "8001"];
        let p = P {
            pid,
            ppid: 1,
            comm: "vllm",
            start: 5000,
            code: 4096,
            argv: &argv,
        };
        write(dir.path(), &p);
    }
    let mut engines = 0;
    for _ in 0..STAT_ROTATION {
        let (t, _) = pass(dir.path(), &mut cache);
        engines = t.components.iter().filter(|c| c.stack == "vllm").count();
    }
    assert_eq!(engines, SLEEPERS.len());
}

#[test]
fn an_unrelated_process_that_execs_an_engine_is_seen_by_its_children() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    tree(root);
    let mut cache = DiscoveryCache::new();
    pass(root, &mut cache);
    // A launcher script (`sleep` here) exec's the engine in place, which forks a scheduler
    // at once. 1002 is not in the second pass's slice of the rotation (1002 % 6 != 2).
    let engine = ["python3", "-m", "sglang.launch_server", "--port", "31055"];
    let exec = P {
        pid: 1002,
        ppid: 1,
        comm: "python3",
        start: 5000,
        code: 8192,
        argv: &engine,
    };
    write(root, &exec);
    let title = ["sglang::scheduler_TP0"];
    let child = P {
        pid: 1400,
        ppid: 1002,
        comm: "sglang::schedul",
        start: 9100,
        code: 8192,
        argv: &title,
    };
    write(root, &child);
    let (t, reads) = pass(root, &mut cache);
    assert!(has_role(&t, Role::Engine, 1002), "{:?}", ids(&t));
    assert!(has_role(&t, Role::Scheduler, 1400), "{:?}", ids(&t));
    assert_eq!(reads.full_reads, 2, "{reads:?}");
    assert!(reads.stat_reads < SLEEPERS.len() as u64, "{reads:?}");
}

#[test]
fn the_profiles_are_compiled_once_per_cache() {
    let dir = tempfile::tempdir().unwrap();
    tree(dir.path());
    let mut cache = DiscoveryCache::new();
    let (first, reads) = pass(dir.path(), &mut cache);
    assert_eq!(reads.profile_compiles, 1);
    for _ in 0..3 {
        let (t, reads) = pass(dir.path(), &mut cache);
        assert_eq!(reads.profile_compiles, 0, "{reads:?}");
        assert_eq!(t, first);
    }
    // other profiles (a user's probe file): compiled again, then kept
    let mut probes = ProbeSet::builtin().expect("probes");
    probes.profiles.retain(|p| p.stack != "vllm");
    let (_, reads) = pass_with(&probes, dir.path(), &mut cache);
    assert_eq!(reads.profile_compiles, 1);
    let (_, reads) = pass_with(&probes, dir.path(), &mut cache);
    assert_eq!(reads.profile_compiles, 0);
}

#[test]
fn entries_of_dead_processes_are_dropped() {
    let dir = tempfile::tempdir().unwrap();
    tree(dir.path());
    let mut cache = DiscoveryCache::new();
    pass(dir.path(), &mut cache);
    assert_eq!(cache.len(), 4 + SLEEPERS.len());
    for pid in SLEEPERS.skip(10) {
        std::fs::remove_dir_all(dir.path().join(pid.to_string())).unwrap();
    }
    let (_, reads) = pass(dir.path(), &mut cache);
    assert_eq!(cache.len(), 4 + 10);
    assert_eq!(reads.full_reads, 0);
}

/// `pid` as a kernel thread (`PF_KTHREAD` in its `stat` flags) under kthreadd.
fn write_kthread(root: &Path, pid: i32) {
    let dir = root.join(pid.to_string());
    std::fs::create_dir_all(&dir).unwrap();
    let stat = format!(
        "{pid} (kworker/0:1) I 2 0 0 0 -1 69238880 0 0 0 0 0 3 0 0 20 0 1 0 40 0 0 \
         18446744073709551615 0 0 0 0 0 0 0 2147483647 0 0 0 0 17 0 0 0 0 0 0 0 0 0 0 0 0 0 0\n"
    );
    std::fs::write(dir.join("stat"), stat).unwrap();
}

#[test]
fn many_unrelated_processes_lengthen_the_rotation_not_the_pass() {
    assert_eq!(discover::rotation_len(0), STAT_ROTATION);
    assert_eq!(
        discover::rotation_len(6 * ROTATION_BUDGET as usize),
        STAT_ROTATION
    );
    assert_eq!(
        discover::rotation_len(6 * ROTATION_BUDGET as usize + 1),
        2 * STAT_ROTATION
    );
    assert_eq!(discover::rotation_len(usize::MAX), MAX_ROTATION);
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    tree(root);
    // 1,300 sleepers in all: a slice of a sixth would be 217 `stat` reads a pass
    let many = 2000..3000;
    for pid in many.clone() {
        write(root, &base(pid, 1, "sleep", &["sleep", "600"]));
    }
    let unrelated = SLEEPERS.len() + many.len();
    let mut cache = DiscoveryCache::new();
    pass(root, &mut cache);
    let len = discover::rotation_len(unrelated);
    assert_eq!(len, 4 * STAT_ROTATION);
    let mut reads = 0;
    for _ in 0..len {
        let (_, r) = pass(root, &mut cache);
        assert_eq!(cache.rotation(), len);
        assert!(r.stat_reads - 4 <= ROTATION_BUDGET, "{r:?}");
        reads += r.stat_reads - 4;
    }
    assert_eq!(reads, unrelated as u64, "each sleeper once a rotation");
    // one of them exec's vllm in place: seen within the (longer) rotation
    let argv = ["vllm", "serve", "--port", "8002"];
    let exec = P {
        pid: 2500,
        ppid: 1,
        comm: "vllm",
        start: 5000,
        code: 8192,
        argv: &argv,
    };
    write(root, &exec);
    let seen = (1..=len).find(|_| {
        let (t, _) = pass(root, &mut cache);
        t.components.iter().any(|c| c.main_pid == Some(2500))
    });
    assert!(seen.is_some(), "the exec'd vllm within {len} passes");
}

#[test]
fn kernel_threads_are_known_by_their_flag_and_left_out_of_the_rotation() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    tree(root);
    write_kthread(root, 50);
    // In a pid namespace pid 2 is anyone's: here a shell whose child is an engine.
    write(root, &base(2, 1, "bash", &["bash", "run.sh"]));
    let engine = ["python3", "-m", "sglang.launch_server", "--port", "31033"];
    write(root, &base(300, 2, "python3", &engine));
    let mut cache = DiscoveryCache::new();
    let (t, _) = pass(root, &mut cache);
    assert!(has_role(&t, Role::Engine, 300), "{:?}", ids(&t));
    assert!(!t.components.iter().any(|c| c.main_pid == Some(50)));
    // The kernel thread is not read again: were it, this (impossible) exec would show.
    let argv = ["vllm", "serve", "--port", "8003"];
    write(root, &base(50, 2, "vllm", &argv));
    for _ in 0..2 * STAT_ROTATION {
        let (t, _) = pass(root, &mut cache);
        assert!(has_role(&t, Role::Engine, 300), "{:?}", ids(&t));
        assert!(!t.components.iter().any(|c| c.main_pid == Some(50)));
    }
}

/// Issue 34, item 16: a versions read that times out every time (here the engine's `maps`
/// is a FIFO nobody writes, like a process holding its mmap lock) is tried again on the next
/// passes, but at most three times per process incarnation, not on every pass forever.
#[test]
fn a_versions_read_that_keeps_timing_out_is_given_up_after_three_tries() {
    let dir = tempfile::tempdir().unwrap();
    tree(dir.path());
    let maps = dir.path().join("100/maps");
    nix::unistd::mkfifo(&maps, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    let mut cache = DiscoveryCache::new();
    let reads: Vec<u64> = (0..5)
        .map(|_| pass(dir.path(), &mut cache).1.versions_reads)
        .collect();
    // let the reader thread left blocked on the FIFO end
    use std::os::unix::fs::OpenOptionsExt;
    drop(
        std::fs::OpenOptions::new()
            .write(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(&maps),
    );
    assert!(reads[1] >= 1 && reads[2] >= 1, "tried again: {reads:?}");
    assert_eq!(&reads[3..], &[0, 0], "given up after three: {reads:?}");
}
