//! TCP sockets through netlink sock_diag with tcp_info, mapped to processes by inode.
//!
//! Three parts:
//! - the kernel dump (`dump_netlink`, IPv4 + IPv6, all states, `INET_DIAG_INFO`), per network
//!   namespace (`dump_in_netns` enters a component's namespace on a dedicated thread), with a
//!   `/proc/PID/net/tcp{,6}` fallback that has no tcp_info;
//! - [`InodeMap`]: socket inode -> owning pid from `/proc/PID/fd`, cached between samples and
//!   refreshed only when unknown inodes appear, and then only over the candidate pids;
//! - [`classify`]: a pure function of a [`Topology`] and a [`SocketTable`] that says which
//!   sockets each component listens on, accepts, or opens to another component, and the
//!   edges (with connection counts) this implies.

use crate::clock::Clock;
use crate::model::{
    Edge, EdgeOrigin, Payload, Sample, SocketEntry, SocketTable, SourceKind, SourceStatus, TcpInfo,
    TcpState, Topology,
};
use crate::sources::{BoxFuture, Source};
use netlink_packet_core::{
    NetlinkHeader, NetlinkMessage, NetlinkPayload, NLM_F_DUMP, NLM_F_REQUEST,
};
use netlink_packet_sock_diag::inet::nlas::Nla;
use netlink_packet_sock_diag::inet::{ExtensionFlags, InetRequest, SocketId, StateFlags};
use netlink_packet_sock_diag::{SockDiagMessage, AF_INET, AF_INET6, IPPROTO_TCP};
use netlink_sys::{protocols::NETLINK_SOCK_DIAG, Socket, SocketAddr};
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::os::unix::fs::MetadataExt;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

// ---------------------------------------------------------------------------------------
// kernel dump

/// Netlink message types (include/uapi/linux/netlink.h).
const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
/// Size of `struct inet_diag_msg`.
const INET_DIAG_MSG_LEN: usize = 72;

/// What one dump of one namespace produced.
#[derive(Debug, Default)]
pub struct Dump {
    pub sockets: Vec<SocketEntry>,
    /// Messages the crate could not decode (kept from the raw header, without tcp_info).
    pub undecoded: u32,
}

/// Dumps every TCP socket (IPv4 and IPv6, all states) of the calling thread's network
/// namespace with tcp_info. Blocking; bounded by `timeout`.
pub fn dump_netlink(timeout: Duration) -> Result<Dump, String> {
    dump_netlink_states(timeout, true)
}

/// As [`dump_netlink`]; without TIME_WAIT sockets (the kernel skips them) unless asked.
pub fn dump_netlink_states(timeout: Duration, time_wait: bool) -> Result<Dump, String> {
    let deadline = Instant::now() + timeout;
    let mut sock = Socket::new(NETLINK_SOCK_DIAG).map_err(|e| format!("netlink socket: {e}"))?;
    sock.bind_auto().map_err(|e| format!("netlink bind: {e}"))?;
    sock.connect(&SocketAddr::new(0, 0))
        .map_err(|e| format!("netlink connect: {e}"))?;
    // Non-blocking so a stuck dump can never hold the thread past the deadline.
    sock.set_non_blocking(true)
        .map_err(|e| format!("netlink non-blocking: {e}"))?;
    // A larger kernel buffer avoids ENOBUFS on 10k+ sockets; best effort.
    let _ = sock.set_rx_buf_sz(1 << 20);
    let mut out = Dump::default();
    let mut buf: Vec<u8> = Vec::with_capacity(256 * 1024);
    for family in [AF_INET, AF_INET6] {
        send_request(&sock, family, time_wait)?;
        'recv: loop {
            buf.clear();
            let n = match sock.recv(&mut buf, 0) {
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    if Instant::now() >= deadline {
                        return Err(format!(
                            "netlink dump timed out after {} ms",
                            timeout.as_millis()
                        ));
                    }
                    std::thread::sleep(Duration::from_micros(200));
                    continue;
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(format!("netlink recv: {e}")),
            };
            let data = &buf[..n.min(buf.len())];
            let mut off = 0usize;
            while off + 16 <= data.len() {
                let len = read_u32_ne(data, off) as usize;
                let ty = read_u16_ne(data, off + 4);
                if len < 16 || off + len > data.len() {
                    return Err(format!("malformed netlink message (length {len})"));
                }
                let msg = &data[off..off + len];
                match ty {
                    NLMSG_DONE => break 'recv,
                    NLMSG_ERROR => {
                        let code = if len >= 20 {
                            read_u32_ne(msg, 16) as i32
                        } else {
                            0
                        };
                        return Err(format!(
                            "netlink error {}",
                            std::io::Error::from_raw_os_error(-code)
                        ));
                    }
                    _ => decode_message(msg, &mut out),
                }
                off += (len + 3) & !3;
            }
            if Instant::now() >= deadline {
                return Err(format!(
                    "netlink dump timed out after {} ms",
                    timeout.as_millis()
                ));
            }
        }
    }
    Ok(out)
}

fn send_request(sock: &Socket, family: u8, time_wait: bool) -> Result<(), String> {
    let mut hdr = NetlinkHeader::default();
    hdr.flags = NLM_F_REQUEST | NLM_F_DUMP;
    let socket_id = if family == AF_INET {
        SocketId::new_v4()
    } else {
        SocketId::new_v6()
    };
    let mut pkt = NetlinkMessage::new(
        hdr,
        SockDiagMessage::InetRequest(InetRequest {
            family,
            protocol: IPPROTO_TCP,
            extensions: ExtensionFlags::INFO,
            states: if time_wait {
                StateFlags::all()
            } else {
                StateFlags::all() & !StateFlags::TIME_WAIT
            },
            socket_id,
        })
        .into(),
    );
    pkt.finalize();
    let mut req = vec![0u8; pkt.buffer_len()];
    pkt.serialize(&mut req);
    sock.send(&req, 0)
        .map_err(|e| format!("netlink send: {e}"))?;
    Ok(())
}

fn read_u32_ne(b: &[u8], off: usize) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[off..off + 4]);
    u32::from_ne_bytes(a)
}

fn read_u16_ne(b: &[u8], off: usize) -> u16 {
    u16::from_ne_bytes([b[off], b[off + 1]])
}

fn decode_message(msg: &[u8], out: &mut Dump) {
    match NetlinkMessage::<SockDiagMessage>::deserialize(msg) {
        Ok(m) => {
            if let NetlinkPayload::InnerMessage(SockDiagMessage::InetResponse(r)) = m.payload {
                let h = &r.header;
                let tcp_info = r.nlas.iter().find_map(|n| match n {
                    Nla::TcpInfo(ti) => Some(TcpInfo {
                        bytes_acked: ti.bytes_acked,
                        bytes_received: ti.bytes_received,
                        bytes_sent: ti.bytes_sent,
                        last_data_sent_ms: ti.last_data_sent,
                        last_data_recv_ms: ti.last_data_recv,
                        last_ack_recv_ms: ti.last_ack_recv,
                        rtt_us: ti.rtt,
                        retransmits: ti.total_retrans,
                        unacked: ti.unacked,
                    }),
                    _ => None,
                });
                out.sockets.push(SocketEntry {
                    local: fmt_addr(h.socket_id.source_address, h.socket_id.source_port),
                    remote: fmt_addr(
                        h.socket_id.destination_address,
                        h.socket_id.destination_port,
                    ),
                    state: TcpState::from_kernel(h.state),
                    rx_queue: h.recv_queue,
                    tx_queue: h.send_queue,
                    inode: u64::from(h.inode),
                    uid: h.uid,
                    pid: None,
                    netns: None,
                    tcp_info,
                });
            }
        }
        Err(_) => {
            // The crate rejects a whole message when e.g. the kernel's tcp_info is shorter
            // than its struct; the fixed header still tells us the socket.
            out.undecoded += 1;
            if let Some(e) = decode_raw_header(&msg[16..]) {
                out.sockets.push(e);
            }
        }
    }
}

/// `struct inet_diag_msg` by hand (fallback when the crate cannot decode a message).
fn decode_raw_header(b: &[u8]) -> Option<SocketEntry> {
    if b.len() < INET_DIAG_MSG_LEN {
        return None;
    }
    let family = b[0];
    let sport = u16::from_be_bytes([b[4], b[5]]);
    let dport = u16::from_be_bytes([b[6], b[7]]);
    let addr = |o: usize| -> IpAddr {
        if family == AF_INET {
            IpAddr::V4(Ipv4Addr::new(b[o], b[o + 1], b[o + 2], b[o + 3]))
        } else {
            let mut a = [0u8; 16];
            a.copy_from_slice(&b[o..o + 16]);
            IpAddr::V6(Ipv6Addr::from(a))
        }
    };
    Some(SocketEntry {
        local: fmt_addr(addr(8), sport),
        remote: fmt_addr(addr(24), dport),
        state: TcpState::from_kernel(b[1]),
        rx_queue: read_u32_ne(b, 56),
        tx_queue: read_u32_ne(b, 60),
        inode: u64::from(read_u32_ne(b, 68)),
        uid: read_u32_ne(b, 64),
        pid: None,
        netns: None,
        tcp_info: None,
    })
}

/// `ip:port`, IPv6 as `[ip]:port` (the model's convention).
pub fn fmt_addr(ip: IpAddr, port: u16) -> String {
    match ip {
        IpAddr::V4(a) => format!("{a}:{port}"),
        IpAddr::V6(a) => format!("[{a}]:{port}"),
    }
}

/// Splits an `ip:port` / `[ip]:port` string; IPv4-mapped IPv6 becomes IPv4.
pub fn parse_addr(s: &str) -> Option<(IpAddr, u16)> {
    let (ip, port) = s.rsplit_once(':')?;
    let ip = ip.trim_start_matches('[').trim_end_matches(']');
    let ip: IpAddr = ip.parse().ok()?;
    Some((ip.to_canonical(), port.parse().ok()?))
}

/// Reads `/proc/PID/net/tcp` and `tcp6` (the namespace of PID): no tcp_info, but works
/// without entering the namespace.
pub fn read_proc_net_tcp(pid: i32) -> Result<Vec<SocketEntry>, String> {
    let mut out = Vec::new();
    for (file, v6) in [("tcp", false), ("tcp6", true)] {
        let path = format!("/proc/{pid}/net/{file}");
        let text = match std::fs::read_to_string(&path) {
            Ok(t) => t,
            // tcp6 is absent when IPv6 is disabled.
            Err(e) if v6 && e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(format!("{path}: {e}")),
        };
        out.extend(
            text.lines()
                .skip(1)
                .filter_map(|l| parse_proc_net_line(l, v6)),
        );
    }
    Ok(out)
}

fn parse_proc_net_line(line: &str, v6: bool) -> Option<SocketEntry> {
    let f: Vec<&str> = line.split_whitespace().collect();
    if f.len() < 10 {
        return None;
    }
    let local = parse_hex_addr(f[1], v6)?;
    let remote = parse_hex_addr(f[2], v6)?;
    let state = u8::from_str_radix(f[3], 16).ok()?;
    let (tx, rx) = f[4].split_once(':')?;
    Some(SocketEntry {
        local,
        remote,
        state: TcpState::from_kernel(state),
        rx_queue: u32::from_str_radix(rx, 16).ok()?,
        tx_queue: u32::from_str_radix(tx, 16).ok()?,
        inode: f[9].parse().ok()?,
        uid: f[7].parse().ok()?,
        pid: None,
        netns: None,
        tcp_info: None,
    })
}

/// `0100007F:1F90` (address words in host byte order, port big-endian hex).
fn parse_hex_addr(s: &str, v6: bool) -> Option<String> {
    let (a, p) = s.split_once(':')?;
    let port = u16::from_str_radix(p, 16).ok()?;
    let ip = if v6 {
        if a.len() != 32 {
            return None;
        }
        let mut bytes = [0u8; 16];
        for i in 0..4 {
            let w = u32::from_str_radix(a.get(i * 8..i * 8 + 8)?, 16).ok()?;
            bytes[i * 4..i * 4 + 4].copy_from_slice(&w.to_ne_bytes());
        }
        IpAddr::V6(Ipv6Addr::from(bytes))
    } else {
        let w = u32::from_str_radix(a, 16).ok()?;
        IpAddr::V4(Ipv4Addr::from(w.to_ne_bytes()))
    };
    Some(fmt_addr(ip, port))
}

/// Inode of a network namespace (`/proc/PID/ns/net`; `self` for ours).
pub fn netns_of(pid: Option<i32>) -> Result<u64, std::io::Error> {
    let path = match pid {
        Some(p) => format!("/proc/{p}/ns/net"),
        None => "/proc/self/ns/net".to_string(),
    };
    std::fs::metadata(path).map(|m| m.ino())
}

/// Dumps the network namespace of `pid` by entering it on a dedicated thread (the calling
/// thread keeps its namespace). Needs CAP_SYS_ADMIN over the target namespace.
pub fn dump_in_netns(pid: i32, timeout: Duration) -> Result<Dump, String> {
    dump_in_netns_states(pid, timeout, true)
}

/// As [`dump_in_netns`]; without TIME_WAIT sockets unless asked.
pub fn dump_in_netns_states(pid: i32, timeout: Duration, time_wait: bool) -> Result<Dump, String> {
    let path = format!("/proc/{pid}/ns/net");
    let ns = std::fs::File::open(&path).map_err(|e| format!("{path}: {e}"))?;
    let handle = std::thread::Builder::new()
        .name("ww-netns".into())
        .spawn(move || -> Result<Dump, String> {
            nix::sched::setns(&ns, nix::sched::CloneFlags::CLONE_NEWNET)
                .map_err(|e| format!("setns into {path}: {e}"))?;
            dump_netlink_states(timeout, time_wait)
        })
        .map_err(|e| format!("spawn netns thread: {e}"))?;
    handle
        .join()
        .map_err(|_| "netns dump thread panicked".to_string())?
}

// ---------------------------------------------------------------------------------------
// inode -> pid

/// Which processes may own the sockets we care about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scope {
    /// Every process (`ss -p` style); used when there is no topology yet.
    All,
    /// Only these pids (the topology's): a fraction of the fds to read. `ports` are the
    /// topology's listen ports: an unknown socket touching one of them (an accepted
    /// connection, a hop to another component) makes every pid be rescanned; any other
    /// unknown socket only makes pids whose fd count changed be rescanned, so connection
    /// churn elsewhere on the box does not cost a rescan per tick. Empty `ports`: every
    /// socket counts as relevant.
    Pids { pids: Vec<i32>, ports: Vec<u16> },
}

/// Counters of one [`InodeMap::resolve`] call (for the bench and the doctor).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ResolveStats {
    pub pids_scanned: u32,
    pub fds_read: u64,
    /// Inodes that were unknown before this call.
    pub unknown_before: u32,
    /// Inodes still without an owner (not in scope, or unreadable).
    pub unresolved: u32,
    /// Per-pid problems (permission denied, vanished).
    pub errors: Vec<String>,
}

/// Cached socket inode -> owning pid map, refreshed incrementally (see [`Scope`]): a
/// `resolve` call reads `/proc/PID/fd` only when the table holds inodes it has never seen;
/// inodes looked for and not found are remembered as foreign until the scope changes, so
/// sockets of unrelated processes do not force a rescan every tick.
#[derive(Debug, Default)]
pub struct InodeMap {
    owners: HashMap<u64, i32>,
    foreign: HashSet<u64>,
    scope: Option<Scope>,
    /// Open fd count of each pid at its last scan (`st_size` of `/proc/PID/fd`, Linux >= 6.2;
    /// 0 on older kernels, where only relevant sockets trigger rescans).
    fd_counts: HashMap<i32, u64>,
}

fn fd_count(pid: i32) -> Option<u64> {
    std::fs::metadata(format!("/proc/{pid}/fd"))
        .ok()
        .map(|m| m.len())
}

impl InodeMap {
    pub fn new() -> Self {
        InodeMap::default()
    }

    /// Number of inodes with a known owner.
    pub fn len(&self) -> usize {
        self.owners.len()
    }

    pub fn is_empty(&self) -> bool {
        self.owners.is_empty()
    }

    /// Forgets everything (the next resolve is a cold one).
    pub fn clear(&mut self) {
        *self = InodeMap::default();
    }

    /// Fills `pid` of every socket whose inode an in-scope process holds.
    pub fn resolve(&mut self, sockets: &mut [SocketEntry], scope: &Scope) -> ResolveStats {
        let mut stats = ResolveStats::default();
        if self.scope.as_ref() != Some(scope) {
            // A new pid may own what we called foreign.
            self.foreign.clear();
            self.scope = Some(scope.clone());
        }
        let ports: HashSet<u16> = match scope {
            Scope::Pids { ports, .. } => ports.iter().copied().collect(),
            Scope::All => HashSet::new(),
        };
        let mut present: HashSet<u64> = HashSet::with_capacity(sockets.len());
        let mut unknown: Vec<u64> = Vec::new();
        let mut relevant_unknown = false;
        for s in sockets.iter() {
            if s.inode == 0 || !present.insert(s.inode) {
                continue;
            }
            if !self.owners.contains_key(&s.inode) && !self.foreign.contains(&s.inode) {
                unknown.push(s.inode);
                relevant_unknown |= ports.is_empty()
                    || s.local_port().is_some_and(|p| ports.contains(&p))
                    || s.remote_port().is_some_and(|p| ports.contains(&p));
            }
        }
        stats.unknown_before = unknown.len() as u32;
        if !unknown.is_empty() {
            let pids: Vec<i32> = match scope {
                Scope::All => all_pids(),
                Scope::Pids { pids, .. } => {
                    let mut p = pids.clone();
                    p.sort_unstable();
                    p.dedup();
                    self.fd_counts.retain(|k, _| p.contains(k));
                    if relevant_unknown {
                        p
                    } else {
                        p.into_iter()
                            .filter(|pid| fd_count(*pid) != self.fd_counts.get(pid).copied())
                            .collect()
                    }
                }
            };
            for (pid, result) in scan_many(&pids) {
                match result {
                    Ok((n, found, count)) => {
                        stats.pids_scanned += 1;
                        stats.fds_read += n;
                        if let Some(c) = count {
                            self.fd_counts.insert(pid, c);
                        }
                        for ino in found {
                            self.owners.entry(ino).or_insert(pid);
                        }
                    }
                    Err(e) => {
                        // Other users' processes are expected to be unreadable in `All`.
                        if matches!(scope, Scope::Pids { .. }) {
                            stats.errors.push(e);
                        }
                    }
                }
            }
            for i in unknown {
                if !self.owners.contains_key(&i) {
                    self.foreign.insert(i);
                }
            }
        }
        // Bound memory: keep only what the current table holds.
        if self.owners.len() + self.foreign.len() > present.len() {
            self.owners.retain(|i, _| present.contains(i));
            self.foreign.retain(|i| present.contains(i));
        }
        for s in sockets.iter_mut() {
            s.pid = self.owners.get(&s.inode).copied();
            if s.pid.is_none() && s.inode != 0 {
                stats.unresolved += 1;
            }
        }
        stats
    }
}

fn all_pids() -> Vec<i32> {
    let mut pids: Vec<i32> = match std::fs::read_dir("/proc") {
        Ok(rd) => rd
            .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
            .collect(),
        Err(_) => Vec::new(),
    };
    pids.sort_unstable();
    pids
}

/// Scans the fds of many pids on a few threads (the scan is syscall-bound: one readlinkat
/// per fd). Results come back in `pids` order, so "first owner wins" stays deterministic.
type ScanResult = Result<(u64, Vec<u64>, Option<u64>), String>;

fn scan_many(pids: &[i32]) -> Vec<(i32, ScanResult)> {
    let threads = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
        .clamp(1, 4);
    if threads == 1 || pids.len() < 8 {
        return pids.iter().map(|&p| (p, scan_fds(p))).collect();
    }
    let chunk = pids.len().div_ceil(threads);
    std::thread::scope(|s| {
        let handles: Vec<_> = pids
            .chunks(chunk)
            .map(|part| s.spawn(move || part.iter().map(|&p| (p, scan_fds(p))).collect::<Vec<_>>()))
            .collect();
        let mut out = Vec::with_capacity(pids.len());
        for (h, part) in handles.into_iter().zip(pids.chunks(chunk)) {
            match h.join() {
                Ok(v) => out.extend(v),
                Err(_) => out.extend(
                    part.iter()
                        .map(|&p| (p, Err(format!("pid {p}: fd scan thread panicked")))),
                ),
            }
        }
        out
    })
}

/// Reads every fd link of `pid` (one readlinkat per fd, relative to the open fd directory:
/// procfs' `FDInfo` does open+readlink+stat+close per fd, 4x the syscalls) and returns the
/// number of fds read, the `socket:[N]` inodes and the fd count taken before the scan.
fn scan_fds(pid: i32) -> ScanResult {
    let count = fd_count(pid);
    let dir_path = format!("/proc/{pid}/fd");
    let dir = std::fs::File::open(&dir_path).map_err(|e| format!("{dir_path}: {e}"))?;
    let rd = std::fs::read_dir(&dir_path).map_err(|e| format!("{dir_path}: {e}"))?;
    let mut n = 0u64;
    let mut found = Vec::new();
    for entry in rd.flatten() {
        let name = entry.file_name();
        let Ok(target) = nix::fcntl::readlinkat(&dir, name.as_os_str()) else {
            continue; // closed between readdir and readlink
        };
        n += 1;
        let t = target.as_encoded_bytes();
        if let Some(rest) = t.strip_prefix(b"socket:[") {
            if let Some(num) = rest.strip_suffix(b"]") {
                if let Some(ino) = std::str::from_utf8(num).ok().and_then(|s| s.parse().ok()) {
                    found.push(ino);
                }
            }
        }
    }
    Ok((n, found, count))
}

// ---------------------------------------------------------------------------------------
// the table of one sample

/// Options of the socket source.
#[derive(Debug, Clone)]
pub struct SocketConfig {
    /// Hard limit for one sample (dump of every namespace + inode mapping).
    pub timeout: Duration,
    /// Keep every socket on the box, not only the topology's (the default keeps sockets of
    /// topology pids and sockets touching a component's listen port).
    pub keep_all: bool,
    /// How often [`SocketSource`] lists TIME_WAIT sockets; between, it repeats the last
    /// list. Under connection churn they are most of the table (every closed connection
    /// for a minute, ~95 % of the lab's under load) and say nothing new at 4 Hz: closed,
    /// no owner, no tcp_info. Zero: every sample.
    pub time_wait_every: Duration,
}

impl Default for SocketConfig {
    fn default() -> Self {
        SocketConfig {
            timeout: Duration::from_millis(2000),
            keep_all: false,
            time_wait_every: Duration::from_secs(5),
        }
    }
}

/// Builds the socket table for a topology: dumps our namespace and every other namespace a
/// component lives in, maps inodes to pids, keeps the relevant sockets. Blocking. Returns
/// the table and the status (degraded with the reasons when something was not possible).
pub fn build_table(
    map: &mut InodeMap,
    topo: &Topology,
    cfg: &SocketConfig,
) -> (SocketTable, SourceStatus) {
    build_table_states(map, topo, cfg, true)
}

/// As [`build_table`]; TIME_WAIT sockets only when `time_wait`.
pub fn build_table_states(
    map: &mut InodeMap,
    topo: &Topology,
    cfg: &SocketConfig,
    time_wait: bool,
) -> (SocketTable, SourceStatus) {
    let start = Instant::now();
    let mut table = SocketTable::default();
    let mut problems: Vec<String> = Vec::new();
    let own_ns = netns_of(None).ok();
    let pids: BTreeSet<i32> = topo
        .components
        .iter()
        .flat_map(|c| c.pids.iter().copied())
        .collect();

    // Group the topology's pids by network namespace.
    let mut foreign_ns: BTreeMap<u64, i32> = BTreeMap::new();
    let mut live_pids: Vec<i32> = Vec::new();
    for &pid in &pids {
        match netns_of(Some(pid)) {
            Ok(ns) => {
                live_pids.push(pid);
                if Some(ns) != own_ns {
                    foreign_ns.entry(ns).or_insert(pid);
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                problems.push(format!("pid {pid} vanished"));
            }
            Err(e) => {
                live_pids.push(pid);
                problems.push(format!("pid {pid}: cannot read its network namespace: {e}"));
            }
        }
    }

    match dump_netlink_states(cfg.timeout, time_wait) {
        Ok(d) => {
            if d.undecoded > 0 {
                table.notes.push(format!(
                    "{} sock_diag messages could not be decoded; their tcp_info is missing",
                    d.undecoded
                ));
            }
            table.sockets.extend(d.sockets);
        }
        Err(e) => {
            problems.push(format!(
                "sock_diag failed ({e}); used /proc/net/tcp without tcp_info"
            ));
            match read_proc_net_tcp_self() {
                Ok(s) => table.sockets.extend(s),
                Err(e2) => {
                    return (
                        table,
                        SourceStatus::unavailable(format!("sock_diag: {e}; /proc/net/tcp: {e2}")),
                    )
                }
            }
        }
    }

    for (ns, pid) in &foreign_ns {
        let remaining = cfg.timeout.saturating_sub(start.elapsed());
        let mut entries = match dump_in_netns_states(*pid, remaining, time_wait) {
            Ok(d) => {
                table.notes.push(format!(
                    "netns {ns} (pid {pid}): sampled inside the namespace with tcp_info"
                ));
                d.sockets
            }
            Err(e) => match read_proc_net_tcp(*pid) {
                Ok(s) => {
                    let note = format!(
                        "netns {ns} (pid {pid}): could not enter ({e}); read /proc/{pid}/net/tcp without tcp_info"
                    );
                    table.notes.push(note.clone());
                    problems.push(note);
                    s
                }
                Err(e2) => {
                    problems.push(format!("netns {ns} (pid {pid}): {e}; {e2}"));
                    continue;
                }
            },
        };
        for s in &mut entries {
            s.netns = Some(*ns);
        }
        table.sockets.extend(entries);
    }

    let mut listen_ports: Vec<u16> = topo
        .components
        .iter()
        .flat_map(|c| c.listen_ports())
        .collect();
    listen_ports.sort_unstable();
    listen_ports.dedup();
    let scope = if pids.is_empty() {
        Scope::All
    } else {
        Scope::Pids {
            pids: live_pids,
            ports: listen_ports,
        }
    };
    let stats = map.resolve(&mut table.sockets, &scope);
    for e in stats.errors {
        problems.push(format!("cannot map sockets to pids: {e}"));
    }

    if !cfg.keep_all && !pids.is_empty() {
        let ports: HashSet<u16> = topo
            .components
            .iter()
            .flat_map(|c| c.listen_ports())
            .collect();
        table.sockets.retain(|s| {
            s.pid.is_some_and(|p| pids.contains(&p))
                || s.local_port().is_some_and(|p| ports.contains(&p))
                || s.remote_port().is_some_and(|p| ports.contains(&p))
        });
    }

    let status = if problems.is_empty() {
        SourceStatus::ok()
    } else {
        SourceStatus::degraded(problems.join("; "))
    };
    (table, status)
}

fn read_proc_net_tcp_self() -> Result<Vec<SocketEntry>, String> {
    read_proc_net_tcp(std::process::id() as i32)
}

// ---------------------------------------------------------------------------------------
// classification

/// What a socket is to the component that holds it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum SocketClass {
    Listening,
    /// Accepted on one of the component's listen ports (a client or an upstream hop).
    Inbound,
    /// Opened to another component of the topology (its id).
    Outbound {
        to: String,
    },
    Other,
}

/// One component's sockets, classified.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ComponentSockets {
    /// (index into `SocketTable::sockets`, class).
    pub sockets: Vec<(usize, SocketClass)>,
    /// Counts by state name (`ESTABLISHED`, `CLOSE_WAIT`, `TIME_WAIT`, ...).
    pub by_state: BTreeMap<String, u32>,
    pub listening: u32,
    pub inbound: u32,
    pub outbound: u32,
    pub other: u32,
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct Classification {
    /// By component id.
    pub components: BTreeMap<String, ComponentSockets>,
    /// from -> to with the number of ESTABLISHED connections (origin `Sockets`).
    pub edges: Vec<Edge>,
}

fn is_unspecified(ip: &IpAddr) -> bool {
    ip.is_unspecified()
}

/// Whether `listen` (a component's `ip:port`) accepts a connection to `ip:port`.
fn listen_matches(listen: &str, ip: &IpAddr, port: u16) -> bool {
    match parse_addr(listen) {
        Some((lip, lport)) => {
            lport == port
                && (lip == *ip || is_unspecified(&lip) || (lip.is_loopback() && ip.is_loopback()))
        }
        // A listen entry without a parseable ip (e.g. `*:8000`): match the port.
        None => {
            listen
                .rsplit(':')
                .next()
                .and_then(|p| p.parse::<u16>().ok())
                == Some(port)
        }
    }
}

/// The component a remote address points at (by its listen addresses).
fn component_at(topo: &Topology, addr: &str, except: &str) -> Option<String> {
    let (ip, port) = parse_addr(addr)?;
    topo.components
        .iter()
        .filter(|c| c.id != except)
        .find(|c| c.listen.iter().any(|l| listen_matches(l, &ip, port)))
        .map(|c| c.id.clone())
}

/// Classifies every socket of every component (pure: usable on recorded samples).
///
/// A socket belongs to the most specific component of its pid; a socket without a pid
/// (TIME_WAIT, or an unmapped owner) belongs to the component whose listen port it is on.
pub fn classify(topo: &Topology, table: &SocketTable) -> Classification {
    let mut out = Classification::default();
    let mut edge_counts: BTreeMap<(String, String), u32> = BTreeMap::new();
    for (idx, s) in table.sockets.iter().enumerate() {
        let Some((lip, lport)) = parse_addr(&s.local) else {
            continue;
        };
        let owner = match s.pid {
            Some(pid) => topo.component_of_pid(pid).map(|c| c.id.clone()),
            None => topo
                .components
                .iter()
                .find(|c| c.listen.iter().any(|l| listen_matches(l, &lip, lport)))
                .map(|c| c.id.clone()),
        };
        let Some(owner) = owner else { continue };
        let Some(comp) = topo.component(&owner) else {
            continue;
        };
        let listens_here = comp.listen.iter().any(|l| listen_matches(l, &lip, lport))
            || comp.listen_ports().contains(&lport);
        let class = if s.state == TcpState::Listen {
            SocketClass::Listening
        } else if listens_here {
            SocketClass::Inbound
        } else if let Some(to) = component_at(topo, &s.remote, &owner) {
            SocketClass::Outbound { to }
        } else {
            SocketClass::Other
        };
        let entry = out.components.entry(owner.clone()).or_default();
        *entry
            .by_state
            .entry(s.state.as_str().to_string())
            .or_insert(0) += 1;
        match &class {
            SocketClass::Listening => entry.listening += 1,
            SocketClass::Inbound => entry.inbound += 1,
            SocketClass::Outbound { to } => {
                entry.outbound += 1;
                if s.state == TcpState::Established {
                    *edge_counts.entry((owner.clone(), to.clone())).or_insert(0) += 1;
                }
            }
            SocketClass::Other => entry.other += 1,
        }
        entry.sockets.push((idx, class));
    }
    out.edges = edge_counts
        .into_iter()
        .map(|((from, to), n)| Edge {
            from,
            to,
            origin: EdgeOrigin::Sockets,
            connections: Some(n),
        })
        .collect();
    out
}

/// Merges the classification's edges into the topology: new edges are added, existing ones
/// get the current count, socket-learnt edges with no connection now read 0 (not removed:
/// "used to talk, now silent" is worth seeing).
pub fn apply_edges(topo: &mut Topology, c: &Classification) {
    for e in &c.edges {
        topo.upsert_edge(e.clone());
    }
    for e in topo.edges.iter_mut() {
        let seen = c.edges.iter().any(|n| n.from == e.from && n.to == e.to);
        if !seen && (e.origin == EdgeOrigin::Sockets || e.connections.is_some()) {
            e.connections = Some(0);
        }
    }
}

// ---------------------------------------------------------------------------------------
// the source

/// The sockets source: netlink dump per namespace + cached inode map, under a hard timeout.
#[derive(Debug, Clone)]
pub struct SocketSource {
    cfg: SocketConfig,
    map: Arc<Mutex<InodeMap>>,
    time_wait: Arc<Mutex<TimeWaitList>>,
}

/// The TIME_WAIT sockets of the last sample that listed them.
#[derive(Debug, Default)]
struct TimeWaitList {
    listed_at: Option<Instant>,
    sockets: Vec<SocketEntry>,
}

/// Said in a table whose TIME_WAIT sockets are repeated from an earlier sample.
pub const TIME_WAIT_REPEATED: &str =
    "TIME_WAIT sockets as of the last sample that listed them (listed every few seconds)";

impl SocketSource {
    pub fn new(cfg: SocketConfig) -> Self {
        SocketSource {
            cfg,
            map: Arc::new(Mutex::new(InodeMap::new())),
            time_wait: Arc::new(Mutex::new(TimeWaitList::default())),
        }
    }
}

/// One sample: TIME_WAIT sockets listed when due, else repeated from the last listing.
fn sample_table(
    map: &mut InodeMap,
    tw: &mut TimeWaitList,
    topo: &Topology,
    cfg: &SocketConfig,
) -> (SocketTable, SourceStatus) {
    let due = tw
        .listed_at
        .is_none_or(|t| t.elapsed() >= cfg.time_wait_every);
    let (mut table, status) = build_table_states(map, topo, cfg, due);
    if due {
        if status.status != crate::model::Status::Unavailable {
            tw.sockets = table
                .sockets
                .iter()
                .filter(|e| e.state == TcpState::TimeWait)
                .cloned()
                .collect();
            tw.listed_at = Some(Instant::now());
        }
    } else if status.status != crate::model::Status::Unavailable {
        table.sockets.extend(tw.sockets.iter().cloned());
        table.notes.push(TIME_WAIT_REPEATED.to_string());
    }
    (table, status)
}

impl Source for SocketSource {
    fn kind(&self) -> SourceKind {
        SourceKind::Sockets
    }

    fn sample<'a>(&'a self, topo: &'a Topology, clock: &'a dyn Clock) -> BoxFuture<'a, Sample> {
        Box::pin(async move {
            let t_ms = clock.now_ms();
            let start = Instant::now();
            let map = Arc::clone(&self.map);
            let time_wait = Arc::clone(&self.time_wait);
            let topo_owned = topo.clone();
            let cfg = self.cfg.clone();
            let work = tokio::task::spawn_blocking(move || {
                // try_lock: a previous sample that overran its timeout still holds the map;
                // do not queue up behind it.
                match (map.try_lock(), time_wait.try_lock()) {
                    (Ok(mut m), Ok(mut tw)) => sample_table(&mut m, &mut tw, &topo_owned, &cfg),
                    _ => (
                        SocketTable::default(),
                        SourceStatus::unavailable(
                            "previous socket sample still running (overran its timeout)",
                        ),
                    ),
                }
            });
            // Grace above the config timeout: the blocking dump enforces it itself.
            let limit = self.cfg.timeout + Duration::from_millis(500);
            let (table, status) = match tokio::time::timeout(limit, work).await {
                Ok(Ok(r)) => r,
                Ok(Err(e)) => (
                    SocketTable::default(),
                    SourceStatus::unavailable(format!("socket sampler task failed: {e}")),
                ),
                Err(_) => (
                    SocketTable::default(),
                    SourceStatus::unavailable(format!(
                        "socket sample timed out after {} ms",
                        limit.as_millis()
                    )),
                ),
            };
            Sample {
                t_ms,
                status,
                took_ms: start.elapsed().as_millis() as u64,
                payload: Payload::Sockets(table),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_proc_net_lines() {
        let l = "   0: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 12345 1 0000000000000000 100 0 0 10 0";
        let e = parse_proc_net_line(l, false).unwrap();
        assert_eq!(e.local, "127.0.0.1:8080");
        assert_eq!(e.remote, "0.0.0.0:0");
        assert_eq!(e.state, TcpState::Listen);
        assert_eq!(e.inode, 12345);
        let l6 = "   0: 00000000000000000000000001000000:1F90 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 777 1";
        let e = parse_proc_net_line(l6, true).unwrap();
        assert_eq!(e.local, "[::1]:8080");
        assert!(parse_proc_net_line("garbage", false).is_none());
    }

    fn entry(local: &str, remote: &str, state: TcpState, pid: Option<i32>) -> SocketEntry {
        SocketEntry {
            local: local.into(),
            remote: remote.into(),
            state,
            rx_queue: 0,
            tx_queue: 0,
            inode: 1,
            uid: 0,
            pid,
            netns: None,
            tcp_info: None,
        }
    }

    #[test]
    fn classifies_hand_built_table() {
        use crate::model::{Component, Role};
        let mut proxy = Component::new("proxy", Role::Proxy, "generic");
        proxy.pids = vec![10];
        proxy.listen = vec!["0.0.0.0:8000".into()];
        let mut router = Component::new("router", Role::Router, "sglang");
        router.pids = vec![20];
        router.listen = vec!["127.0.0.1:30000".into()];
        let mut decode = Component::new("decode", Role::Decode, "sglang");
        decode.pids = vec![30];
        decode.listen = vec!["[::]:31012".into()];
        let topo = Topology {
            components: vec![proxy, router, decode],
            edges: vec![],
        };
        let table = SocketTable {
            sockets: vec![
                entry("0.0.0.0:8000", "0.0.0.0:0", TcpState::Listen, Some(10)),
                entry(
                    "127.0.0.1:8000",
                    "127.0.0.1:5000",
                    TcpState::Established,
                    Some(10),
                ),
                entry(
                    "127.0.0.1:40000",
                    "127.0.0.1:30000",
                    TcpState::Established,
                    Some(10),
                ),
                entry(
                    "127.0.0.1:40001",
                    "127.0.0.1:30000",
                    TcpState::CloseWait,
                    Some(10),
                ),
                entry(
                    "127.0.0.1:30000",
                    "127.0.0.1:40000",
                    TcpState::Established,
                    Some(20),
                ),
                entry(
                    "[::ffff:127.0.0.1]:41000",
                    "[::ffff:127.0.0.1]:31012",
                    TcpState::Established,
                    Some(20),
                ),
                entry("127.0.0.1:8000", "127.0.0.1:5001", TcpState::TimeWait, None),
                entry(
                    "10.0.0.5:41000",
                    "10.0.0.9:443",
                    TcpState::Established,
                    Some(20),
                ),
                entry("127.0.0.1:9", "127.0.0.1:10", TcpState::Established, None),
            ],
            notes: vec![],
        };
        let c = classify(&topo, &table);
        let p = &c.components["proxy"];
        assert_eq!((p.listening, p.inbound, p.outbound, p.other), (1, 2, 2, 0));
        assert_eq!(p.by_state["TIME_WAIT"], 1);
        assert_eq!(p.by_state["CLOSE_WAIT"], 1);
        let r = &c.components["router"];
        assert_eq!((r.inbound, r.outbound, r.other), (1, 1, 1));
        assert!(!c.components.contains_key("decode"));
        let edges: Vec<(&str, &str, Option<u32>)> = c
            .edges
            .iter()
            .map(|e| (e.from.as_str(), e.to.as_str(), e.connections))
            .collect();
        // CLOSE_WAIT is not a live connection: one proxy -> router connection.
        assert_eq!(
            edges,
            vec![("proxy", "router", Some(1)), ("router", "decode", Some(1))]
        );
    }

    #[test]
    fn parses_addresses() {
        assert_eq!(
            parse_addr("[::ffff:127.0.0.1]:80"),
            Some(("127.0.0.1".parse().unwrap(), 80))
        );
        assert_eq!(parse_addr("[::1]:80"), Some(("::1".parse().unwrap(), 80)));
        assert!(listen_matches(
            "0.0.0.0:80",
            &"127.0.0.1".parse().unwrap(),
            80
        ));
        assert!(listen_matches(
            "127.0.0.1:80",
            &"127.0.0.2".parse().unwrap(),
            80
        ));
        assert!(!listen_matches(
            "10.0.0.1:80",
            &"127.0.0.1".parse().unwrap(),
            80
        ));
    }
}
