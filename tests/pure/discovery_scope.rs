//! `--within`: on a host shared by two stacks, discovery keeps to the trees it was given
//! (a fake /proc: each stack's engine and router under a launcher of its own).

use std::path::Path;
use std::time::Duration;
use wedgewatch::discover::{self, DiscoverOptions};
use wedgewatch::model::Topology;
use wedgewatch::probes::ProbeSet;

use super::fake_proc::{base, write};

const KEEPER: &[&str] = &["python3", "keeper.py"];
const ENGINE_A: &[&str] = &["python3", "-m", "sglang.launch_server", "--port", "31012"];
const ROUTER_A: &[&str] = &[
    "python3",
    "-m",
    "sglang_router.launch_router",
    "--port",
    "30000",
];
const ENGINE_B: &[&str] = &["python3", "-m", "sglang.launch_server", "--port", "32012"];
const ROUTER_B: &[&str] = &[
    "python3",
    "-m",
    "sglang_router.launch_router",
    "--port",
    "30001",
];

/// Stack A under launcher 200 (its engine forked a child), stack B under launcher 300.
fn two_stacks(root: &Path) {
    write(root, &base(200, 1, "python3", KEEPER));
    write(root, &base(201, 200, "python3", ENGINE_A));
    write(root, &base(202, 201, "python3", ENGINE_A));
    write(root, &base(210, 200, "python3", ROUTER_A));
    write(root, &base(300, 1, "python3", KEEPER));
    write(root, &base(301, 300, "python3", ENGINE_B));
    write(root, &base(310, 300, "python3", ROUTER_B));
}

/// Discovery of the fake tree at `root`, kept to `within`, with `--pid` targets `extra_pids`.
fn opts(root: &Path, within: &[i32], extra_pids: &[i32]) -> DiscoverOptions {
    DiscoverOptions {
        proc_root: root.to_path_buf(),
        within: within.to_vec(),
        extra_pids: extra_pids.to_vec(),
        query_endpoints: false,
        exclude_pids: Vec::new(),
        http_timeout: Duration::from_millis(100),
        deadlines: wedgewatch_testkit::timing::roomy_deadlines(),
        ..DiscoverOptions::default()
    }
}

fn discover_within(root: &Path, within: &[i32], extra_pids: &[i32]) -> Topology {
    let opts = opts(root, within, extra_pids);
    discover::discover(&ProbeSet::builtin().expect("probes"), &opts).expect("discover")
}

/// The main pids of the top-level components found, sorted.
fn mains(t: &Topology) -> Vec<i32> {
    let mut v: Vec<i32> = t
        .components
        .iter()
        .filter(|c| c.parent.is_none())
        .filter_map(|c| c.main_pid)
        .collect();
    v.sort_unstable();
    v
}

#[test]
fn within_a_launcher_only_its_stack_is_discovered() {
    let dir = tempfile::tempdir().expect("tempdir");
    two_stacks(dir.path());
    assert_eq!(
        mains(&discover_within(dir.path(), &[], &[])),
        [201, 210, 301, 310]
    );
    assert_eq!(mains(&discover_within(dir.path(), &[200], &[])), [201, 210]);
    assert_eq!(mains(&discover_within(dir.path(), &[300], &[])), [301, 310]);
    assert_eq!(
        mains(&discover_within(dir.path(), &[200, 300], &[])),
        [201, 210, 301, 310]
    );
    // a root inside a stack: the engine and what it started, not its sibling router
    assert_eq!(mains(&discover_within(dir.path(), &[201], &[])), [201]);
}

#[test]
fn a_pid_target_outside_the_scope_is_still_watched() {
    let dir = tempfile::tempdir().expect("tempdir");
    two_stacks(dir.path());
    let t = discover_within(dir.path(), &[200], &[301]);
    assert_eq!(mains(&t), [201, 210, 301]);
    let engine_b = t.components.iter().find(|c| c.main_pid == Some(301));
    assert_eq!(engine_b.map(|c| c.profile.as_str()), Some("sglang-engine"));
}

#[test]
fn a_gone_root_and_a_parent_cycle_are_outside_a_deep_tree_is_inside() {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path();
    two_stacks(root);
    // the roots all gone: an error that says so, not an empty stack
    let gone = discover::discover(
        &ProbeSet::builtin().expect("probes"),
        &opts(root, &[999, 998], &[]),
    )
    .expect_err("nothing left to watch");
    assert!(
        gone.to_string().contains("no process pid 999, pid 998"),
        "{gone}"
    );
    // one root left: its tree
    assert_eq!(mains(&discover_within(root, &[999, 200], &[])), [201, 210]);
    // a hostile procfs: 401 and 402 each other's parent, an engine below them
    write(root, &base(401, 402, "python3", KEEPER));
    write(root, &base(402, 401, "python3", KEEPER));
    write(root, &base(403, 402, "python3", ENGINE_B));
    assert_eq!(mains(&discover_within(root, &[200], &[])), [201, 210]);
    // an engine 300 levels below launcher 500, its chain written bottom up: still inside
    write(root, &base(500, 1, "python3", KEEPER));
    write(root, &base(700, 999, "python3", ENGINE_A));
    for pid in 701..1000 {
        write(
            root,
            &base(pid, if pid == 701 { 500 } else { pid - 1 }, "sh", &["sh"]),
        );
    }
    assert_eq!(mains(&discover_within(root, &[500], &[])), [700]);
}

/// The daemon's rediscovery (a cache kept across passes): an engine restarted under the
/// launcher is inside on the next pass, one started by the other stack's launcher is not.
#[test]
fn a_restart_under_the_root_stays_inside_across_cached_passes() {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path();
    two_stacks(root);
    let opts = opts(root, &[200], &[]);
    let probes = ProbeSet::builtin().expect("probes");
    let mut cache = discover::DiscoveryCache::new();
    let first = discover::discover_cached(&probes, &opts, &mut cache).expect("discover");
    assert_eq!(mains(&first), [201, 210]);
    std::fs::remove_dir_all(root.join("201")).expect("engine A stops");
    std::fs::remove_dir_all(root.join("202")).expect("its child too");
    write(root, &base(220, 200, "python3", ENGINE_A));
    write(root, &base(320, 300, "python3", ENGINE_B));
    let second = discover::discover_cached(&probes, &opts, &mut cache).expect("discover");
    assert_eq!(mains(&second), [210, 220]);
}
