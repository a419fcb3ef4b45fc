//! The sockets source driven by a [`FakeSockDiag`] over a fake procfs tree: the sample's
//! owners, namespaces, filtering, TIME_WAIT repetition and fallbacks, without the kernel.

use super::*;
use crate::clock::SystemClock;
use crate::model::{Component, Role, TcpInfo};
use crate::sys::sock_diag::FakeSockDiag;
use std::os::unix::fs::symlink;
use std::path::Path;

fn entry(local: &str, remote: &str, state: TcpState, inode: u64) -> SocketEntry {
    SocketEntry {
        local: local.into(),
        remote: remote.into(),
        state,
        rx_queue: 0,
        tx_queue: 0,
        inode,
        uid: 0,
        pid: None,
        netns: None,
        tcp_info: None,
    }
}

/// `pid` in namespace `netns`, holding the socket inodes `inodes`.
fn fake_process(root: &Path, pid: i32, netns: u64, inodes: &[u64]) {
    let dir = root.join(pid.to_string());
    std::fs::create_dir_all(dir.join("fd")).unwrap();
    std::fs::create_dir_all(dir.join("ns")).unwrap();
    symlink(format!("net:[{netns}]"), dir.join("ns/net")).unwrap();
    for (fd, ino) in inodes.iter().enumerate() {
        symlink(
            format!("socket:[{ino}]"),
            dir.join(format!("fd/{}", fd + 3)),
        )
        .unwrap();
    }
}

/// Our namespace is 1; the engine (pid 100) lives there, a boxed engine (pid 200) in 2.
fn fake_proc() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("self/ns")).unwrap();
    symlink("net:[1]", dir.path().join("self/ns/net")).unwrap();
    fake_process(dir.path(), 100, 1, &[5001, 5002]);
    fake_process(dir.path(), 200, 2, &[6001]);
    dir
}

fn topology() -> Topology {
    let mut engine = Component::new("engine", Role::Engine, "sglang");
    engine.pids = vec![100];
    engine.listen = vec!["127.0.0.1:31012".into()];
    let mut boxed = Component::new("boxed", Role::Engine, "sglang");
    boxed.pids = vec![200];
    boxed.listen = vec!["127.0.0.1:8000".into()];
    Topology {
        components: vec![engine, boxed],
        edges: vec![],
    }
}

fn fake_diag() -> FakeSockDiag {
    let mut accepted = entry(
        "127.0.0.1:31012",
        "127.0.0.1:40000",
        TcpState::Established,
        5002,
    );
    accepted.tcp_info = Some(TcpInfo {
        bytes_received: 120,
        last_data_sent_ms: 9000,
        ..TcpInfo::default()
    });
    let mut diag = FakeSockDiag::with(vec![
        entry("127.0.0.1:31012", "0.0.0.0:0", TcpState::Listen, 5001),
        accepted,
        entry("10.0.0.1:22", "10.0.0.9:50000", TcpState::Established, 9999),
        entry("127.0.0.1:31012", "127.0.0.1:40001", TcpState::TimeWait, 0),
    ]);
    diag.by_pid.insert(
        200,
        vec![entry("127.0.0.1:8000", "0.0.0.0:0", TcpState::Listen, 6001)],
    );
    diag
}

fn sample(src: &SocketSource, topo: &Topology) -> (SocketTable, SourceStatus) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let s = rt.block_on(src.sample(topo, &SystemClock));
    let Payload::Sockets(t) = s.payload else {
        panic!("wrong payload")
    };
    (t, s.status)
}

fn by_inode(t: &SocketTable, inode: u64) -> Option<&SocketEntry> {
    t.sockets.iter().find(|s| s.inode == inode)
}

#[test]
fn a_sample_from_a_fake_sock_diag_has_owners_namespaces_and_only_relevant_sockets() {
    let proc = fake_proc();
    let diag = fake_diag();
    let os = SocketOs {
        sock_diag: Arc::new(diag.clone()),
        proc: ProcFs::new(proc.path()),
    };
    let cfg = SocketConfig {
        time_wait_every: Duration::from_secs(3600),
        ..SocketConfig::default()
    };
    let src = SocketSource::with_os(cfg, os);
    let topo = topology();
    let (t, status) = sample(&src, &topo);
    assert_eq!(status.status, Status::Ok, "{status:?}");
    assert_eq!(by_inode(&t, 5001).and_then(|s| s.pid), Some(100));
    let accepted = by_inode(&t, 5002).expect("accepted socket");
    assert_eq!(accepted.pid, Some(100));
    assert_eq!(accepted.tcp_info.map(|i| i.bytes_received), Some(120));
    assert_eq!(accepted.netns, None, "our own namespace");
    let boxed = by_inode(&t, 6001).expect("the other namespace's listener");
    assert_eq!((boxed.pid, boxed.netns), (Some(200), Some(2)));
    assert!(
        by_inode(&t, 9999).is_none(),
        "unrelated sockets are dropped"
    );
    let tw: Vec<&SocketEntry> = t
        .sockets
        .iter()
        .filter(|s| s.state == TcpState::TimeWait)
        .collect();
    assert_eq!(tw.len(), 1, "kept: it touches the engine's port");
    assert!(
        t.notes
            .iter()
            .any(|n| n.contains("netns 2 (pid 200): sampled inside")),
        "{:?}",
        t.notes
    );
    assert_eq!(diag.dumps.load(std::sync::atomic::Ordering::SeqCst), 2);

    // The next sample repeats the TIME_WAIT list (the fake, like the kernel, leaves them
    // out when not asked) and says so.
    let (t2, _) = sample(&src, &topo);
    assert_eq!(
        t2.sockets
            .iter()
            .filter(|s| s.state == TcpState::TimeWait)
            .count(),
        1
    );
    assert!(
        t2.notes.iter().any(|n| n == TIME_WAIT_REPEATED),
        "{:?}",
        t2.notes
    );
}

#[test]
fn without_sock_diag_the_tables_come_from_net_tcp_and_the_status_says_so() {
    let proc = fake_proc();
    let listen = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n   \
                  0: 0100007F:7A24 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 5001 1\n";
    std::fs::create_dir_all(proc.path().join("self/net")).unwrap();
    std::fs::write(proc.path().join("self/net/tcp"), listen).unwrap();
    std::fs::create_dir_all(proc.path().join("200/net")).unwrap();
    let boxed = listen.replace("7A24", "1F40").replace("5001", "6001");
    std::fs::write(proc.path().join("200/net/tcp"), boxed).unwrap();
    let diag = FakeSockDiag {
        own: Err("fake: no netlink here".into()),
        ..FakeSockDiag::default()
    };
    let os = SocketOs {
        sock_diag: Arc::new(diag),
        proc: ProcFs::new(proc.path()),
    };
    let src = SocketSource::with_os(SocketConfig::default(), os);
    let (t, status) = sample(&src, &topology());
    assert_eq!(status.status, Status::Degraded);
    let why = status.reason.unwrap_or_default();
    assert!(
        why.contains("sock_diag failed (fake: no netlink here)"),
        "{why}"
    );
    assert!(why.contains("netns 2 (pid 200): could not enter"), "{why}");
    let own = by_inode(&t, 5001).expect("from self/net/tcp");
    assert_eq!(
        (own.local.as_str(), own.pid),
        ("127.0.0.1:31268", Some(100))
    );
    let other = by_inode(&t, 6001).expect("from 200/net/tcp");
    assert_eq!(
        (other.local.as_str(), other.pid, other.netns),
        ("127.0.0.1:8000", Some(200), Some(2))
    );
    assert!(other.tcp_info.is_none());
}

#[test]
fn a_vanished_pid_and_no_tables_at_all_say_why() {
    let proc = fake_proc();
    let diag = FakeSockDiag {
        own: Err("fake: no netlink".into()),
        ..FakeSockDiag::default()
    };
    let os = SocketOs {
        sock_diag: Arc::new(diag),
        proc: ProcFs::new(proc.path()),
    };
    let mut topo = topology();
    topo.components[1].pids = vec![300];
    let src = SocketSource::with_os(SocketConfig::default(), os);
    let (t, status) = sample(&src, &topo);
    assert_eq!(status.status, Status::Unavailable);
    let why = status.reason.unwrap_or_default();
    assert!(
        why.contains("sock_diag: fake: no netlink; /proc/net/tcp: vanished"),
        "{why}"
    );
    assert!(t.sockets.is_empty());
}
