//! Synthetic stack for correlator/detector tests: simulated TCP connections whose kernel
//! counters (tcp_info) are turned into socket samples, plus metrics/GPU/stack samples.

use std::collections::BTreeMap;
use wedgewatch::clock::Millis;
use wedgewatch::correlate::Correlator;
use wedgewatch::model::*;

pub const T0: Millis = 1_795_963_800_000;

pub const PROXY: &str = "proxy@127.0.0.1:8000";
pub const ROUTER: &str = "router@127.0.0.1:30000";
pub const PREFILL: &str = "prefill@127.0.0.1:31011";
pub const DECODE: &str = "decode@127.0.0.1:31012";

pub fn comp(id: &str, role: Role, port: u16, pids: &[i32], gpus: &[u32]) -> Component {
    let mut c = Component::new(id, role, "sglang");
    c.pids = pids.to_vec();
    c.main_pid = pids.first().copied();
    c.listen = vec![format!("127.0.0.1:{port}")];
    c.gpus = gpus.to_vec();
    c.http_url = Some(format!("http://127.0.0.1:{port}"));
    c
}

/// proxy(pid 100) -> router(200) -> prefill(300, scheduler 301, GPU 0) + decode(400, 401, GPU 1)
pub fn pd_topology() -> Topology {
    Topology {
        components: vec![
            comp(PROXY, Role::Proxy, 8000, &[100], &[]),
            comp(ROUTER, Role::Router, 30000, &[200], &[]),
            comp(PREFILL, Role::Prefill, 31011, &[300, 301], &[0]),
            comp(DECODE, Role::Decode, 31012, &[400, 401], &[1]),
        ],
        edges: Vec::new(),
    }
}

pub struct SimConn {
    pub client: String,
    pub server: String,
    pub client_pid: Option<i32>,
    pub server_pid: i32,
    /// Bytes client -> server.
    pub up: u64,
    /// Bytes server -> client.
    pub down: u64,
    pub last_up: Option<Millis>,
    pub last_down: Option<Millis>,
    pub state: TcpState,
    pub gone: bool,
}

pub struct Sim {
    pub now: Millis,
    pub conns: Vec<SimConn>,
    pub model: Correlator,
    next_port: u16,
    pub listeners: Vec<(u16, i32)>,
}

impl Sim {
    pub fn new(topo: Topology) -> Sim {
        let mut model = Correlator::default();
        model.ignore_client_pids.clear();
        let listeners = topo
            .components
            .iter()
            .flat_map(|c| {
                c.listen_ports()
                    .into_iter()
                    .map(|p| (p, c.main_pid.unwrap_or(0)))
            })
            .collect();
        model.set_topology(topo);
        Sim {
            now: T0,
            conns: Vec::new(),
            model,
            next_port: 40000,
            listeners,
        }
    }

    /// Opens a connection from `client_pid` (None: an outside client) to `server_port`.
    pub fn connect(&mut self, client_pid: Option<i32>, server_port: u16, server_pid: i32) -> usize {
        self.next_port += 1;
        self.conns.push(SimConn {
            client: format!("127.0.0.1:{}", self.next_port),
            server: format!("127.0.0.1:{server_port}"),
            client_pid,
            server_pid,
            up: 0,
            down: 0,
            last_up: None,
            last_down: None,
            state: TcpState::Established,
            gone: false,
        });
        self.conns.len() - 1
    }
    pub fn request(&mut self, c: usize, n: u64) {
        self.conns[c].up += n;
        self.conns[c].last_up = Some(self.now);
    }
    pub fn respond(&mut self, c: usize, n: u64) {
        self.conns[c].down += n;
        self.conns[c].last_down = Some(self.now);
    }
    pub fn close(&mut self, c: usize) {
        self.conns[c].gone = true;
    }
    pub fn advance(&mut self, ms: i64) {
        self.now += ms;
    }

    pub fn socket_table(&self) -> SocketTable {
        // Like the kernel: a direction that never carried data reads as the time since
        // an old reference point (here the connection's creation long ago), not a constant.
        let ago = |t: Option<Millis>| (self.now - t.unwrap_or(T0 - 3_600_000)) as u32;
        let mut sockets = Vec::new();
        for (port, pid) in &self.listeners {
            sockets.push(SocketEntry {
                local: format!("127.0.0.1:{port}"),
                remote: "0.0.0.0:0".into(),
                state: TcpState::Listen,
                rx_queue: 0,
                tx_queue: 0,
                inode: 1,
                uid: 0,
                pid: Some(*pid),
                netns: None,
                tcp_info: None,
            });
        }
        for c in self.conns.iter().filter(|c| !c.gone) {
            sockets.push(SocketEntry {
                local: c.server.clone(),
                remote: c.client.clone(),
                state: c.state,
                rx_queue: 0,
                tx_queue: 0,
                inode: 2,
                uid: 0,
                pid: Some(c.server_pid),
                netns: None,
                tcp_info: Some(TcpInfo {
                    bytes_acked: c.down,
                    bytes_received: c.up,
                    bytes_sent: c.down,
                    last_data_sent_ms: ago(c.last_down),
                    last_data_recv_ms: ago(c.last_up),
                    last_ack_recv_ms: ago(c.last_down),
                    ..Default::default()
                }),
            });
            sockets.push(SocketEntry {
                local: c.client.clone(),
                remote: c.server.clone(),
                state: TcpState::Established,
                rx_queue: 0,
                tx_queue: 0,
                inode: 3,
                uid: 0,
                pid: c.client_pid,
                netns: None,
                tcp_info: Some(TcpInfo {
                    bytes_acked: c.up,
                    bytes_received: c.down,
                    bytes_sent: c.up,
                    last_data_sent_ms: ago(c.last_up),
                    last_data_recv_ms: ago(c.last_down),
                    last_ack_recv_ms: ago(c.last_up),
                    ..Default::default()
                }),
            });
        }
        SocketTable {
            sockets,
            notes: Vec::new(),
        }
    }

    pub fn sample_sockets(&mut self) {
        let s = Sample {
            t_ms: self.now,
            status: SourceStatus::ok(),
            took_ms: 3,
            payload: Payload::Sockets(self.socket_table()),
        };
        self.model.ingest(&s);
    }

    pub fn ingest(&mut self, payload: Payload) {
        let s = Sample {
            t_ms: self.now,
            status: SourceStatus::ok(),
            took_ms: 5,
            payload,
        };
        self.model.ingest(&s);
    }

    /// Advances `total_ms` in 250 ms socket ticks, calling `each` before every tick.
    pub fn run(&mut self, total_ms: i64, mut each: impl FnMut(&mut Sim)) {
        let mut done = 0;
        while done < total_ms {
            self.advance(250);
            done += 250;
            each(self);
            self.sample_sockets();
        }
    }
}

pub fn scrape(component: &str, mapped: &[(&str, f64)]) -> MetricsScrape {
    MetricsScrape {
        component: component.to_string(),
        metrics: Some(EndpointProbe {
            url: format!(
                "http://{}/metrics",
                component.split('@').nth(1).unwrap_or("x")
            ),
            outcome: FetchOutcome::Ok,
            http_status: Some(200),
            elapsed_ms: 4,
            body_bytes: 1000,
            detail: None,
        }),
        series: Vec::new(),
        bad_lines: 0,
        mapped: mapped.iter().map(|(k, v)| (k.to_string(), *v)).collect(),
        extra: BTreeMap::new(),
        extra_probes: Vec::new(),
    }
}

pub fn gpu(util: &[(u32, u32, u32)]) -> GpuReading {
    // (index, util %, power W) with a 300 W limit.
    GpuReading {
        driver_version: Some("fake".into()),
        cuda_version: None,
        devices: util
            .iter()
            .map(|(i, u, w)| GpuDevice {
                index: *i,
                name: Some("Fake GPU".into()),
                uuid: None,
                util_gpu_pct: Some(*u),
                util_mem_pct: Some(0),
                power_mw: Some(w * 1000),
                power_limit_mw: Some(300_000),
                mem_used_bytes: Some(1 << 30),
                mem_total_bytes: Some(80 << 30),
                processes: Vec::new(),
                errors: Vec::new(),
            })
            .collect(),
    }
}

pub fn stack(pid: i32, t: Millis, state: &str, top: &str) -> StackCapture {
    StackCapture {
        pid,
        t_ms: t,
        mode: CaptureMode::Nonblocking,
        error: None,
        skipped: None,
        warnings: Vec::new(),
        threads: vec![ThreadStack {
            tid: pid,
            name: Some("MainThread".into()),
            active: true,
            owns_gil: false,
            frames: vec![
                Frame {
                    name: top.into(),
                    file: "scheduler.py".into(),
                    line: 10,
                },
                Frame {
                    name: "event_loop_normal".into(),
                    file: "scheduler.py".into(),
                    line: 900,
                },
            ],
            state: state.into(),
            rule: None,
            decided_by: None,
        }],
    }
}

pub fn kinds(fs: &[Finding]) -> Vec<&str> {
    fs.iter().map(|f| f.kind.as_str()).collect()
}
