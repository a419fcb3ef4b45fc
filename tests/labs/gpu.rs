//! The GPU source through the real nvml-wrapper against the fake `libnvidia-ml.so.1`
//! (tests/lab/fake_nvml/fake_nvml.c, built by build.rs into `FAKE_NVML_PATH`).
//!
//! The fake reads `$FAKE_NVML_DIR` on every call. The variable is process-wide, so every
//! scenario that loads the fake runs in ONE test fn, in sequence, with the variable set once
//! before NVML is first initialised, and removed when it ends (no other test of the lab
//! binary touches the environment or loads NVML in its own process).

use wedgewatch_testkit::lab;
use wedgewatch_testkit::timing::within;

use std::path::{Path, PathBuf};
use std::time::Duration;
use wedgewatch::clock::SystemClock;
use wedgewatch::correlate::{
    component_activity, component_gpus, map_gpu_pids, ActivityThresholds, Correlator, GpuActivity,
};
use wedgewatch::model::{
    Component, Payload, ProcessFacts, Role, Sample, SourceStatus, Status, Thresholds, Topology,
};
use wedgewatch::sampler::Sampler;
use wedgewatch::sources::gpu::{GpuConfig, GpuSource, MAX_DEVICES};
use wedgewatch::sources::Source;

fn fake_lib() -> PathBuf {
    let p = env!("FAKE_NVML_PATH");
    assert!(
        !p.is_empty(),
        "the fake NVML library was not built (build.rs needs a C compiler and \
         tests/lab/fake_nvml/fake_nvml.c)"
    );
    PathBuf::from(p)
}

/// Replaces a state file atomically, as the lab's schedulers do.
fn write_state(dir: &Path, name: &str, text: &str) {
    let tmp = dir.join(format!(".{name}.tmp"));
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, dir.join(name)).unwrap();
}

const LIMIT: &str = "power.limit.mw=700000";

fn gpu_state(util: u32, power_mw: u32, pid: u32, sm: u32) -> String {
    format!(
        "name=NVIDIA H200\nuuid=GPU-{pid}\nutil.gpu={util}\nutil.memory={}\n\
         mem.total=150000000000\nmem.used=80000000000\npower.mw={power_mw}\n{LIMIT}\n\
         procs={pid}:80000000000:{sm}:{}\n",
        util / 2,
        sm / 2
    )
}

fn source(timeout: Duration) -> GpuSource {
    GpuSource::new(GpuConfig {
        lib_path: Some(fake_lib()),
        timeout,
    })
}

fn topology() -> (Topology, Vec<ProcessFacts>) {
    let mut topo = Topology::default();
    for (i, pid) in [(0, 1000), (1, 1001), (2, 1002)] {
        let mut c = Component::new(format!("scheduler_TP{i}@decode"), Role::Scheduler, "sglang");
        c.pids = vec![pid];
        topo.components.push(c);
    }
    let facts = [1000, 1001, 1002]
        .iter()
        .map(|&pid| ProcessFacts {
            pid,
            nspid: Some(vec![pid]),
            ..Default::default()
        })
        .collect();
    (topo, facts)
}

/// Removes an environment variable when dropped: the other modules of the lab binary run in
/// this process after this test.
struct UnsetOnDrop(&'static str);

impl Drop for UnsetOnDrop {
    fn drop(&mut self) {
        std::env::remove_var(self.0);
    }
}

#[test]
fn fake_nvml_busy_idle_spinning_errors_and_hangs() {
    let _lab = lab::shared();
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    // Set once, before the first NVML init in this process (see the module comment).
    std::env::set_var("FAKE_NVML_DIR", d);
    let _unset = UnsetOnDrop("FAKE_NVML_DIR");
    write_state(d, "devices", "device_count=3\ndriver_version=550.54.15\n");
    write_state(d, "gpu0", &gpu_state(97, 610_000, 1000, 95)); // busy
    write_state(d, "gpu1", &gpu_state(0, 80_000, 1001, 0)); // idle
    write_state(d, "gpu2", &gpu_state(100, 90_000, 1002, 100)); // spinning collective
    let rt = tokio::runtime::Runtime::new().unwrap();
    let th = ActivityThresholds::default();
    let (topo, facts) = topology();

    let src = source(Duration::from_secs(2));
    let sample = rt.block_on(src.sample(&topo, &SystemClock));
    assert_eq!(sample.status.status, Status::Ok, "{:?}", sample.status);
    let Payload::Gpu(reading) = sample.payload else {
        panic!("not a GPU payload")
    };
    assert_eq!(reading.driver_version.as_deref(), Some("550.54.15"));
    assert_eq!(reading.devices.len(), 3);
    let g0 = &reading.devices[0];
    assert_eq!(g0.name.as_deref(), Some("NVIDIA H200"));
    assert_eq!(g0.uuid.as_deref(), Some("GPU-1000"));
    assert_eq!((g0.util_gpu_pct, g0.util_mem_pct), (Some(97), Some(48)));
    assert_eq!(
        (g0.power_mw, g0.power_limit_mw),
        (Some(610_000), Some(700_000))
    );
    assert_eq!(g0.mem_used_bytes, Some(80_000_000_000));
    assert_eq!(g0.mem_total_bytes, Some(150_000_000_000));
    assert_eq!(g0.processes.len(), 1);
    assert_eq!(g0.processes[0].pid, 1000);
    assert_eq!(g0.processes[0].used_mem_bytes, Some(80_000_000_000));
    assert_eq!(g0.processes[0].sm_util_pct, Some(95));
    // gpu1's process has no utilization samples: NotFound means zero activity, not an error.
    assert_eq!(reading.devices[1].processes[0].sm_util_pct, Some(0));
    assert!(reading.devices[1].errors.is_empty());

    let mappings = map_gpu_pids(&topo, &facts, &reading);
    let gpus = component_gpus(&mappings);
    let verdict =
        |reading, id: &str, pid: u32| component_activity(reading, &gpus[id], &[pid], None, &th);
    assert_eq!(gpus["scheduler_TP0@decode"], vec![0]);
    assert_eq!(
        verdict(&reading, "scheduler_TP0@decode", 1000).0,
        GpuActivity::Working
    );
    assert_eq!(
        verdict(&reading, "scheduler_TP1@decode", 1001).0,
        GpuActivity::Idle
    );
    let (a, why) = verdict(&reading, "scheduler_TP2@decode", 1002);
    assert_eq!(a, GpuActivity::Spinning, "{why}");
    // The engine's forward counter moving overrides the power heuristic...
    let moving = component_activity(&reading, &[2], &[1002], Some(0.5), &th);
    assert_eq!(moving.0, GpuActivity::Working);

    // Through the model into the snapshot: components list the GPUs NVML shows their
    // processes holding, not only the CUDA_VISIBLE_DEVICES / title-rank hint.
    components_list_the_gpus_nvml_shows(sample.t_ms, &reading);

    // The same loaded library follows the state files: gpu0 goes idle between two samples.
    write_state(d, "gpu0", &gpu_state(0, 75_000, 1000, 0));
    let r = rt.block_on(src.read());
    assert_eq!(r.status.status, Status::Ok);
    assert_eq!(r.reading.devices[0].util_gpu_pct, Some(0));
    assert_eq!(r.reading.devices[0].processes[0].sm_util_pct, Some(0));
    assert_eq!(
        component_activity(&r.reading, &[0], &[1000], None, &th).0,
        GpuActivity::Idle
    );

    // A failing call degrades the source, names the field, and keeps the other fields.
    write_state(
        d,
        "gpu1",
        &format!(
            "{}error.nvmlDeviceGetUtilizationRates=3\n",
            gpu_state(0, 80_000, 1001, 0)
        ),
    );
    let r = rt.block_on(src.read());
    assert_eq!(r.status.status, Status::Degraded);
    let reason = r.status.reason.clone().unwrap();
    assert!(reason.contains("gpu1 utilization"), "{reason}");
    assert!(reason.to_lowercase().contains("not available"), "{reason}");
    let g1 = &r.reading.devices[1];
    assert_eq!(g1.util_gpu_pct, None);
    assert_eq!(g1.power_mw, Some(80_000));
    assert_eq!(g1.errors.len(), 1);
    assert_eq!(
        component_activity(&r.reading, &[1], &[1001], None, &th).0,
        GpuActivity::Idle,
        "process samples still say idle"
    );
    write_state(d, "gpu1", &gpu_state(0, 80_000, 1001, 0));

    // A hung driver: the sample times out, the next one is not queued behind it, and the
    // source recovers once the driver answers again.
    // The driver's delay outlasts the bound asserted, so a read that waited for it fails.
    let timeout = Duration::from_millis(300);
    let call_delay = within(timeout) + Duration::from_secs(3);
    let slow = source(timeout);
    assert_eq!(rt.block_on(slow.read()).status.status, Status::Ok);
    write_state(
        d,
        "devices",
        &format!(
            "device_count=3\ndriver_version=550.54.15\ncall_delay_ms={}\n",
            call_delay.as_millis()
        ),
    );
    let started = std::time::Instant::now();
    let r = rt.block_on(slow.read());
    assert!(
        started.elapsed() < within(timeout),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(r.status.status, Status::Unavailable);
    assert!(r
        .status
        .reason
        .unwrap()
        .contains("did not answer within 300 ms (hung driver?)"));
    let r = rt.block_on(slow.read());
    assert!(
        r.status
            .reason
            .clone()
            .unwrap()
            .contains("not queueing another"),
        "{:?}",
        r.status
    );
    write_state(d, "devices", "device_count=3\ndriver_version=550.54.15\n");
    // Until the hung call returns (its delay from when it began), then at once.
    let deadline = std::time::Instant::now() + within(call_delay);
    let mut recovered = false;
    while !recovered && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
        recovered = rt.block_on(slow.read()).status.status == Status::Ok;
    }
    assert!(
        recovered,
        "the source did not recover after the driver answered"
    );

    // An absurd device count is capped, and the cap said, instead of being looped over.
    write_state(
        d,
        "devices",
        "device_count=4294967295\ndriver_version=550.54.15\n",
    );
    let r = rt.block_on(source(Duration::from_secs(20)).read());
    assert_eq!(
        r.reading.devices.len(),
        MAX_DEVICES as usize,
        "{:.300?}",
        r.status
    );
    let reason = r.status.reason.unwrap_or_default();
    assert!(
        reason.contains("4294967295 devices; only the first 64"),
        "{reason:.300}"
    );
    write_state(d, "devices", "device_count=3\ndriver_version=550.54.15\n");

    // Through the sampler at the default cadence and timeouts, a hung driver is reported by
    // the GPU source (which knows why), not as a bare sampler timeout.
    write_state(
        d,
        "devices",
        "device_count=3\ndriver_version=550.54.15\ncall_delay_ms=4000\n",
    );
    let (_topo_tx, topo_rx) = tokio::sync::watch::channel(Topology::default());
    let mut sampler = Sampler::new(std::sync::Arc::new(SystemClock), topo_rx);
    sampler.add_default(std::sync::Arc::new(GpuSource::new(GpuConfig {
        lib_path: Some(fake_lib()),
        ..GpuConfig::from_env()
    })));
    let samples = rt.block_on(sampler.sample_once());
    let reason = samples[0].status.reason.clone().unwrap_or_default();
    assert!(reason.contains("hung driver?"), "{reason}");
    write_state(d, "devices", "device_count=3\ndriver_version=550.54.15\n");

    // init_error=9: a fresh source cannot initialise: unavailable, with the reason.
    write_state(
        d,
        "devices",
        "device_count=3\ndriver_version=550.54.15\ninit_error=9\n",
    );
    let r = rt.block_on(source(Duration::from_secs(2)).read());
    assert_eq!(r.status.status, Status::Unavailable);
    let reason = r.status.reason.unwrap();
    assert!(reason.contains("driver is not loaded"), "{reason}");
    assert!(r.reading.devices.is_empty());

    // No state at all (no driver): the same, from nvmlInit_v2's DRIVER_NOT_LOADED.
    std::fs::remove_file(d.join("devices")).unwrap();
    let r = rt.block_on(source(Duration::from_secs(2)).read());
    assert_eq!(r.status.status, Status::Unavailable);
    assert!(r.status.reason.unwrap().contains("driver is not loaded"));

    // The lab with a spinning all-reduce on decode: its schedulers write the state files.
    // FAKE_NVML_DIR stays fixed for this process, so point its entries at the lab's files
    // (the lab replaces them by rename; a symlink by name follows).
    if !lab::venv_bin("python").exists() && lab::ensure_venv().is_err() {
        eprintln!("\n!!!! SKIPPED the lab part: no tests/lab/.venv !!!!\n");
        return;
    }
    let lab =
        lab::Lab::up(&lab::LabOptions::pd().decode_env("LAB_FAULT_SPIN", "1")).expect("lab up");
    for name in ["devices", "gpu0", "gpu1"] {
        let _ = std::fs::remove_file(d.join(name));
        std::os::unix::fs::symlink(lab.nvml_dir().join(name), d.join(name)).unwrap();
    }
    let _load = lab.load_background(2, 1, 4.0).expect("load");
    let decode_pid = lab.decode().scheduler_pids[0];
    let prefill_pid = lab.prefill().scheduler_pids[0];
    let mut topo = Topology::default();
    for (id, pid) in [("decode_sched", decode_pid), ("prefill_sched", prefill_pid)] {
        let mut c = Component::new(id, Role::Scheduler, "sglang");
        c.pids = vec![pid as i32];
        topo.components.push(c);
    }
    let facts: Vec<ProcessFacts> = [decode_pid, prefill_pid]
        .iter()
        .map(|&pid| ProcessFacts {
            pid: pid as i32,
            ..Default::default()
        })
        .collect();
    let src = source(Duration::from_secs(2));
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let (decode, prefill, gpus) = loop {
        let r = rt.block_on(src.read());
        assert_eq!(r.status.status, Status::Ok, "{:?}", r.status);
        let gpus = component_gpus(&map_gpu_pids(&topo, &facts, &r.reading));
        let verdict = |id: &str, pid: u32| {
            gpus.get(id)
                .map(|g| component_activity(&r.reading, g, &[pid], None, &th))
        };
        let (dv, pv) = (
            verdict("decode_sched", decode_pid),
            verdict("prefill_sched", prefill_pid),
        );
        // The prefill works in bursts while the load retries (CI once caught it mid-burst
        // at 97 %): wait for a sample where the decode spins and the prefill rests.
        let spinning = dv.as_ref().is_some_and(|v| v.0 == GpuActivity::Spinning);
        let resting = pv.as_ref().is_some_and(|v| v.0 == GpuActivity::Idle);
        if (spinning && resting) || std::time::Instant::now() > deadline {
            break (dv, pv, gpus);
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    assert_eq!(gpus["decode_sched"], vec![lab.decode().gpu.unwrap()]);
    let (a, why) = decode.expect("decode scheduler on a GPU");
    assert_eq!(a, GpuActivity::Spinning, "{why}");
    let (a, why) = prefill.expect("prefill scheduler on a GPU");
    assert_eq!(a, GpuActivity::Idle, "{why}");
}

/// Engine `a` (no hint) whose scheduler NVML shows on GPU 0 by its own pid; engine `b` whose
/// scheduler the topology knows by its container pid 42 while NVML reports the host pid 1001
/// (found through NSpid); engine `c` with only a hint (GPU 5) and no NVML process. The GPU
/// reading is the real one the fake NVML gave (pids 1000, 1001, 1002 on GPUs 0, 1, 2).
fn components_list_the_gpus_nvml_shows(t_ms: i64, reading: &wedgewatch::model::GpuReading) {
    let mut topo = Topology::default();
    for (engine, sched, pid, hint) in [
        ("a", "scheduler_TP0@a", 1000, vec![]),
        ("b", "scheduler_TP0@b", 42, vec![]),
        ("c", "scheduler_TP0@c", 3000, vec![5]),
    ] {
        let mut e = Component::new(engine, Role::Decode, "sglang");
        e.pids = vec![pid + 5000];
        e.children = vec![sched.to_string()];
        let mut s = Component::new(sched, Role::Scheduler, "sglang");
        s.pids = vec![pid];
        s.parent = Some(engine.to_string());
        s.gpus = hint;
        topo.components.extend([e, s]);
    }
    let facts = vec![
        ProcessFacts {
            pid: 1000,
            nspid: Some(vec![1000]),
            ..Default::default()
        },
        ProcessFacts {
            pid: 1001,
            nspid: Some(vec![1001, 42]),
            ..Default::default()
        },
    ];
    let mut model = Correlator::new(Thresholds::default());
    model.set_topology(topo);
    let sample = |payload| Sample {
        t_ms,
        status: SourceStatus::ok(),
        took_ms: 1,
        payload,
    };
    model.ingest(&sample(Payload::Processes(facts)));
    model.ingest(&sample(Payload::Gpu(reading.clone())));
    let parts = wedgewatch::pipeline::parts(&model, t_ms);
    let snap = wedgewatch::snapshot::assemble(parts, &Default::default());
    let gpus = |id: &str| {
        snap.components
            .iter()
            .find(|c| c.id == id)
            .unwrap_or_else(|| panic!("no component {id}"))
            .gpus
            .clone()
    };
    assert_eq!(gpus("scheduler_TP0@a"), vec![0]);
    assert_eq!(gpus("a"), vec![0], "an engine holds its schedulers' GPUs");
    assert_eq!(gpus("scheduler_TP0@b"), vec![1], "found through NSpid");
    assert_eq!(gpus("b"), vec![1]);
    assert_eq!(
        gpus("scheduler_TP0@c"),
        vec![5],
        "no NVML process: the hint stays"
    );
    let on_gpu1 = snap.gpus.iter().find(|g| g.index == 1).expect("gpu1");
    assert_eq!(
        on_gpu1.processes[0].component.as_deref(),
        Some("scheduler_TP0@b"),
        "the GPU view names the process's component through NSpid too"
    );
}

#[test]
fn missing_library_is_unavailable_with_reason() {
    let _lab = lab::shared();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("libnvidia-ml.so.1");
    let src = GpuSource::new(GpuConfig {
        lib_path: Some(missing.clone()),
        timeout: Duration::from_secs(2),
    });
    let sample = rt.block_on(src.sample(&Topology::default(), &SystemClock));
    assert_eq!(sample.status.status, Status::Unavailable);
    let reason = sample.status.reason.unwrap();
    assert!(reason.contains("cannot load NVML library"), "{reason}");
    assert!(reason.contains(&missing.display().to_string()), "{reason}");
    assert!(reason.contains("--nvml-lib"), "{reason}");
    let Payload::Gpu(reading) = sample.payload else {
        panic!("not a GPU payload")
    };
    assert!(reading.devices.is_empty());
}
