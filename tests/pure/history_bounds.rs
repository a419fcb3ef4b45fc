//! Issue 15, item 4: the model's memory is bounded by more than time. Its history (stack
//! captures, metrics points, GPU readings, counts, closed connections) fits a byte budget
//! whatever a flood of samples brings, oldest entries first; and sockets that are not the
//! stack's (other processes' connections, another address sharing a component's port,
//! another network namespace) leave no per-connection state behind.

use wedgewatch_testkit::correl as correl_common;

use correl_common::*;
use wedgewatch::model::*;

const BUDGET: usize = 256 << 10;

/// A stack capture of `threads` threads of 30 frames each (a few KiB, like py-spy's).
fn deep_stack(pid: i32, t: i64, threads: i32) -> StackCapture {
    let mut cap = stack(pid, t, "idle", "recv_requests");
    let th = cap.threads[0].clone();
    cap.threads = (0..threads)
        .map(|i| {
            let mut th = th.clone();
            th.tid = pid * 100 + i;
            th.frames = (0..30)
                .map(|f| Frame {
                    name: format!("function_number_{f}_of_a_deep_python_stack"),
                    file: "/opt/venv/lib/python3.11/site-packages/sglang/srt/managers/x.py".into(),
                    line: f,
                })
                .collect();
            th
        })
        .collect();
    cap
}

/// Ten minutes of a busy stack at the samplers' cadences, squeezed: every tick a stack
/// window of four processes, metrics of every component, a GPU reading, a socket table with
/// new connections (and old ones closed). `check` runs after every tick.
fn flood(sim: &mut Sim, ticks: usize, mut check: impl FnMut(&Sim, usize)) -> usize {
    let mut serialized = 0;
    for i in 0..ticks {
        sim.advance(250);
        let caps: Vec<StackCapture> = [301, 401, 300, 400]
            .iter()
            .map(|&p| deep_stack(p, sim.now, 4))
            .collect();
        serialized += serde_json::to_vec(&caps).map(|v| v.len()).unwrap_or(0);
        sim.ingest(Payload::Stacks(caps));
        let scrapes = [ROUTER, PREFILL, DECODE]
            .iter()
            .map(|c| scrape(c, &[("running", i as f64), ("queued", 0.0)]))
            .collect();
        sim.ingest(Payload::Metrics(scrapes));
        sim.ingest(Payload::Gpu(gpu(&[(0, 90, 250), (1, 90, 250)])));
        let c = sim.connect(Some(100), 30000, 200);
        sim.request(c, 900);
        sim.respond(c, 400);
        if c >= 8 {
            sim.close(c - 8);
        }
        sim.sample_sockets();
        check(sim, i);
    }
    serialized
}

fn flooded(budget: usize, ticks: usize) -> (Sim, usize, usize) {
    let mut sim = Sim::new(pd_topology());
    sim.model.history_ms = 24 * 3_600_000; // the time bound must not be what holds it
    sim.model.history_bytes = budget;
    let mut peak = 0;
    let serialized = flood(&mut sim, ticks, |s, _| {
        peak = peak.max(s.model.history_bytes_used());
    });
    (sim, peak, serialized)
}

#[test]
fn a_flood_of_samples_stays_under_the_byte_budget() {
    let (sim, peak, serialized) = flooded(BUDGET, 600);
    assert!(peak <= BUDGET, "peak {peak} over the budget {BUDGET}");
    let used = sim.model.history_bytes_used();
    assert!(used > BUDGET / 2, "the budget is what bounds it: {used}");
    // the estimate follows the real size: the stack captures alone, as JSON, were far more
    assert!(serialized > 20 * BUDGET, "{serialized}");
    // oldest first: the newest of everything is still there
    let parts = wedgewatch::pipeline::parts(&sim.model, sim.now);
    let decode_threads = parts.threads.iter().filter(|t| t.pid == 401).count();
    assert!(decode_threads > 0, "the newest stack captures are kept");
    let rate_points = sim.model.metrics_history(DECODE).map(|q| q.len());
    assert!(rate_points.is_some_and(|n| n >= 2), "{rate_points:?}");
    let newest = sim.model.metrics_history(DECODE).and_then(|q| q.back());
    assert_eq!(newest.map(|p| p.t_ms), Some(sim.now));
    let oldest = sim.model.metrics_history(DECODE).and_then(|q| q.front());
    assert!(
        oldest.is_some_and(|p| p.t_ms > T0 + 250),
        "old points evicted"
    );
}

#[test]
fn without_a_tight_budget_the_same_flood_is_kept() {
    // the control: the flood above is big enough that only the budget bounded it
    let (_, peak, _) = flooded(wedgewatch::correlate::DEFAULT_HISTORY_BYTES, 600);
    assert!(peak > 4 * BUDGET, "{peak}");
}

/// An established connection with tcp_info counters.
fn sock(local: &str, remote: &str, pid: Option<i32>, netns: Option<u64>) -> SocketEntry {
    SocketEntry {
        local: local.into(),
        remote: remote.into(),
        state: TcpState::Established,
        rx_queue: 0,
        tx_queue: 0,
        inode: 7,
        uid: 0,
        pid,
        netns,
        tcp_info: Some(TcpInfo {
            bytes_acked: 500,
            bytes_received: 900,
            bytes_sent: 500,
            last_data_sent_ms: 100,
            last_data_recv_ms: 200,
            last_ack_recv_ms: 100,
            ..Default::default()
        }),
    }
}

#[test]
fn foreign_sockets_leave_no_per_connection_state() {
    let mut sim = Sim::new(pd_topology());
    let c = sim.connect(Some(100), 30000, 200);
    sim.request(c, 900);
    let mut foreign_seen = 0;
    for round in 0..40 {
        sim.advance(250);
        let mut table = sim.socket_table();
        let port = 41000 + round;
        let foreign = [
            // two unrelated processes talking (a database and its client)
            sock(
                "10.0.0.5:5432",
                &format!("10.0.0.6:{port}"),
                Some(999),
                None,
            ),
            sock(
                &format!("10.0.0.6:{port}"),
                "10.0.0.5:5432",
                Some(998),
                None,
            ),
            // another address of the host on the router's port number, owner unknown
            sock("10.0.0.7:30000", &format!("10.0.0.8:{port}"), None, None),
            // the decode engine's port inside another network namespace
            sock(
                "127.0.0.1:31012",
                &format!("127.0.0.1:{port}"),
                None,
                Some(77),
            ),
        ];
        foreign_seen += foreign.len();
        table.sockets.extend(foreign);
        sim.ingest(Payload::Sockets(table));
    }
    assert!(foreign_seen >= 160);
    // the stack's one connection (proxy -> router) is the only one with state
    assert_eq!(sim.model.connections_tracked(), 1);
    let xs: Vec<_> = sim.model.exchanges().collect();
    assert!(xs.iter().all(|x| x.component == ROUTER), "{xs:?}");
    assert!(!xs.is_empty());
    let (_, kept) = sim.model.latest_sockets().expect("a table");
    assert!(
        kept.sockets.iter().all(|e| !e.local.starts_with("10.0.0.")
            && !e.remote.starts_with("10.0.0.")
            && e.netns.is_none()),
        "{:?}",
        kept.sockets
    );
    assert!(kept.sockets.iter().any(|e| e.local == "127.0.0.1:30000"));
}

/// A socket table of the simulation as a source sends it: complete, or degraded (an owner's
/// fds could not be read: a process that exited mid-read, as under connection churn).
fn sockets_sample(sim: &mut Sim, degraded: bool) {
    let status = if degraded {
        SourceStatus::degraded("cannot map sockets to pids: 4242: vanished")
    } else {
        SourceStatus::ok()
    };
    let s = Sample {
        t_ms: sim.now,
        status,
        took_ms: 3,
        payload: Payload::Sockets(sim.socket_table()),
    };
    sim.model.ingest(&s);
}

/// Churn like 200 streams on a big node: every request a new connection to the router, open
/// for about a second (four socket samples), thousands a simulated minute, for `minutes`;
/// every table `degraded` or not. `check` runs after every table.
fn churn(sim: &mut Sim, minutes: i64, degraded: bool, mut check: impl FnMut(&Sim)) {
    let mut open: std::collections::VecDeque<(usize, i64)> = Default::default();
    let ticks = minutes * 60_000 / 250;
    for _ in 0..ticks {
        sim.advance(250);
        for _ in 0..10 {
            let c = sim.connect(Some(100), 30000, 200);
            sim.request(c, 900);
            open.push_back((c, sim.now));
        }
        while let Some(&(c, since)) = open.front() {
            if sim.now - since < 1_000 {
                break;
            }
            sim.respond(c, 2_000);
            sim.close(c);
            open.pop_front();
        }
        sockets_sample(sim, degraded);
        check(sim);
    }
}

#[test]
fn connection_churn_leaves_a_bounded_model() {
    let mut sim = Sim::new(pd_topology());
    sim.model.history_bytes = 4 << 20;
    let (mut peak_tracked, mut peak_bytes) = (0, 0);
    // 40 connections a second for 10 simulated minutes (24,000), every table degraded (an
    // owner's fds unreadable for good): a connection gone from its namespace's dump is closed
    churn(&mut sim, 10, true, |s| {
        let c = s.model.census();
        peak_tracked = peak_tracked.max(s.model.connections_tracked());
        peak_bytes = peak_bytes.max(c.open_bytes + c.history_bytes);
        // what is open is what the source still shows: about a second of connections
        assert!(c.open_conns <= 200, "{c:?}");
    });
    let c = sim.model.census();
    assert!(sim.conns.len() >= 24_000, "{}", sim.conns.len());
    assert!(
        peak_tracked <= 4096 + 200,
        "{peak_tracked} connections kept"
    );
    assert!(peak_bytes <= (4 << 20) + (1 << 20), "{peak_bytes} bytes");
    // the newest closed connections are still there (the window is served)
    assert!(c.closed_conns > 1_000, "{c:?}");
    let newest = sim.model.exchanges().map(|x| x.request_ms).max();
    assert!(newest.is_some_and(|t| t >= sim.now - 1_250), "{newest:?}");
}
