//! [`ProcFs`] against a fake tree in a tempdir (every kind of read, links not followed,
//! caps) and against the real `/proc` (our own process).

use super::*;
use std::os::unix::fs::symlink;

/// A fake procfs with one process (pid 42) holding two sockets and a pipe.
fn fake_tree() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let p = root.join("42");
    for d in ["fd", "ns", "net", "task/42", "task/43"] {
        std::fs::create_dir_all(p.join(d)).unwrap();
    }
    std::fs::create_dir_all(root.join("self/ns")).unwrap();
    std::fs::create_dir_all(root.join("notapid")).unwrap();
    let write = |rel: &str, text: &str| std::fs::write(p.join(rel), text).unwrap();
    write(
        "cmdline",
        "python3\0-m\0sglang.launch_server\0--port\0\x0031012\0",
    );
    write(
        "environ",
        "CUDA_VISIBLE_DEVICES=2,3\0HF_TOKEN=hf_x=y\0BROKEN\0",
    );
    write("comm", "sglang::schedul\n");
    write(
        "stat",
        "42 (sglang::sched) S 7 42 42 0 -1 4194560 100 0 0 0 5 3 0 0 20 0 3 0 1234 1000000 250 \
         18446744073709551615 1 1 0 0 0 0 0 16781314 2 0 0 0 17 1 0 0 0 0 0 0 0 0 0 0 0 0 0\n",
    );
    // A real kernel's status file (procfs wants most of its fields).
    let fixture =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/proc/container/100");
    std::fs::copy(fixture.join("status"), p.join("status")).unwrap();
    write("task/42/comm", "main\n");
    write(
        "cgroup",
        "0::/system.slice/docker-abc123.scope\n4:cpu,cpuacct:/docker/abc123\ngarbage\n",
    );
    write("task/43/comm", "detokenizer\n");
    write(
        "net/tcp",
        "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n   \
         0: 0100007F:7A24 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 5001 1\n   \
         1: 0100007F:7A24 0100007F:9C40 01 00000000:00000000 00:00000000 00000000     0        0 5002 1\n",
    );
    symlink("socket:[5001]", p.join("fd/3")).unwrap();
    symlink("socket:[5002]", p.join("fd/4")).unwrap();
    symlink("pipe:[77]", p.join("fd/5")).unwrap();
    symlink("net:[4026531999]", p.join("ns/net")).unwrap();
    symlink("pid:[4026531836]", p.join("ns/pid")).unwrap();
    symlink("net:[4026531840]", root.join("self/ns/net")).unwrap();
    symlink("/usr/bin/python3.11", p.join("exe")).unwrap();
    std::fs::write(root.join("stat"), "cpu 1 2 3\nbtime 1700000000\n").unwrap();
    write(
        "maps",
        "5581d000-5581e000 r--p 00000000 08:01 1 /usr/bin/python3.11\n\
         7f00a000-7f00b000 r-xp 00000000 08:01 2 /usr/lib/libpython3.11.so.1.0\n",
    );
    std::fs::create_dir_all(root.join("sys/kernel/yama")).unwrap();
    std::fs::write(root.join("sys/kernel/yama/ptrace_scope"), "1\n").unwrap();
    dir
}

#[test]
fn reads_every_kind_of_file_of_a_fake_tree() {
    let dir = fake_tree();
    let fs = ProcFs::new(dir.path());
    assert!(!fs.is_real());
    assert_eq!(fs.pids().unwrap(), vec![42]);
    assert!(fs.exists(42).is_ok());
    assert!(fs.exists(43).unwrap_err().is_vanished());
    assert_eq!(
        fs.cmdline(42).unwrap(),
        ["python3", "-m", "sglang.launch_server", "--port", "31012"]
    );
    let env = fs.environ(42).unwrap();
    assert_eq!(env["CUDA_VISIBLE_DEVICES"], "2,3");
    assert_eq!(env["HF_TOKEN"], "hf_x=y");
    assert!(!env.contains_key("BROKEN"));
    assert_eq!(fs.comm(42).unwrap(), "sglang::schedul");
    let stat = fs.stat(42).unwrap();
    assert_eq!((stat.ppid, stat.comm.as_str()), (7, "sglang::sched"));
    assert_eq!(stat.starttime, 1234);
    let status = fs.status(42).unwrap();
    assert_eq!(status.nspid, Some(vec![100, 1]));
    assert_eq!(status.vmrss, Some(51200));
    assert_eq!(fs.exe(42).unwrap(), Path::new("/usr/bin/python3.11"));
    let cgroups = fs.cgroups(42).unwrap();
    assert_eq!(cgroups.len(), 2, "{cgroups:?}");
    assert_eq!(cgroups[0].path, "/system.slice/docker-abc123.scope");
    assert!(cgroups[0].controllers.is_empty());
    assert_eq!((cgroups[1].hierarchy, cgroups[1].controllers.len()), (4, 2));
    let threads = fs.threads(42, 10).unwrap();
    let names: Vec<&str> = threads.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, ["main", "detokenizer"]);
    assert_eq!(fs.threads(42, 1).unwrap().len(), 1);
    assert_eq!(fs.fd_count(42).unwrap(), 3);
    assert_eq!(
        fs.fd_dir_size(42),
        None,
        "a fixture's dir size means nothing"
    );
    let scan = fs.socket_inodes(42).unwrap();
    assert_eq!(scan.fds_read, 3);
    let mut inodes = scan.socket_inodes.clone();
    inodes.sort_unstable();
    assert_eq!(inodes, [5001, 5002]);
    assert_eq!(fs.ns_inode(42, "net").unwrap(), 4026531999);
    assert_eq!(fs.ns_inode(42, "pid").unwrap(), 4026531836);
    assert_eq!(fs.own_ns_inode("net").unwrap(), 4026531840);
    let tcp = fs.tcp_table(42).unwrap();
    assert_eq!(tcp.len(), 2, "tcp6 absent is not an error");
    assert_eq!(tcp[0].local, "127.0.0.1:31268");
    assert_eq!(
        (tcp[1].remote.as_str(), tcp[1].inode),
        ("127.0.0.1:40000", 5002)
    );
    assert_eq!(fs.boot_time_ms(), Some(1_700_000_000_000));
}

#[test]
fn reads_what_the_stacks_source_and_router_keys_need() {
    let dir = fake_tree();
    let fs = ProcFs::new(dir.path());
    assert!(fs.maps_mention(42, "libpython").unwrap());
    assert!(!fs.maps_mention(42, "libcuda").unwrap());
    assert!(fs.maps_mention(99, "libpython").unwrap_err().is_vanished());
    assert_eq!(fs.ptrace_scope(), Some(1));
    // Raw bytes, NULs and empty arguments kept, capped.
    let raw = fs.cmdline_bytes(42, 1 << 20).unwrap();
    assert!(raw.starts_with(b"python3\0-m\0"));
    assert!(
        raw.windows(2).any(|w| w == b"\0\0"),
        "the empty argument is kept"
    );
    assert_eq!(fs.cmdline_bytes(42, 7).unwrap(), b"python3");
    let env = fs.environ_bytes(42, 1 << 20).unwrap();
    assert!(env.ends_with(b"BROKEN\0"));
    let me = nix::unistd::geteuid().as_raw();
    assert_eq!(fs.owner_uid(42).unwrap(), me);
    assert!(fs.owner_uid(99).unwrap_err().is_vanished());
    // A maps link is not followed (a fixture tree must not make us read other files).
    std::fs::remove_file(dir.path().join("42/maps")).unwrap();
    symlink(dir.path().join("42/cmdline"), dir.path().join("42/maps")).unwrap();
    assert!(fs.maps_mention(42, "python").is_err());
}

#[test]
fn errors_say_what_an_operator_can_act_on() {
    let dir = fake_tree();
    let fs = ProcFs::new(dir.path());
    let gone = fs.cmdline(99).unwrap_err();
    assert!(gone.is_vanished());
    assert!(
        gone.to_string().starts_with("vanished or absent ("),
        "{gone}"
    );
    std::fs::write(dir.path().join("42/ns/bad"), "").unwrap();
    symlink("garbage", dir.path().join("42/ns/uts")).unwrap();
    let bad = fs.ns_inode(42, "uts").unwrap_err();
    assert!(bad.to_string().contains("unexpected link"), "{bad}");
    std::fs::write(dir.path().join("42/stat"), "nonsense").unwrap();
    assert!(matches!(fs.stat(42), Err(ProcFsError::Malformed { .. })));
    // net/tcp missing is an error (tcp6 missing is not).
    std::fs::remove_file(dir.path().join("42/net/tcp")).unwrap();
    assert!(fs.tcp_table(42).unwrap_err().is_vanished());
}

#[test]
fn links_are_not_followed_and_big_files_are_capped() {
    let dir = fake_tree();
    let fs = ProcFs::new(dir.path());
    let secret = dir.path().join("secret");
    std::fs::write(&secret, "A=1\0").unwrap();
    std::fs::remove_file(dir.path().join("42/environ")).unwrap();
    symlink(&secret, dir.path().join("42/environ")).unwrap();
    assert!(fs.environ(42).is_err(), "environ through a link");
    let huge = "x".repeat(MAX_ARGS_BYTES + 100);
    std::fs::write(dir.path().join("42/cmdline"), &huge).unwrap();
    let args = fs.cmdline(42).unwrap();
    assert_eq!(args[0].len(), MAX_ARGS_BYTES);
}

#[test]
fn reads_our_own_process_in_the_real_proc() {
    let fs = ProcFs::real();
    assert!(fs.is_real());
    let me = std::process::id() as i32;
    assert!(fs.pids().unwrap().contains(&me));
    assert!(!fs.cmdline(me).unwrap().is_empty());
    assert!(fs.environ(me).is_ok());
    assert!(!fs.cgroups(me).unwrap().is_empty());
    assert_eq!(fs.stat(me).unwrap().pid, me);
    assert!(fs.status(me).unwrap().nspid.is_some());
    assert!(!fs.threads(me, 512).unwrap().is_empty());
    assert!(fs.fd_count(me).unwrap() >= 3);
    // A listening socket of ours is found by the fd scan and in our namespace's table.
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let table = fs.tcp_table(me).unwrap();
    let entry = table
        .iter()
        .find(|e| e.local == format!("127.0.0.1:{port}"))
        .expect("our listener in net/tcp");
    assert!(fs
        .socket_inodes(me)
        .unwrap()
        .socket_inodes
        .contains(&entry.inode));
    let net = fs.ns_inode(me, "net").unwrap();
    assert_eq!(fs.own_ns_inode("net").unwrap(), net);
    assert!(fs.open_netns(me).is_ok());
    assert!(fs.boot_time_ms().is_some());
    // The test binary is not Python, and is ours.
    assert!(!fs.maps_mention(me, "libpython").unwrap());
    assert!(fs.exe(me).is_ok());
    assert_eq!(fs.owner_uid(me).unwrap(), nix::unistd::geteuid().as_raw());
    assert!(!fs.cmdline_bytes(me, 1 << 20).unwrap().is_empty());
}

#[test]
fn pid_entries_list_pids_with_their_directory_inodes() {
    use std::os::unix::fs::MetadataExt;
    let dir = fake_tree();
    let fs = ProcFs::new(dir.path());
    for d in ["7", "0042", "99999999999", "-3"] {
        std::fs::create_dir_all(dir.path().join(d)).unwrap();
    }
    let entries = fs.pid_entries().unwrap();
    let pids: Vec<i32> = entries.iter().map(|e| e.pid).collect();
    assert_eq!(pids, vec![7, 42], "names that are not pids are skipped");
    let ino = std::fs::metadata(dir.path().join("42")).unwrap().ino();
    assert_eq!(entries[1].ino, ino);
    // a new directory at the same name (a new process at a reused pid): a new inode
    std::fs::rename(dir.path().join("42"), dir.path().join("old")).unwrap();
    std::fs::create_dir_all(dir.path().join("42")).unwrap();
    let again = fs.pid_entries().unwrap();
    assert_ne!(again[1].ino, ino);
    assert!(ProcFs::new(dir.path().join("absent"))
        .pid_entries()
        .is_err());
    assert!(fs.readable().is_ok());
    let absent = ProcFs::new(dir.path().join("absent")).readable();
    assert!(absent.is_err_and(|e| e.is_vanished()));
}

#[test]
fn pid_entries_of_the_real_proc_match_its_listing() {
    let fs = ProcFs::real();
    let me = std::process::id() as i32;
    let entries = fs.pid_entries().unwrap();
    let mine = entries.iter().find(|e| e.pid == me).expect("our own pid");
    assert_ne!(mine.ino, 0);
    let again = fs.pid_entries().unwrap();
    assert_eq!(again.iter().find(|e| e.pid == me), Some(mine), "stable");
    assert!(entries.windows(2).all(|w| w[0].pid < w[1].pid));
}
