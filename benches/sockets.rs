//! Socket table benchmark (`cargo bench --bench sockets`; a plain binary, `harness = false`).
//!
//! A Python helper holds 5,000 loopback TCP connection pairs (10,000 sockets, both ends in
//! the helper). Then, alternately in one run, it times:
//! - `ss -tinp` (subprocess, output read),
//! - the bare netlink dump with tcp_info (the kernel floor, no process mapping),
//! - wedgewatch cold, all processes: a fresh inode map over every pid (what `ss -p` does),
//! - wedgewatch cold, topology: a fresh inode map over the topology's pids,
//! - wedgewatch warm: the cached inode map (only new inodes are resolved).
//!
//! Prints medians and ratios to `ss -tinp`. Env: `WW_BENCH_PAIRS` (default 5000),
//! `WW_BENCH_ROUNDS` (default 9). Quick mode (`cargo test --bench sockets`,
//! `common/mode.rs`): 200 pairs, 2 rounds. Both check that every method found the pairs.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use wedgewatch::model::{Component, Role, Topology};
use wedgewatch::sources::sockets::{build_table, dump_netlink, InodeMap, SocketConfig};

#[path = "common/env.rs"]
mod env;
#[path = "common/mode.rs"]
mod mode;

const HOLDER: &str = r#"
import os, resource, socket, sys, threading, time
threading.Timer(600, lambda: os._exit(0)).start()
n = int(sys.argv[1])
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
want = 2 * n + 64
if soft < want:
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(want, hard), hard))
s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen(1024)
port = s.getsockname()[1]
held = []
for i in range(n):
    c = socket.create_connection(('127.0.0.1', port))
    a, _ = s.accept()
    held += [c, a]
print(port, flush=True)
while True:
    time.sleep(1)
"#;

struct Guard(Child);

impl Drop for Guard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn time_ms(f: impl FnOnce() -> usize) -> (f64, usize) {
    let t = Instant::now();
    let n = f();
    (t.elapsed().as_secs_f64() * 1000.0, n)
}

fn main() {
    let mode = mode::Mode::from_args();
    let pairs: usize = mode.knob("WW_BENCH_PAIRS", 5000, 200);
    let rounds: usize = mode.knob("WW_BENCH_ROUNDS", 9, 2).max(1);
    let mut child = Command::new("python3")
        .args(["-c", HOLDER, &pairs.to_string()])
        .stdout(Stdio::piped())
        .spawn()
        .expect("python3");
    let out = child.stdout.take().expect("stdout");
    let guard = Guard(child);
    let mut line = String::new();
    BufReader::new(out)
        .read_line(&mut line)
        .expect("helper port");
    let port: u16 = line.trim().parse().expect("helper printed its port");
    let pid = guard.0.id() as i32;
    eprintln!("helper pid {pid} holds {pairs} pairs on 127.0.0.1:{port}");

    let mut comp = Component::new("holder", Role::Other, "generic");
    comp.pids = vec![pid];
    comp.main_pid = Some(pid);
    comp.listen = vec![format!("127.0.0.1:{port}")];
    let topo = Topology {
        components: vec![comp],
        edges: vec![],
    };
    let empty = Topology::default();
    let cfg = SocketConfig {
        timeout: Duration::from_secs(10),
        ..SocketConfig::default()
    };
    let mut warm_map = InodeMap::new();
    let _ = build_table(&mut warm_map, &topo, &cfg); // prime the cache

    let names = [
        "ss -tinp",
        "netlink dump only",
        "cold, all processes",
        "cold, topology pids",
        "warm (cached map)",
    ];
    let mut times: Vec<Vec<f64>> = vec![Vec::new(); names.len()];
    let mut counts = vec![0usize; names.len()];
    for _ in 0..rounds {
        let (t, n) = time_ms(|| {
            let o = Command::new("ss")
                .arg("-tinp")
                .stderr(Stdio::null())
                .output()
                .expect("ss");
            o.stdout.iter().filter(|&&b| b == b'\n').count()
        });
        times[0].push(t);
        counts[0] = n;
        let (t, n) = time_ms(|| {
            dump_netlink(Duration::from_secs(10), true)
                .expect("dump")
                .sockets
                .len()
        });
        times[1].push(t);
        counts[1] = n;
        let (t, n) = time_ms(|| {
            let mut m = InodeMap::new();
            let (tb, _) = build_table(&mut m, &empty, &cfg);
            tb.sockets.iter().filter(|s| s.pid.is_some()).count()
        });
        times[2].push(t);
        counts[2] = n;
        let (t, n) = time_ms(|| {
            let mut m = InodeMap::new();
            let (tb, _) = build_table(&mut m, &topo, &cfg);
            tb.sockets.iter().filter(|s| s.pid == Some(pid)).count()
        });
        times[3].push(t);
        counts[3] = n;
        let (t, n) = time_ms(|| {
            let (tb, _) = build_table(&mut warm_map, &topo, &cfg);
            tb.sockets.iter().filter(|s| s.pid == Some(pid)).count()
        });
        times[4].push(t);
        counts[4] = n;
    }
    drop(guard);

    let ss = median(&mut times[0].clone());
    println!("sockets bench: {pairs} loopback pairs, {rounds} alternating rounds, medians");
    println!(
        "{:<22} {:>10} {:>9} {:>12}",
        "method", "median ms", "x ss", "sockets/lines"
    );
    for (i, name) in names.iter().enumerate() {
        let m = median(&mut times[i]);
        println!("{name:<22} {m:>10.1} {:>9.3} {:>12}", m / ss, counts[i]);
    }
    // Every method saw the helper's sockets: both ends of each pair (and its listener).
    let held = 2 * pairs;
    assert!(
        counts[1..].iter().all(|&n| n >= held) && counts[3] == counts[4],
        "the helper holds {held} sockets; found {counts:?}"
    );
}
