//! `/proc/PID/net/tcp` and `tcp6` lines -> [`SocketEntry`]s: pure, so tests and fuzzing can
//! feed it any text. The one reader of these tables (discovery, the sockets source's
//! fallback and its other-namespace fallback all read through [`super::ProcFs::tcp_table`]).

use crate::model::addr::fmt_addr;
use crate::model::{SocketEntry, TcpState};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// Every well-formed line of one table (the header line and malformed lines are skipped).
pub fn parse_table(text: &str, v6: bool) -> impl Iterator<Item = SocketEntry> + '_ {
    text.lines().skip(1).filter_map(move |l| parse_line(l, v6))
}

/// One line: `sl local rem st tx:rx tr:when retrnsmt uid timeout inode ...`.
pub fn parse_line(line: &str, v6: bool) -> Option<SocketEntry> {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_proc_net_lines() {
        let l = "   0: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 12345 1 0000000000000000 100 0 0 10 0";
        let e = parse_line(l, false).unwrap();
        assert_eq!(e.local, "127.0.0.1:8080");
        assert_eq!(e.remote, "0.0.0.0:0");
        assert_eq!(e.state, TcpState::Listen);
        assert_eq!(e.inode, 12345);
        let l6 = "   0: 00000000000000000000000001000000:1F90 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 777 1";
        let e = parse_line(l6, true).unwrap();
        assert_eq!(e.local, "[::1]:8080");
        assert!(parse_line("garbage", false).is_none());
    }
}
