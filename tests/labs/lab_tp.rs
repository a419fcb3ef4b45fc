//! The big lab's tensor parallelism (issue 15 item 1): `lab.py up --tp-size N` starts N
//! scheduler processes per engine titled `sglang::scheduler_TP0..N-1`, each on its own fake
//! GPU (PD: prefill GPUs 0..N-1, decode N..2N-1), the other ranks' GPUs follow rank 0's;
//! and wedgewatch's discovery sees `tp` = N on each engine and every scheduler pid with its
//! GPU. A TP4 PD lab (8 schedulers, 8 fake GPUs) comes up in seconds.
//!
//! Needs `tests/lab/.venv` (created on first use by `lab.py setup`).

use wedgewatch_testkit::lab;

use std::time::{Duration, Instant};

use lab::{read_gpu_state, Lab, LabOptions};
use wedgewatch::discover::{self, DiscoverOptions};
use wedgewatch::model::{Role, Topology};
use wedgewatch::probes::ProbeSet;

const TP: u32 = 4;

fn title_of(pid: u32) -> String {
    let raw = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    String::from_utf8_lossy(&raw)
        .split('\0')
        .filter(|s| !s.is_empty())
        .collect::<Vec<_>>()
        .join(" ")
}

/// The pid a fake NVML state file lists as the GPU's one process.
fn gpu_owner(lab: &Lab, gpu: u32) -> Option<u32> {
    let st = read_gpu_state(lab.nvml_dir(), gpu);
    st.get("procs")?.split(':').next()?.parse().ok()
}

fn check_engine_processes(lab: &Lab, name: &str, first_gpu: u32) {
    let e = lab.component(name);
    assert_eq!(e.scheduler_pids.len(), TP as usize, "{name}: {e:?}");
    let want_gpus: Vec<u32> = (first_gpu..first_gpu + TP).collect();
    assert_eq!(e.gpus, want_gpus, "{name}");
    for (rank, &pid) in e.scheduler_pids.iter().enumerate() {
        assert_eq!(
            title_of(pid),
            format!("sglang::scheduler_TP{rank}"),
            "{name} pid {pid}"
        );
        let gpu = want_gpus[rank];
        assert_eq!(gpu_owner(lab, gpu), Some(pid), "{name} TP{rank}: gpu{gpu}");
    }
    let env = std::fs::read(format!("/proc/{}/environ", e.pid)).unwrap_or_default();
    let cvd = format!(
        "CUDA_VISIBLE_DEVICES={}",
        want_gpus
            .iter()
            .map(u32::to_string)
            .collect::<Vec<_>>()
            .join(",")
    );
    assert!(
        env.split(|b| *b == 0).any(|kv| kv == cvd.as_bytes()),
        "{name}: no {cvd} in its environment"
    );
}

fn check_discovered(topo: &Topology, lab: &Lab, name: &str, first_gpu: u32) {
    let e = lab.component(name);
    let engine = topo
        .components
        .iter()
        .find(|c| c.main_pid == Some(e.pid as i32))
        .unwrap_or_else(|| panic!("discovery has no component for {name} (pid {})", e.pid));
    assert_eq!(
        engine.labels.get("tp").map(String::as_str),
        Some(TP.to_string().as_str()),
        "{name}: {:?}",
        engine.labels
    );
    for (rank, &pid) in e.scheduler_pids.iter().enumerate() {
        let id = format!("scheduler_TP{rank}@{}", engine.id);
        let s = topo
            .component(&id)
            .unwrap_or_else(|| panic!("discovery has no {id}"));
        assert_eq!(s.role, Role::Scheduler, "{id}");
        assert_eq!(s.main_pid, Some(pid as i32), "{id}");
        assert_eq!(s.gpus, vec![first_gpu + rank as u32], "{id}");
        assert_eq!(s.parent.as_deref(), Some(engine.id.as_str()), "{id}");
    }
    let schedulers = topo
        .components
        .iter()
        .filter(|c| c.role == Role::Scheduler && c.parent.as_deref() == Some(&engine.id))
        .count();
    assert_eq!(schedulers, TP as usize, "{name}: scheduler count");
}

/// Every GPU of `gpus` reads busy (util > 0) at least once before `bound`.
fn all_seen_busy(lab: &Lab, gpus: &[u32], bound: Duration) -> Vec<u32> {
    let mut missing: Vec<u32> = gpus.to_vec();
    let t0 = Instant::now();
    while !missing.is_empty() && t0.elapsed() < bound {
        missing.retain(|&g| {
            let st = read_gpu_state(lab.nvml_dir(), g);
            st.get("util.gpu").and_then(|u| u.parse::<u32>().ok()) == Some(0)
        });
        std::thread::sleep(Duration::from_millis(20));
    }
    missing
}

#[test]
fn tp_lab_starts_n_titled_schedulers_on_their_own_gpus_and_discovery_sees_them() {
    let t0 = Instant::now();
    let lab = Lab::up(&LabOptions::pd().tp_size(TP)).expect("TP lab up");
    let up = t0.elapsed();
    let devices = std::fs::read_to_string(lab.nvml_dir().join("devices")).expect("devices");
    assert!(
        devices.contains(&format!("device_count={}", 2 * TP)),
        "{devices}"
    );
    check_engine_processes(&lab, "prefill", 0);
    check_engine_processes(&lab, "decode", TP);

    let probes = ProbeSet::builtin().expect("probes");
    let topo = discover::discover(
        &probes,
        &DiscoverOptions {
            within: vec![i32::try_from(lab.root_pid()).expect("pid")],
            deadlines: wedgewatch_testkit::timing::roomy_deadlines(),
            ..DiscoverOptions::default()
        },
    )
    .expect("discover");
    check_discovered(&topo, &lab, "prefill", 0);
    check_discovered(&topo, &lab, "decode", TP);

    // Under load every rank's GPU works, not only rank 0's.
    let load = lab.steady_load(16, 4.0, 24).expect("load");
    let decode_gpus: Vec<u32> = (TP..2 * TP).collect();
    let idle = all_seen_busy(&lab, &decode_gpus, Duration::from_secs(4));
    let report = load.wait().expect("harness report");
    assert!(
        idle.is_empty(),
        "decode GPUs never busy under load: {idle:?}"
    );
    assert!(
        report["completed_requests"].as_u64().unwrap_or(0) > 0
            && report["hung_requests"] == 0
            && report["errored_requests"] == 0,
        "{report}"
    );
    eprintln!("TP{TP} lab up in {up:?}; steady load: {report}");
}

/// `wedgewatch snapshot --json` of the lab, sampled here (its fake NVML, the venv's py-spy),
/// bounded by the window plus a minute.
fn snapshot_json(lab: &Lab, window_s: u32) -> serde_json::Value {
    let mut c = crate::common::ww(lab);
    c.args(["snapshot", "--json", "--no-daemon", "--window"])
        .arg(window_s.to_string());
    // Files, not pipes: a snapshot is bigger than a pipe's buffer and nobody reads it early.
    let dir = tempfile::tempdir().expect("tempdir");
    let (out_path, err_path) = (dir.path().join("out"), dir.path().join("err"));
    c.stdout(std::fs::File::create(&out_path).expect("stdout file"))
        .stderr(std::fs::File::create(&err_path).expect("stderr file"));
    let mut child = c.spawn().expect("spawn wedgewatch");
    let bound = Duration::from_secs(u64::from(window_s) + 60);
    let started = Instant::now();
    let status = loop {
        if let Some(st) = child.try_wait().expect("wait") {
            break st;
        }
        if started.elapsed() > bound {
            let _ = child.kill();
            let _ = child.wait();
            panic!("wedgewatch snapshot did not finish within {bound:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let err = std::fs::read_to_string(&err_path).unwrap_or_default();
    assert!(status.success(), "{err}");
    let out = std::fs::read(&out_path).expect("stdout");
    serde_json::from_slice(&out).expect("snapshot JSON")
}

/// The ranks_diverged findings of the engine whose main pid is `pid`.
fn diverged_on(snap: &serde_json::Value, pid: u32) -> Vec<serde_json::Value> {
    let comps = snap["components"].as_array().expect("components");
    let id = comps
        .iter()
        .find(|c| c["main_pid"].as_u64() == Some(u64::from(pid)))
        .and_then(|c| c["id"].as_str())
        .expect("engine in the snapshot");
    snap["findings"]
        .as_array()
        .expect("findings")
        .iter()
        .filter(|f| f["kind"] == "ranks_diverged" && f["component"] == id)
        .cloned()
        .collect()
}

/// The lab's TP ranks split like sglang#33289 (LAB_FAULT_DIVERGE_RANK=1 on decode): TP0,
/// TP2 and TP3 enter the forward's all-reduce, TP1 stays at the request broadcast.
/// `ranks_diverged` names TP1 with its pid and stack on decode; the prefill's ranks, and the
/// decode's before any forward (TP0 idle, the others at the broadcast), raise none.
#[test]
fn a_rank_left_outside_the_all_reduce_is_named_and_ranks_in_step_are_not() {
    let lab = Lab::up(
        &LabOptions::pd()
            .tp_size(TP)
            .decode_env("LAB_FAULT_DIVERGE_RANK", "1"),
    )
    .expect("TP lab up");
    let (decode, prefill) = (lab.decode().clone(), lab.prefill().clone());
    let healthy = snapshot_json(&lab, 3);
    assert!(diverged_on(&healthy, decode.pid).is_empty(), "{healthy:#}");

    let _load = lab.load_background(1, 1, 120.0).expect("load");
    // Every decode rank but TP1 ends up spinning in the all-reduce.
    let spinning: Vec<u32> = [0, 2, 3].iter().map(|r| TP + r).collect();
    let t0 = Instant::now();
    let util = |g: u32| {
        read_gpu_state(lab.nvml_dir(), g)
            .get("util.gpu")
            .and_then(|u| u.parse::<u32>().ok())
            .unwrap_or(0)
    };
    while t0.elapsed() < Duration::from_secs(60) && !spinning.iter().all(|&g| util(g) >= 90) {
        std::thread::sleep(Duration::from_millis(200));
    }
    let snap = snapshot_json(&lab, 4);
    let found = diverged_on(&snap, decode.pid);
    assert_eq!(found.len(), 1, "{:#}", snap["findings"]);
    let f = &found[0];
    let tp1 = decode.scheduler_pids[1];
    let summary = f["summary"].as_str().unwrap();
    assert!(
        summary.contains("3 of 4 ranks (TP0, TP2, TP3) wait in nccl_collective")
            && summary.contains(&format!(
                "TP1 (pid {tp1}) is gloo_collective in broadcast_pyobj"
            )),
        "{summary}"
    );
    assert_eq!(f["severity"], "critical");
    let evidence = f["evidence"].to_string();
    assert!(
        evidence.contains("TP1 stack: broadcast_pyobj"),
        "{evidence}"
    );
    assert!(
        diverged_on(&snap, prefill.pid).is_empty(),
        "{:#}",
        snap["findings"]
    );
}
