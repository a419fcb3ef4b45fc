//! The sockets source against real sockets held by real Python processes (127.0.0.1/::1
//! only; every process is killed by a Drop guard and exits by itself after 120 s anyway).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};
use wedgewatch::clock::SystemClock;
use wedgewatch::model::{
    Component, Payload, Role, SocketEntry, SocketTable, Status, TcpState, Topology,
};
use wedgewatch::sources::sockets::{
    build_table, dump_netlink, InodeMap, Scope, SocketConfig, SocketSource, TIME_WAIT_REPEATED,
};
use wedgewatch::sources::Source;
use wedgewatch::sys::ProcFs;
use wedgewatch_testkit::timing::within;

/// One script, several roles (argv[1]). Prints one line (a port or "ready") when set up.
const HELPER: &str = r#"
import os, socket, sys, threading, time
threading.Timer(120, lambda: os._exit(0)).start()
mode = sys.argv[1]

def listen(host):
    fam = socket.AF_INET6 if ':' in host else socket.AF_INET
    s = socket.socket(fam, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((host, 0))
    s.listen(128)
    return s

def pump(a, b):
    try:
        while True:
            d = a.recv(65536)
            if not d:
                break
            b.sendall(d)
    except OSError:
        pass

held = []
if mode == 'silent':
    # Accepts and never answers (nor reads): "accepted and forgotten".
    s = listen(sys.argv[2]); print(s.getsockname()[1], flush=True)
    while True:
        c, _ = s.accept(); held.append(c)
elif mode == 'stream':
    # Streams 1000 bytes every 50 ms to each client.
    s = listen(sys.argv[2]); print(s.getsockname()[1], flush=True)
    def feed(c):
        try:
            while True:
                c.sendall(b'x' * 1000); time.sleep(0.05)
        except OSError:
            pass
    while True:
        c, _ = s.accept(); held.append(c)
        threading.Thread(target=feed, args=(c,), daemon=True).start()
elif mode == 'proxy':
    # Forwards each client connection to 127.0.0.1:argv[2].
    s = listen('127.0.0.1'); print(s.getsockname()[1], flush=True)
    while True:
        c, _ = s.accept()
        u = socket.create_connection(('127.0.0.1', int(sys.argv[2])))
        held += [c, u]
        threading.Thread(target=pump, args=(c, u), daemon=True).start()
        threading.Thread(target=pump, args=(u, c), daemon=True).start()
elif mode == 'client':
    c = socket.create_connection(('127.0.0.1', int(sys.argv[2])))
    c.sendall(b'POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}')
    print('ready', flush=True)
    held.append(c)
elif mode == 'selfpair':
    # A connected pair inside our own (possibly private) network namespace.
    s = listen('127.0.0.1')
    c = socket.create_connection(('127.0.0.1', s.getsockname()[1]))
    a, _ = s.accept()
    c.sendall(b'0123456789')
    held += [c, a]
    print(s.getsockname()[1], flush=True)
while True:
    time.sleep(1)
"#;

struct Proc {
    child: Child,
    line: String,
}

impl Proc {
    fn pid(&self) -> i32 {
        self.child.id() as i32
    }
    fn port(&self) -> u16 {
        self.line.trim().parse().expect("helper printed a port")
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn spawn_cmd(mut cmd: Command) -> Proc {
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn helper");
    let out = child.stdout.take().expect("stdout");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = BufReader::new(out).read_line(&mut line);
        let _ = tx.send(line);
    });
    let mut p = Proc {
        child,
        line: String::new(),
    };
    p.line = rx
        .recv_timeout(Duration::from_secs(15))
        .expect("helper did not report in 15 s");
    assert!(!p.line.is_empty(), "helper exited before reporting");
    p
}

fn helper(args: &[&str]) -> Proc {
    let mut cmd = Command::new("python3");
    cmd.arg("-c").arg(HELPER).args(args);
    spawn_cmd(cmd)
}

/// Waits until `pid` holds `n` accepted sockets beside its listener (an accepted socket has
/// an owner only once the server's `accept()` ran, a moment after `connect` on a busy box).
fn wait_accepted(pid: i32, n: usize) {
    let deadline = Instant::now() + within(Duration::from_secs(1));
    loop {
        let sockets = std::fs::read_dir(format!("/proc/{pid}/fd"))
            .map(|d| {
                d.flatten()
                    .filter(|e| {
                        std::fs::read_link(e.path())
                            .is_ok_and(|l| l.to_string_lossy().starts_with("socket:"))
                    })
                    .count()
            })
            .unwrap_or(0);
        if sockets > n {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "pid {pid} holds {sockets} sockets, not a listener and {n} accepted"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn component(id: &str, role: Role, pids: &[i32], listen: &[String]) -> Component {
    let mut c = Component::new(id, role, "generic");
    c.pids = pids.to_vec();
    c.main_pid = pids.first().copied();
    c.listen = listen.to_vec();
    c
}

fn table_for(topo: &Topology, map: &mut InodeMap) -> SocketTable {
    let (table, status) = build_table(map, topo, &SocketConfig::default());
    assert_eq!(status.status, Status::Ok, "{status:?}");
    table
}

fn find(t: &SocketTable, f: impl Fn(&SocketEntry) -> bool) -> &SocketEntry {
    t.sockets
        .iter()
        .find(|s| f(s))
        .unwrap_or_else(|| panic!("socket not found in {:#?}", t.sockets))
}

#[test]
fn accepted_never_answered_socket_shows_silence_and_owner() {
    let server = helper(&["silent", "127.0.0.1"]);
    let port = server.port();
    let mut client = TcpStream::connect(("127.0.0.1", port)).unwrap();
    let request = b"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}";
    client.write_all(request).unwrap();
    let me = std::process::id() as i32;
    let topo = Topology {
        components: vec![
            component(
                "server",
                Role::Engine,
                &[server.pid()],
                &[format!("127.0.0.1:{port}")],
            ),
            component("client", Role::Client, &[me], &[]),
        ],
        edges: vec![],
    };
    let mut map = InodeMap::new();
    wait_accepted(server.pid(), 1);
    let t1 = table_for(&topo, &mut map);
    std::thread::sleep(Duration::from_millis(400));
    let t2 = table_for(&topo, &mut map);

    let server_side = |t: &SocketTable| {
        find(t, |s| {
            s.local_port() == Some(port) && s.state == TcpState::Established
        })
        .clone()
    };
    let a = server_side(&t1);
    let b = server_side(&t2);
    assert_eq!(a.pid, Some(server.pid()), "owner of the accepted socket");
    let (ia, ib) = (a.tcp_info.unwrap(), b.tcp_info.unwrap());
    assert!(ib.bytes_acked <= 1, "server never sent: {ib:?}");
    assert_eq!(ib.bytes_received, request.len() as u64);
    assert!(
        ib.last_data_sent_ms >= ia.last_data_sent_ms + 300,
        "silence grows: {ia:?} -> {ib:?}"
    );
    assert!(
        ib.last_data_recv_ms >= 300,
        "nothing received since: {ib:?}"
    );
    // The listening socket and our own client end are there too, with the right owners.
    let l = find(&t2, |s| {
        s.local_port() == Some(port) && s.state == TcpState::Listen
    });
    assert_eq!(l.pid, Some(server.pid()));
    let c = find(&t2, |s| s.remote_port() == Some(port));
    assert_eq!(c.pid, Some(me));
    assert_eq!(c.tcp_info.unwrap().bytes_acked, request.len() as u64 + 1);

    // One listening and one accepted socket of the server; ours is a connection to it.
    let of_server = |state: TcpState| {
        t2.sockets
            .iter()
            .filter(|s| s.pid == Some(server.pid()) && s.state == state)
            .count()
    };
    assert_eq!(
        (
            of_server(TcpState::Listen),
            of_server(TcpState::Established)
        ),
        (1, 1)
    );
    assert_eq!(
        connections(&topo, &t2),
        vec![("client".to_string(), "server".to_string())]
    );
    drop(client);
}

#[test]
fn streaming_socket_shows_growing_bytes_over_ipv6() {
    let server = helper(&["stream", "::1"]);
    let port = server.port();
    let mut client = TcpStream::connect(("::1", port)).unwrap();
    client
        .set_read_timeout(Some(Duration::from_millis(50)))
        .unwrap();
    let topo = Topology {
        components: vec![component(
            "streamer",
            Role::Decode,
            &[server.pid()],
            &[format!("[::1]:{port}")],
        )],
        edges: vec![],
    };
    let mut map = InodeMap::new();
    let mut drain = |ms: u64| {
        let end = Instant::now() + Duration::from_millis(ms);
        let mut buf = [0u8; 65536];
        while Instant::now() < end {
            let _ = client.read(&mut buf);
        }
    };
    drain(200);
    let t1 = table_for(&topo, &mut map);
    drain(400);
    let t2 = table_for(&topo, &mut map);
    let pick = |t: &SocketTable| {
        find(t, |s| {
            s.local == format!("[::1]:{port}") && s.state == TcpState::Established
        })
        .clone()
    };
    let (a, b) = (pick(&t1), pick(&t2));
    assert_eq!(b.pid, Some(server.pid()));
    assert!(b.remote.starts_with("[::1]:"), "{}", b.remote);
    let (ia, ib) = (a.tcp_info.unwrap(), b.tcp_info.unwrap());
    assert!(
        ib.bytes_acked >= ia.bytes_acked + 4000,
        "stream grows: {ia:?} -> {ib:?}"
    );
    assert!(ib.bytes_sent >= ib.bytes_acked - 1);
    assert!(ib.last_data_sent_ms < 200, "recently sent: {ib:?}");
    // Our own end, mapped to us although we are not in the topology: it touches the port.
    let mine = find(&t2, |s| s.remote == format!("[::1]:{port}"));
    assert!(mine.tcp_info.unwrap().bytes_received >= ib.bytes_acked.saturating_sub(70_000));
}

#[test]
fn chain_client_proxy_router_gives_connections_and_owners() {
    let router = helper(&["silent", "127.0.0.1"]);
    let proxy = helper(&["proxy", &router.port().to_string()]);
    let client = helper(&["client", &proxy.port().to_string()]);
    let topo = Topology {
        components: vec![
            component("client", Role::Client, &[client.pid()], &[]),
            component(
                "proxy@127.0.0.1",
                Role::Proxy,
                &[proxy.pid()],
                &[format!("127.0.0.1:{}", proxy.port())],
            ),
            component(
                "router@127.0.0.1",
                Role::Router,
                &[router.pid()],
                &[format!("0.0.0.0:{}", router.port())],
            ),
        ],
        edges: vec![],
    };
    let mut map = InodeMap::new();
    // The proxy connects upstream after accepting: give it a moment, bounded.
    let mut links = Vec::new();
    for _ in 0..50 {
        let t = table_for(&topo, &mut map);
        links = connections(&topo, &t);
        // Both ends of the proxy's upstream connection, not only the proxy's: the router's
        // accepted socket has an owner once it is accept()ed, a moment later on a busy box.
        let router_in = t
            .sockets
            .iter()
            .filter(|s| s.pid == Some(router.pid()) && s.state == TcpState::Established)
            .count();
        if links.len() == 2 && router_in == 1 {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(
        links,
        vec![
            ("client".to_string(), "proxy@127.0.0.1".to_string()),
            (
                "proxy@127.0.0.1".to_string(),
                "router@127.0.0.1".to_string()
            ),
        ],
        "two connections within 5 s"
    );
    // The proxy listens, holds the accepted client and its upstream; nothing else.
    let t = table_for(&topo, &mut map);
    let proxy_states: Vec<TcpState> = t
        .sockets
        .iter()
        .filter(|s| s.pid == Some(proxy.pid()))
        .map(|s| s.state)
        .collect();
    assert_eq!(proxy_states.len(), 3, "{proxy_states:?}");
    assert_eq!(
        proxy_states
            .iter()
            .filter(|s| **s == TcpState::Listen)
            .count(),
        1
    );
    drop(client);
}

/// Live connections between components as (from, to): an ESTABLISHED socket of one
/// component's pid whose remote port another component listens on, one per connection.
fn connections(topo: &Topology, t: &SocketTable) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = t
        .sockets
        .iter()
        .filter(|s| s.state == TcpState::Established)
        .filter_map(|s| {
            let from = topo.component_of_pid(s.pid?)?;
            let to = topo.component_listening_on(s.remote_port()?)?;
            (from.id != to.id).then(|| (from.id.clone(), to.id.clone()))
        })
        .collect();
    out.sort();
    out
}

#[test]
fn inode_map_is_incremental() {
    let server = helper(&["silent", "127.0.0.1"]);
    let port = server.port();
    let _c1 = TcpStream::connect(("127.0.0.1", port)).unwrap();
    wait_accepted(server.pid(), 1);
    let scope = Scope::Pids {
        pids: vec![server.pid()],
        ports: vec![port],
    };
    let mut map = InodeMap::new();
    let mut socks = dump_netlink(Duration::from_secs(2), true).unwrap().sockets;
    let cold = map.resolve(&mut socks, &scope);
    assert!(cold.pids_scanned == 1 && cold.fds_read > 0, "{cold:?}");
    // Same sockets again: nothing to read (foreign inodes are remembered).
    let mut socks = dump_netlink(Duration::from_secs(2), true).unwrap().sockets;
    let warm = map.resolve(&mut socks, &scope);
    assert_eq!(warm.pids_scanned, 0, "{warm:?}");
    assert!(socks
        .iter()
        .any(|s| s.pid == Some(server.pid()) && s.state == TcpState::Established));
    // Churn elsewhere (a connection not touching the topology's ports, not the candidate's
    // fds): no rescan.
    let other = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let _o = TcpStream::connect(other.local_addr().unwrap()).unwrap();
    let _oa = other.accept().unwrap();
    let mut socks = dump_netlink(Duration::from_secs(2), true).unwrap().sockets;
    let churn = map.resolve(&mut socks, &scope);
    assert!(churn.unknown_before >= 2, "{churn:?}");
    assert_eq!(churn.pids_scanned, 0, "{churn:?}");
    // A new connection: one rescan of the candidate, the new inode resolved.
    let _c2 = TcpStream::connect(("127.0.0.1", port)).unwrap();
    wait_accepted(server.pid(), 2);
    let mut socks = dump_netlink(Duration::from_secs(2), true).unwrap().sockets;
    let again = map.resolve(&mut socks, &scope);
    assert_eq!(again.pids_scanned, 1, "{again:?}");
    let accepted = socks
        .iter()
        .filter(|s| s.local_port() == Some(port) && s.state == TcpState::Established)
        .filter(|s| s.pid == Some(server.pid()))
        .count();
    assert_eq!(accepted, 2);
}

#[test]
fn other_network_namespace_is_sampled_inside_it() {
    // Root can create a private netns here; skip loudly where it cannot.
    let ok = Command::new("unshare")
        .args(["-n", "true"])
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    if !ok {
        eprintln!("SKIPPED: `unshare -n` not permitted here; netns sampling untested");
        return;
    }
    let mut cmd = Command::new("unshare");
    cmd.args([
        "-n",
        "sh",
        "-c",
        "ip link set lo up && exec python3 -c \"$0\" selfpair",
    ])
    .arg(HELPER);
    let inner = spawn_cmd(cmd);
    let port = inner.port();
    let proc = ProcFs::real();
    let ns = proc.ns_inode(inner.pid(), "net").unwrap();
    assert_ne!(Some(ns), proc.own_ns_inode("net").ok());
    let topo = Topology {
        components: vec![component(
            "boxed",
            Role::Engine,
            &[inner.pid()],
            &[format!("127.0.0.1:{port}")],
        )],
        edges: vec![],
    };
    let mut map = InodeMap::new();
    let (t, status) = build_table(&mut map, &topo, &SocketConfig::default());
    assert_eq!(status.status, Status::Ok, "{status:?}");
    assert!(
        t.notes.iter().any(|n| n.contains("sampled inside")),
        "{:?}",
        t.notes
    );
    let s = find(&t, |s| {
        s.local_port() == Some(port) && s.state == TcpState::Established
    });
    assert_eq!(s.netns, Some(ns));
    assert_eq!(s.pid, Some(inner.pid()));
    assert_eq!(s.tcp_info.unwrap().bytes_received, 10);
    // The fallback reader sees the same sockets, without tcp_info.
    let fb = proc.tcp_table(inner.pid()).unwrap();
    assert!(fb.iter().any(|e| e.local_port() == Some(port)
        && e.state == TcpState::Listen
        && e.tcp_info.is_none()));
    assert_eq!(
        fb.iter()
            .filter(|e| e.state == TcpState::Established)
            .count(),
        2
    );
}

#[test]
fn vanished_pid_degrades_with_reason() {
    let mut gone = Command::new("true").spawn().unwrap();
    let pid = gone.id() as i32;
    gone.wait().unwrap();
    let topo = Topology {
        components: vec![component("ghost", Role::Proxy, &[pid], &[])],
        edges: vec![],
    };
    let src = SocketSource::new(SocketConfig::default());
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let sample = rt.block_on(src.sample(&topo, &SystemClock));
    assert_eq!(sample.status.status, Status::Degraded);
    let reason = sample.status.reason.unwrap();
    assert!(reason.contains(&format!("pid {pid} vanished")), "{reason}");
    assert!(matches!(sample.payload, Payload::Sockets(_)));
}

#[test]
fn source_trait_samples_within_timeout() {
    let server = helper(&["silent", "127.0.0.1"]);
    let port = server.port();
    let _c = TcpStream::connect(("127.0.0.1", port)).unwrap();
    let topo = Topology {
        components: vec![component(
            "s",
            Role::Engine,
            &[server.pid()],
            &[format!("127.0.0.1:{port}")],
        )],
        edges: vec![],
    };
    let src = SocketSource::new(SocketConfig::default());
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    wait_accepted(server.pid(), 1);
    let sample = rt.block_on(src.sample(&topo, &SystemClock));
    assert_eq!(sample.status.status, Status::Ok, "{:?}", sample.status);
    let took = Duration::from_millis(sample.took_ms);
    assert!(took < within(SocketConfig::default().timeout), "{took:?}");
    let Payload::Sockets(t) = sample.payload else {
        panic!("wrong payload")
    };
    // Only topology-relevant sockets are kept: everything here touches the server's port.
    assert!(t
        .sockets
        .iter()
        .all(|s| s.local_port() == Some(port) || s.remote_port() == Some(port)));
    assert_eq!(t.sockets.len(), 3, "{:#?}", t.sockets);
}

/// A closed connection the server closed first: the server's end sits in TIME_WAIT.
fn time_wait_on(listener: &std::net::TcpListener) -> String {
    let client = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
    let (server_end, _) = listener.accept().unwrap();
    let client_addr = client.local_addr().unwrap().to_string();
    drop(server_end); // active close: TIME_WAIT on the server side
    let mut buf = [0u8; 1];
    let mut client = client;
    let _ = client.read(&mut buf); // sees EOF
    drop(client);
    client_addr
}

/// Under churn TIME_WAIT sockets are most of the table and say nothing new at 4 Hz: the
/// source lists them every `time_wait_every` and repeats that list in between, saying so.
#[test]
fn time_wait_sockets_are_listed_every_few_seconds_and_repeated_between() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let me = std::process::id() as i32;
    let topo = Topology {
        components: vec![component(
            "s",
            Role::Engine,
            &[me],
            &[format!("127.0.0.1:{port}")],
        )],
        edges: vec![],
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let tw_remotes = |t: &SocketTable| -> Vec<String> {
        t.sockets
            .iter()
            .filter(|s| s.state == TcpState::TimeWait && s.local_port() == Some(port))
            .map(|s| s.remote.clone())
            .collect()
    };
    let sample = |src: &SocketSource| -> SocketTable {
        let s = rt.block_on(src.sample(&topo, &SystemClock));
        assert_eq!(s.status.status, Status::Ok, "{:?}", s.status);
        let Payload::Sockets(t) = s.payload else {
            panic!("wrong payload")
        };
        t
    };
    let first = time_wait_on(&listener);
    std::thread::sleep(Duration::from_millis(50));
    let hourly = SocketSource::new(SocketConfig {
        time_wait_every: Duration::from_secs(3600),
        ..SocketConfig::default()
    });
    let t1 = sample(&hourly);
    assert_eq!(
        tw_remotes(&t1),
        vec![first.clone()],
        "listed on the first sample"
    );
    assert!(!t1.notes.iter().any(|n| n == TIME_WAIT_REPEATED));
    assert!(t1
        .sockets
        .iter()
        .any(|s| s.state == TcpState::Listen && s.local_port() == Some(port)));

    let second = time_wait_on(&listener);
    std::thread::sleep(Duration::from_millis(50));
    let t2 = sample(&hourly);
    assert_eq!(
        tw_remotes(&t2),
        vec![first.clone()],
        "repeated, not re-listed"
    );
    assert!(
        t2.notes.iter().any(|n| n == TIME_WAIT_REPEATED),
        "{:?}",
        t2.notes
    );
    assert!(t2
        .sockets
        .iter()
        .any(|s| s.state == TcpState::Listen && s.local_port() == Some(port)));

    let always = SocketSource::new(SocketConfig {
        time_wait_every: Duration::ZERO,
        ..SocketConfig::default()
    });
    let mut both = tw_remotes(&sample(&always));
    both.sort();
    let mut want = vec![first, second];
    want.sort();
    assert_eq!(both, want);
    let again = sample(&always);
    assert!(!again.notes.iter().any(|n| n == TIME_WAIT_REPEATED));
    assert_eq!(tw_remotes(&again).len(), 2);
}
