//! The netlink `sock_diag` dump (IPv4 + IPv6, `INET_DIAG_INFO`; decoded by `decode.rs`).
//! Another namespace is dumped from a dedicated thread that enters it. Both families come from
//! one request of the older interface (`TCPDIAG_GETSOCK`): each walk of the kernel's hash
//! costs the same however empty (docs/performance-log.md). A kernel that refuses it is asked
//! once per family from then on.

use super::decode::decode_datagram;
use super::{Dump, RecentDump, SockDiag, SockDiagError};
use crate::sys::ProcFs;
use netlink_packet_core::{NetlinkHeader, NetlinkMessage, NLM_F_DUMP, NLM_F_REQUEST};
use netlink_packet_sock_diag::inet::{ExtensionFlags, InetRequest, SocketId, StateFlags};
use netlink_packet_sock_diag::{SockDiagMessage, AF_INET, AF_INET6, IPPROTO_TCP};
use netlink_sys::{protocols::NETLINK_SOCK_DIAG, Socket, SocketAddr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// `TCPDIAG_GETSOCK` (include/uapi/linux/inet_diag.h): the request of the older interface.
const TCPDIAG_GETSOCK: u16 = 18;
/// `1 << (INET_DIAG_INFO - 1)`: ask for `tcp_info`.
const EXT_INFO: u8 = 1 << 1;
/// `TCPF_TIME_WAIT`.
const STATE_TIME_WAIT: u32 = 1 << 6;
/// Set once this kernel refused the older request: every dump is then by family.
static BOTH_FAMILIES_REFUSED: AtomicBool = AtomicBool::new(false);

/// The kernel's sock_diag; other namespaces are opened through `proc`.
#[derive(Debug, Clone, Default)]
pub struct NetlinkSockDiag {
    pub proc: ProcFs,
    /// Where each dump of our own namespace is offered to another reader (the daemon's
    /// rediscovery), if anyone reads it.
    pub recent: Option<Arc<RecentDump>>,
}

impl SockDiag for NetlinkSockDiag {
    fn dump(&self, timeout: Duration, time_wait: bool) -> Result<Dump, SockDiagError> {
        let taken = Instant::now();
        let dump = dump_netlink(timeout, time_wait)?;
        if let Some(r) = &self.recent {
            r.offer(taken, &dump.sockets);
        }
        Ok(dump)
    }

    fn dump_netns_of(
        &self,
        pid: i32,
        timeout: Duration,
        time_wait: bool,
    ) -> Result<Dump, SockDiagError> {
        let ns = self.proc.open_netns(pid)?;
        let handle = std::thread::Builder::new()
            .name("ww-netns".into())
            .spawn(move || -> Result<Dump, SockDiagError> {
                nix::sched::setns(&ns, nix::sched::CloneFlags::CLONE_NEWNET)
                    .map_err(|source| SockDiagError::Setns { pid, source })?;
                dump_netlink(timeout, time_wait)
            })
            .map_err(SockDiagError::Thread)?;
        handle.join().map_err(|_| SockDiagError::Panicked)?
    }
}

fn io_err(step: &'static str) -> impl FnOnce(std::io::Error) -> SockDiagError {
    move |source| SockDiagError::Io { step, source }
}

/// Dumps every TCP socket of the calling thread's network namespace with tcp_info;
/// TIME_WAIT ones only when `time_wait`. Blocking; bounded by `timeout`.
pub fn dump_netlink(timeout: Duration, time_wait: bool) -> Result<Dump, SockDiagError> {
    let deadline = Instant::now() + timeout;
    let sock = open_socket()?;
    let one_walk = both_families_request(time_wait);
    dump_on(
        &sock,
        &one_walk,
        &BOTH_FAMILIES_REFUSED,
        deadline,
        time_wait,
    )
}

fn open_socket() -> Result<Socket, SockDiagError> {
    let mut sock = Socket::new(NETLINK_SOCK_DIAG).map_err(io_err("socket"))?;
    sock.bind_auto().map_err(io_err("bind"))?;
    sock.connect(&SocketAddr::new(0, 0))
        .map_err(io_err("connect"))?;
    // Non-blocking so a stuck dump can never hold the thread past the deadline.
    sock.set_non_blocking(true)
        .map_err(io_err("non-blocking"))?;
    // A larger kernel buffer avoids ENOBUFS on 10k+ sockets; best effort.
    let _ = sock.set_rx_buf_sz(1 << 20);
    Ok(sock)
}

/// The dump through `one_walk` (every family), unless `refused` says this kernel refuses it;
/// a kernel that answers it with an error sets `refused` and is asked family by family.
fn dump_on(
    sock: &Socket,
    one_walk: &[u8],
    refused: &AtomicBool,
    deadline: Instant,
    time_wait: bool,
) -> Result<Dump, SockDiagError> {
    let timeout = deadline.saturating_duration_since(Instant::now());
    let mut buf: Vec<u8> = Vec::with_capacity(256 * 1024);
    if !refused.load(Ordering::Relaxed) {
        let mut out = Dump::default();
        sock.send(one_walk, 0).map_err(io_err("send"))?;
        match receive_until_done(sock, &mut buf, deadline, timeout, &mut out) {
            Ok(()) => return Ok(out),
            Err(SockDiagError::Kernel(_)) => refused.store(true, Ordering::Relaxed),
            Err(e) => return Err(e),
        }
    }
    dump_by_family(sock, &mut buf, deadline, timeout, time_wait)
}

/// One `SOCK_DIAG_BY_FAMILY` dump per family (two walks of the kernel's hash).
fn dump_by_family(
    sock: &Socket,
    buf: &mut Vec<u8>,
    deadline: Instant,
    timeout: Duration,
    time_wait: bool,
) -> Result<Dump, SockDiagError> {
    let mut out = Dump::default();
    for family in [AF_INET, AF_INET6] {
        send_request(sock, family, time_wait)?;
        receive_until_done(sock, buf, deadline, timeout, &mut out)?;
    }
    Ok(out)
}

/// Reads datagrams of one dump until the kernel says done; decodes every message.
fn receive_until_done(
    sock: &Socket,
    buf: &mut Vec<u8>,
    deadline: Instant,
    timeout: Duration,
    out: &mut Dump,
) -> Result<(), SockDiagError> {
    loop {
        buf.clear();
        let n = match sock.recv(buf, 0) {
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if Instant::now() >= deadline {
                    return Err(SockDiagError::Timeout { after: timeout });
                }
                std::thread::sleep(Duration::from_micros(200));
                continue;
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(io_err("recv")(e)),
        };
        if decode_datagram(&buf[..n.min(buf.len())], out)? {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(SockDiagError::Timeout { after: timeout });
        }
    }
}

/// The older interface's dump request: `struct inet_diag_req` with no family (AF_UNSPEC:
/// every family), TCP by its message type, `tcp_info` asked for, no filter.
fn both_families_request(time_wait: bool) -> Vec<u8> {
    let states = if time_wait {
        u32::MAX
    } else {
        !STATE_TIME_WAIT
    };
    let mut body = vec![0u8; 60];
    body[3] = EXT_INFO;
    // idiag_family, src_len, dst_len (0), ext; the 48-byte socket id (0); states; dbs (0).
    body[52..56].copy_from_slice(&states.to_ne_bytes());
    let mut msg = Vec::with_capacity(16 + body.len());
    msg.extend_from_slice(&((16 + body.len()) as u32).to_ne_bytes());
    msg.extend_from_slice(&TCPDIAG_GETSOCK.to_ne_bytes());
    msg.extend_from_slice(&(NLM_F_REQUEST | NLM_F_DUMP).to_ne_bytes());
    msg.extend_from_slice(&[0u8; 8]); // sequence number, port id
    msg.extend_from_slice(&body);
    msg
}

fn send_request(sock: &Socket, family: u8, time_wait: bool) -> Result<(), SockDiagError> {
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
    sock.send(&req, 0).map_err(io_err("send"))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::TcpState;

    #[test]
    fn dumps_our_namespace_and_sees_a_listener() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let local = l.local_addr().unwrap().to_string();
        let Ok(d) = NetlinkSockDiag::default().dump(Duration::from_secs(2), true) else {
            return; // no sock_diag here (a sandbox): the fallback is tested elsewhere
        };
        let e = d
            .sockets
            .iter()
            .find(|s| s.local == local)
            .expect("listener");
        assert_eq!(e.state, TcpState::Listen);
    }

    /// The one-walk dump, and the per-family dumps a kernel that refuses it gets, see the
    /// same listeners of both families.
    #[test]
    fn one_request_dumps_both_families_like_two() {
        let l4 = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let Ok(l6) = std::net::TcpListener::bind("[::1]:0") else {
            return; // no IPv6 loopback here
        };
        let mine = [
            l4.local_addr().unwrap().to_string(),
            l6.local_addr().unwrap().to_string(),
        ];
        let Ok(sock) = open_socket() else {
            return; // no sock_diag here
        };
        let deadline = || Instant::now() + Duration::from_secs(2);
        let accepted = AtomicBool::new(false);
        let one = dump_on(
            &sock,
            &both_families_request(false),
            &accepted,
            deadline(),
            false,
        )
        .expect("one-walk dump");
        assert!(!accepted.load(Ordering::Relaxed), "this kernel answers it");
        // A request every kernel refuses (shorter than `struct inet_diag_req`: EINVAL): the
        // same dump, family by family, and the refusal is remembered.
        let mut short = both_families_request(false);
        short.truncate(16 + 8);
        short[0..4].copy_from_slice(&24u32.to_ne_bytes());
        let refused = AtomicBool::new(false);
        let two = dump_on(&sock, &short, &refused, deadline(), false).expect("fallback dump");
        assert!(refused.load(Ordering::Relaxed), "the refusal is remembered");
        let three = dump_on(&sock, &short, &refused, deadline(), false).expect("by family");
        for dump in [&one, &two, &three] {
            for addr in &mine {
                let e = dump.sockets.iter().find(|s| &s.local == addr);
                assert_eq!(e.map(|e| e.state), Some(TcpState::Listen), "{addr}");
            }
            assert_eq!(dump.undecoded, 0);
        }
    }
}
