//! GPU activity through NVML (nvml-wrapper). NVML calls can hang in the driver, so they run on
//! one thread that owns the `Nvml` handle; [`GpuSource::sample`] waits for it under a timeout
//! and never queues behind a stuck call. No driver: `unavailable`; a failing per-device call:
//! `degraded`, naming the field. What the readings mean is the correlator's business.

use crate::clock::Clock;
use crate::model::{
    FieldError, GpuDevice, GpuProcess, GpuReading, Payload, Sample, SourceKind, SourceStatus,
    Topology,
};
use crate::sources::{BoxFuture, Source};
use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::Nvml;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

/// Environment variable naming the `libnvidia-ml.so` to load.
pub const NVML_LIB_ENV: &str = "WEDGEWATCH_NVML_LIB";

/// Most devices read per sample (see [`NvmlWorker::sample`]).
pub const MAX_DEVICES: u32 = 64;

/// Default hard timeout of one sample: under the sampler's, so a hung driver is reported by
/// this source, which knows why.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_millis(1_000);

/// How the GPU source loads NVML and judges activity.
#[derive(Debug, Clone, PartialEq)]
pub struct GpuConfig {
    /// `--nvml-lib` / `$WEDGEWATCH_NVML_LIB`; None: the system's `libnvidia-ml.so.1`.
    pub lib_path: Option<PathBuf>,
    /// Hard timeout of one sample (all NVML calls of all devices).
    pub timeout: Duration,
}

impl GpuConfig {
    /// Defaults, with the library path from `$WEDGEWATCH_NVML_LIB` when set.
    pub fn from_env() -> GpuConfig {
        GpuConfig {
            lib_path: std::env::var_os(NVML_LIB_ENV)
                .filter(|v| !v.is_empty())
                .map(PathBuf::from),
            timeout: DEFAULT_TIMEOUT,
        }
    }
}

impl Default for GpuConfig {
    fn default() -> Self {
        GpuConfig::from_env()
    }
}

/// One sample of NVML: the reading and how complete it is.
#[derive(Debug, Clone, PartialEq)]
pub struct GpuSampleResult {
    pub status: SourceStatus,
    pub reading: GpuReading,
}

type Reply = tokio::sync::oneshot::Sender<GpuSampleResult>;

/// The GPU source. Owns a worker thread that owns NVML; dropping the source ends it.
pub struct GpuSource {
    cfg: GpuConfig,
    tx: Mutex<Option<mpsc::Sender<Reply>>>,
    busy: Arc<AtomicBool>,
}

impl std::fmt::Debug for GpuSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuSource").field("cfg", &self.cfg).finish()
    }
}

impl GpuSource {
    /// Starts the NVML worker thread. NVML itself is initialised lazily by the first sample
    /// (and retried by later ones while it fails), so a missing driver costs nothing here.
    pub fn new(cfg: GpuConfig) -> GpuSource {
        let (tx, rx) = mpsc::channel::<Reply>();
        let busy = Arc::new(AtomicBool::new(false));
        let worker_busy = Arc::clone(&busy);
        let lib = cfg.lib_path.clone();
        let spawned = std::thread::Builder::new()
            .name("wedgewatch-nvml".into())
            .spawn(move || {
                let mut worker = NvmlWorker::new(lib);
                // Ends when the source (the only sender) is dropped.
                while let Ok(reply) = rx.recv() {
                    let result = worker.sample();
                    worker_busy.store(false, Ordering::SeqCst);
                    let _ = reply.send(result);
                }
            });
        GpuSource {
            cfg,
            tx: Mutex::new(spawned.ok().map(|_| tx)),
            busy,
        }
    }

    pub fn config(&self) -> &GpuConfig {
        &self.cfg
    }

    /// One reading of every GPU, under the configured timeout.
    pub async fn read(&self) -> GpuSampleResult {
        let unavailable = |reason: String| GpuSampleResult {
            status: SourceStatus::unavailable(reason),
            reading: GpuReading::default(),
        };
        if self.busy.load(Ordering::SeqCst) {
            return unavailable(format!(
                "the previous NVML call has not returned after more than {} ms (hung driver?); \
                 not queueing another",
                self.cfg.timeout.as_millis()
            ));
        }
        let (reply_tx, reply_rx) = tokio::sync::oneshot::channel();
        let sent = match self.tx.lock() {
            Ok(guard) => guard.as_ref().is_some_and(|tx| {
                self.busy.store(true, Ordering::SeqCst);
                tx.send(reply_tx).is_ok()
            }),
            Err(_) => false,
        };
        if !sent {
            self.busy.store(false, Ordering::SeqCst);
            return unavailable("the NVML worker thread is not running".into());
        }
        match tokio::time::timeout(self.cfg.timeout, reply_rx).await {
            Ok(Ok(r)) => r,
            Ok(Err(_)) => unavailable("the NVML worker thread died".into()),
            Err(_) => unavailable(format!(
                "NVML did not answer within {} ms (hung driver?)",
                self.cfg.timeout.as_millis()
            )),
        }
    }
}

impl Source for GpuSource {
    fn kind(&self) -> SourceKind {
        SourceKind::Gpu
    }

    fn sample<'a>(&'a self, _topo: &'a Topology, clock: &'a dyn Clock) -> BoxFuture<'a, Sample> {
        Box::pin(async move {
            let t_ms = clock.now_ms();
            let started = Instant::now();
            let r = self.read().await;
            Sample {
                t_ms,
                status: r.status,
                took_ms: u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
                payload: Payload::Gpu(r.reading),
            }
        })
    }
}

// ---------------------------------------------------------------------------------------
// the worker (runs on its own thread; every NVML call happens here)

struct NvmlWorker {
    lib: Option<PathBuf>,
    nvml: Option<Arc<Nvml>>,
    /// Per device (UUID, else index): timestamp (µs) of the newest process-utilization
    /// sample seen, so each sample asks only for newer ones.
    last_seen: BTreeMap<String, u64>,
}

fn lib_name(lib: &Option<PathBuf>) -> String {
    lib.as_ref()
        .map_or("libnvidia-ml.so.1 (system default)".to_string(), |p| {
            p.display().to_string()
        })
}

/// Why NVML could not start, in words an on-call engineer can act on.
/// NVML's CUDA driver version (`12040`) as people write it (`12.4`).
fn cuda_version(v: i32) -> String {
    format!("{}.{}", v / 1000, (v % 1000) / 10)
}

fn init_reason(lib: &Option<PathBuf>, e: &NvmlError) -> String {
    let name = lib_name(lib);
    match e {
        NvmlError::LibloadingError(inner) => format!(
            "cannot load NVML library {name}: {inner} (no NVIDIA driver here? point \
             --nvml-lib / {NVML_LIB_ENV} at libnvidia-ml.so)"
        ),
        NvmlError::DriverNotLoaded => {
            format!("NVML ({name}): the NVIDIA driver is not loaded (no GPU on this machine?)")
        }
        NvmlError::NoPermission => format!("NVML ({name}): permission denied"),
        other => format!("NVML ({name}) failed to initialise: {other}"),
    }
}

impl NvmlWorker {
    fn new(lib: Option<PathBuf>) -> NvmlWorker {
        NvmlWorker {
            lib,
            nvml: None,
            last_seen: BTreeMap::new(),
        }
    }

    fn ensure_init(&mut self) -> Result<Arc<Nvml>, String> {
        if let Some(n) = &self.nvml {
            return Ok(Arc::clone(n));
        }
        let mut b = Nvml::builder();
        if let Some(p) = &self.lib {
            b.lib_path(p.as_os_str());
        }
        let n = Arc::new(b.init().map_err(|e| init_reason(&self.lib, &e))?);
        self.nvml = Some(Arc::clone(&n));
        Ok(n)
    }

    fn sample(&mut self) -> GpuSampleResult {
        let nvml = match self.ensure_init() {
            Ok(n) => n,
            Err(reason) => {
                return GpuSampleResult {
                    status: SourceStatus::unavailable(reason),
                    reading: GpuReading::default(),
                }
            }
        };
        let mut reading = GpuReading {
            driver_version: nvml.sys_driver_version().ok(),
            cuda_version: nvml.sys_cuda_driver_version().ok().map(cuda_version),
            devices: Vec::new(),
        };
        let count = match nvml.device_count() {
            Ok(c) => c,
            Err(e) => {
                // A driver that cannot count its devices may have gone away: re-init next time.
                self.nvml = None;
                return GpuSampleResult {
                    status: SourceStatus::unavailable(format!("NVML device count: {e}")),
                    reading,
                };
            }
        };
        let mut status = SourceStatus::ok();
        // A broken or hostile library may claim billions; the largest machines have 16.
        if count > MAX_DEVICES {
            status = SourceStatus::degraded(format!(
                "NVML reports {count} devices; only the first {MAX_DEVICES} are read"
            ));
        }
        for index in 0..count.min(MAX_DEVICES) {
            let dev = self.read_device(&nvml, index);
            for err in &dev.errors {
                status = status.worst(SourceStatus::degraded(format!(
                    "gpu{index} {}: {}",
                    err.field, err.reason
                )));
            }
            reading.devices.push(dev);
        }
        GpuSampleResult { status, reading }
    }

    fn read_device(&mut self, nvml: &Nvml, index: u32) -> GpuDevice {
        let mut dev = GpuDevice {
            index,
            name: None,
            uuid: None,
            util_gpu_pct: None,
            util_mem_pct: None,
            power_mw: None,
            power_limit_mw: None,
            mem_used_bytes: None,
            mem_total_bytes: None,
            processes: Vec::new(),
            errors: Vec::new(),
        };
        let d = match nvml.device_by_index(index) {
            Ok(d) => d,
            Err(e) => {
                dev.errors.push(field_error("handle", e));
                return dev;
            }
        };
        read_device_facts(&d, &mut dev);
        match d.running_compute_processes() {
            Ok(ps) => {
                dev.processes = ps
                    .into_iter()
                    .map(|p| GpuProcess {
                        pid: p.pid,
                        used_mem_bytes: match p.used_gpu_memory {
                            UsedGpuMemory::Used(b) => Some(b),
                            UsedGpuMemory::Unavailable => None,
                        },
                        sm_util_pct: None,
                    })
                    .collect();
            }
            Err(e) => dev.errors.push(field_error("processes", e)),
        }
        self.read_process_utilization(&d, &mut dev);
        dev
    }

    /// Each process's SM utilization since the previous reading of this device (NVML keeps
    /// samples; `last_seen` is the newest one already read).
    fn read_process_utilization(&mut self, d: &nvml_wrapper::Device<'_>, dev: &mut GpuDevice) {
        let key = dev
            .uuid
            .clone()
            .unwrap_or_else(|| format!("index{}", dev.index));
        let last_seen = self.last_seen.get(&key).copied();
        match d.process_utilization_stats(last_seen) {
            Ok(samples) => {
                // Latest sample per pid.
                let mut latest: BTreeMap<u32, (u64, u32)> = BTreeMap::new();
                for s in &samples {
                    let e = latest.entry(s.pid).or_insert((s.timestamp, s.sm_util));
                    if s.timestamp >= e.0 {
                        *e = (s.timestamp, s.sm_util);
                    }
                }
                if let Some(newest) = samples.iter().map(|s| s.timestamp).max() {
                    self.last_seen.insert(key, newest);
                }
                for p in &mut dev.processes {
                    p.sm_util_pct = Some(latest.remove(&p.pid).map_or(0, |(_, sm)| sm));
                }
                // A process with samples but not in the compute list (graphics, MPS).
                for (pid, (_, sm)) in latest {
                    dev.processes.push(GpuProcess {
                        pid,
                        used_mem_bytes: None,
                        sm_util_pct: Some(sm),
                    });
                }
            }
            // The driver's way of saying "no sample newer than last_seen": zero activity.
            Err(NvmlError::NotFound) => {
                for p in &mut dev.processes {
                    p.sm_util_pct = Some(0);
                }
            }
            Err(e) => dev.errors.push(field_error("process_utilization", e)),
        }
    }
}

fn field_error(field: &str, e: NvmlError) -> FieldError {
    FieldError {
        field: field.to_string(),
        reason: e.to_string(),
    }
}

/// A device's name, uuid, utilization, power and memory; each field that fails is an error
/// of the reading, not of the whole device.
fn read_device_facts(d: &nvml_wrapper::Device<'_>, dev: &mut GpuDevice) {
    match d.name() {
        Ok(v) => dev.name = Some(v),
        Err(e) => dev.errors.push(field_error("name", e)),
    }
    match d.uuid() {
        Ok(v) => dev.uuid = Some(v),
        Err(e) => dev.errors.push(field_error("uuid", e)),
    }
    match d.utilization_rates() {
        Ok(u) => {
            dev.util_gpu_pct = Some(u.gpu);
            dev.util_mem_pct = Some(u.memory);
        }
        Err(e) => dev.errors.push(field_error("utilization", e)),
    }
    match d.power_usage() {
        Ok(v) => dev.power_mw = Some(v),
        Err(e) => dev.errors.push(field_error("power", e)),
    }
    // The enforced limit is what the GPU is held to, else the management limit.
    match d.enforced_power_limit() {
        Ok(v) => dev.power_limit_mw = Some(v),
        Err(first) => match d.power_management_limit() {
            Ok(v) => dev.power_limit_mw = Some(v),
            Err(_) => dev.errors.push(field_error("power_limit", first)),
        },
    }
    match d.memory_info() {
        Ok(m) => {
            dev.mem_used_bytes = Some(m.used);
            dev.mem_total_bytes = Some(m.total);
        }
        Err(e) => dev.errors.push(field_error("memory", e)),
    }
}
