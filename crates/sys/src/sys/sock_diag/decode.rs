//! Decoding sock_diag answers: a datagram's netlink messages, each `inet_diag_msg` with its
//! attributes -> a [`SocketEntry`] with its [`TcpInfo`].
//!
//! The common message is read in place at the kernel's offsets ([`decode_fast`]); any other
//! goes through the crate's decoder, which counts what it cannot decode.

use super::{Dump, SockDiagError};
use crate::model::addr::fmt_addr;
use crate::model::{SocketEntry, TcpInfo, TcpState};
use netlink_packet_core::{NetlinkMessage, NetlinkPayload};
use netlink_packet_sock_diag::inet::nlas::Nla;
use netlink_packet_sock_diag::{SockDiagMessage, AF_INET, AF_INET6};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// Netlink message types (include/uapi/linux/netlink.h, linux/sock_diag.h).
const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
const SOCK_DIAG_BY_FAMILY: u16 = 20;
/// The older interface's TCP dump (`TCPDIAG_GETSOCK`): its answers carry this type and the
/// same `inet_diag_msg` (netlink.rs asks for both families with it).
const TCPDIAG_GETSOCK: u16 = 18;
/// Size of `struct nlmsghdr`.
pub(super) const NLMSG_HDR_LEN: usize = 16;
/// Size of `struct inet_diag_msg`.
const INET_DIAG_MSG_LEN: usize = 72;
/// `INET_DIAG_INFO`: the attribute holding `struct tcp_info`.
const INET_DIAG_INFO: u16 = 2;
/// An attribute's type without its nested / byte-order flags.
const NLA_TYPE_MASK: u16 = 0x3fff;
/// Size of `struct tcp_info` up to `tcpi_snd_wnd`: what the crate's decoder needs (a
/// shorter one, from an older kernel, is left to it and counted as undecoded).
const TCP_INFO_LEN: usize = 232;

/// Decodes the messages of one datagram into `out`; true when it held `NLMSG_DONE`.
pub fn decode_datagram(data: &[u8], out: &mut Dump) -> Result<bool, SockDiagError> {
    let mut off = 0usize;
    while off + NLMSG_HDR_LEN <= data.len() {
        let len = read_u32_ne(data, off) as usize;
        let ty = read_u16_ne(data, off + 4);
        if len < NLMSG_HDR_LEN || off + len > data.len() {
            return Err(SockDiagError::Malformed { len });
        }
        let msg = &data[off..off + len];
        match ty {
            NLMSG_DONE => return Ok(true),
            NLMSG_ERROR => {
                let code = if len >= 20 {
                    read_u32_ne(msg, 16) as i32
                } else {
                    0
                };
                let err = std::io::Error::from_raw_os_error(-code);
                return Err(SockDiagError::Kernel(err));
            }
            _ => decode_message(msg, out),
        }
        off += (len + 3) & !3;
    }
    Ok(false)
}

/// A TCP socket's message read in place: the fixed header, and `tcp_info` at the kernel's
/// offsets (`struct tcp_info`, include/uapi/linux/tcp.h). None: not one this reads (another
/// message type, a short `tcp_info`, attributes that do not add up): the crate decides.
pub(super) fn decode_fast(msg: &[u8]) -> Option<SocketEntry> {
    if msg.len() < NLMSG_HDR_LEN
        || !matches!(read_u16_ne(msg, 4), SOCK_DIAG_BY_FAMILY | TCPDIAG_GETSOCK)
    {
        return None;
    }
    let body = &msg[NLMSG_HDR_LEN..];
    if body.len() < INET_DIAG_MSG_LEN || !(body[0] == AF_INET || body[0] == AF_INET6) {
        return None;
    }
    let tcp_info = match find_attr(&body[INET_DIAG_MSG_LEN..], INET_DIAG_INFO)? {
        None => None,
        Some(v) if v.len() >= TCP_INFO_LEN => Some(tcp_info_at(v)),
        Some(_) => return None,
    };
    let mut e = decode_raw_header(body)?;
    e.tcp_info = tcp_info;
    Some(e)
}

/// The first attribute of type `kind` in `b`: `Some(None)` when there is none, None when
/// the attributes are malformed (a length out of bounds, bytes left over).
fn find_attr(mut b: &[u8], kind: u16) -> Option<Option<&[u8]>> {
    let mut found = None;
    while !b.is_empty() {
        if b.len() < 4 {
            return None;
        }
        let len = usize::from(read_u16_ne(b, 0));
        if len < 4 || len > b.len() {
            return None;
        }
        if found.is_none() && read_u16_ne(b, 2) & NLA_TYPE_MASK == kind {
            found = Some(&b[4..len]);
        }
        b = &b[((len + 3) & !3).min(b.len())..];
    }
    Some(found)
}

/// The fields of `struct tcp_info` the model keeps (native byte order, as the kernel
/// writes it); `v` holds at least [`TCP_INFO_LEN`] bytes.
fn tcp_info_at(v: &[u8]) -> TcpInfo {
    let u64_at = |off: usize| {
        let mut a = [0u8; 8];
        a.copy_from_slice(&v[off..off + 8]);
        u64::from_ne_bytes(a)
    };
    TcpInfo {
        bytes_acked: u64_at(120),
        bytes_received: u64_at(128),
        bytes_sent: u64_at(200),
        last_data_sent_ms: read_u32_ne(v, 44),
        last_data_recv_ms: read_u32_ne(v, 52),
        last_ack_recv_ms: read_u32_ne(v, 56),
        rtt_us: read_u32_ne(v, 68),
        retransmits: read_u32_ne(v, 100),
        unacked: read_u32_ne(v, 24),
    }
}

fn read_u32_ne(b: &[u8], off: usize) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[off..off + 4]);
    u32::from_ne_bytes(a)
}

fn read_u16_ne(b: &[u8], off: usize) -> u16 {
    u16::from_ne_bytes([b[off], b[off + 1]])
}

/// One `inet_diag_msg` with its attributes -> a socket (tcp_info when the kernel sent it):
/// read in place ([`decode_fast`]), else by the crate's decoder.
fn decode_message(msg: &[u8], out: &mut Dump) {
    if let Some(e) = decode_fast(msg) {
        out.sockets.push(e);
        return;
    }
    decode_with_crate(msg, out);
}

/// The crate's decoder; a message it rejects still gives its fixed header. An answer to the
/// older request is given to it as the newer one (the same body).
fn decode_with_crate(msg: &[u8], out: &mut Dump) {
    let retyped;
    let msg = if msg.len() >= NLMSG_HDR_LEN && read_u16_ne(msg, 4) == TCPDIAG_GETSOCK {
        let mut m = msg.to_vec();
        m[4..6].copy_from_slice(&SOCK_DIAG_BY_FAMILY.to_ne_bytes());
        retyped = m;
        &retyped[..]
    } else {
        msg
    };
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
            if let Some(e) = decode_raw_header(&msg[NLMSG_HDR_LEN..]) {
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

#[cfg(test)]
mod tests {
    use super::*;

    /// One sock_diag answer message as the kernel writes it: `family`, addresses, ports,
    /// a SHUTDOWN attribute, and (`info`) a `tcp_info` of that many bytes, each byte
    /// numbered so a field read at a wrong offset reads a wrong value.
    fn message(family: u8, info: Option<usize>) -> Vec<u8> {
        let mut body = vec![0u8; INET_DIAG_MSG_LEN];
        body[0] = family;
        body[1] = 1; // ESTABLISHED
        body[4..6].copy_from_slice(&8080u16.to_be_bytes());
        body[6..8].copy_from_slice(&40000u16.to_be_bytes());
        for (i, b) in body[8..40].iter_mut().enumerate() {
            *b = if family == AF_INET && (i % 16) >= 4 {
                0
            } else {
                i as u8 + 1
            };
        }
        body[56..60].copy_from_slice(&7u32.to_ne_bytes());
        body[60..64].copy_from_slice(&9u32.to_ne_bytes());
        body[64..68].copy_from_slice(&1000u32.to_ne_bytes());
        body[68..72].copy_from_slice(&123_456u32.to_ne_bytes());
        // INET_DIAG_SHUTDOWN (8): one byte, padded to four.
        body.extend_from_slice(&5u16.to_ne_bytes());
        body.extend_from_slice(&8u16.to_ne_bytes());
        body.extend_from_slice(&[0, 0, 0, 0]);
        if let Some(n) = info {
            body.extend_from_slice(&((n + 4) as u16).to_ne_bytes());
            body.extend_from_slice(&INET_DIAG_INFO.to_ne_bytes());
            body.extend((0..n).map(|i| (i * 7 % 251) as u8));
            body.resize((body.len() + 3) & !3, 0);
        }
        let mut msg = Vec::with_capacity(NLMSG_HDR_LEN + body.len());
        msg.extend_from_slice(&((NLMSG_HDR_LEN + body.len()) as u32).to_ne_bytes());
        msg.extend_from_slice(&SOCK_DIAG_BY_FAMILY.to_ne_bytes());
        msg.extend_from_slice(&[0u8; 10]);
        msg.extend_from_slice(&body);
        msg
    }

    fn by_crate(msg: &[u8]) -> Dump {
        let mut out = Dump::default();
        decode_with_crate(msg, &mut out);
        out
    }

    #[test]
    fn the_fast_path_reads_what_the_crate_reads() {
        for family in [AF_INET, AF_INET6] {
            for info in [None, Some(TCP_INFO_LEN), Some(248), Some(280)] {
                let msg = message(family, info);
                let fast = decode_fast(&msg).expect("read in place");
                let slow = by_crate(&msg);
                assert_eq!(slow.undecoded, 0, "{family} {info:?}");
                assert_eq!(vec![fast.clone()], slow.sockets, "{family} {info:?}");
                assert_eq!(fast.tcp_info.is_some(), info.is_some());
                assert_eq!(fast.inode, 123_456);
                assert!(fast.local.ends_with(":8080"), "{}", fast.local);
            }
        }
    }

    /// The older request's answers (type 18) read like the newer ones, both ways.
    #[test]
    fn an_answer_to_the_older_request_reads_the_same() {
        for info in [Some(TCP_INFO_LEN), Some(104), None] {
            let newer = message(AF_INET6, info);
            let mut older = newer.clone();
            older[4..6].copy_from_slice(&TCPDIAG_GETSOCK.to_ne_bytes());
            let (mut a, mut b) = (Dump::default(), Dump::default());
            decode_message(&newer, &mut a);
            decode_message(&older, &mut b);
            assert_eq!(a, b, "{info:?}");
            assert_eq!(b.sockets.len(), 1);
        }
        let mut other = message(AF_INET, None);
        other[4..6].copy_from_slice(&19u16.to_ne_bytes());
        assert_eq!(decode_fast(&other), None);
    }

    #[test]
    fn a_short_tcp_info_is_left_to_the_crate_and_counted() {
        let msg = message(AF_INET, Some(104));
        assert_eq!(decode_fast(&msg), None);
        let mut out = Dump::default();
        decode_message(&msg, &mut out);
        assert_eq!(out.undecoded, 1);
        assert_eq!(out.sockets.len(), 1);
        assert_eq!(out.sockets[0].tcp_info, None);
    }

    #[test]
    fn damaged_messages_never_panic_and_never_disagree_with_the_crate() {
        let base = message(AF_INET6, Some(248));
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        for _ in 0..2000 {
            let mut m = base.clone();
            let cut = (next() as usize) % (m.len() + 1);
            m.truncate(cut.max(NLMSG_HDR_LEN));
            for _ in 0..(next() % 4) {
                let i = (next() as usize) % m.len();
                m[i] = next() as u8;
            }
            // The header's own length says where the message ends.
            let len = m.len() as u32;
            m[0..4].copy_from_slice(&len.to_ne_bytes());
            if let Some(fast) = decode_fast(&m) {
                let slow = by_crate(&m);
                if slow.undecoded == 0 && slow.sockets.len() == 1 {
                    assert_eq!(fast, slow.sockets[0]);
                }
            }
        }
    }

    #[test]
    fn a_truncated_or_error_datagram_is_an_error_not_a_panic() {
        let mut out = Dump::default();
        // length field 8 (< header)
        let mut short = vec![0u8; 16];
        short[0] = 8;
        assert!(matches!(
            decode_datagram(&short, &mut out),
            Err(SockDiagError::Malformed { len: 8 })
        ));
        // NLMSG_DONE
        let mut done = vec![0u8; 16];
        done[0] = 16;
        done[4..6].copy_from_slice(&NLMSG_DONE.to_ne_bytes());
        assert!(decode_datagram(&done, &mut out).unwrap());
        // NLMSG_ERROR with -EPERM
        let mut err = vec![0u8; 20];
        err[0] = 20;
        err[4..6].copy_from_slice(&NLMSG_ERROR.to_ne_bytes());
        err[16..20].copy_from_slice(&(-1i32).to_ne_bytes());
        let e = decode_datagram(&err, &mut out).unwrap_err();
        assert!(e.to_string().starts_with("netlink error"), "{e}");
    }
}
