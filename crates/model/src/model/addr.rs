//! Addresses as text: the one `host:port` splitter and the one `ip:port` formatter.
//!
//! The model keeps socket addresses as strings (`127.0.0.1:8000`, `[::1]:8000`) because
//! they are shown and serialized as such; these functions are the only place that takes them
//! apart, in the bottom layer so every layer splits alike.

use std::net::IpAddr;

/// `ip:port`, IPv6 as `[ip]:port`; IPv4-mapped IPv6 as IPv4, so both ends of one connection
/// spell it alike and are joined.
pub fn fmt_addr(ip: IpAddr, port: u16) -> String {
    match ip {
        IpAddr::V4(a) => fmt_v4(a.octets(), port),
        IpAddr::V6(a) => match a.to_ipv4_mapped() {
            Some(v4) => fmt_v4(v4.octets(), port),
            None => format!("[{a}]:{port}"),
        },
    }
}

/// `a.b.c.d:port` written number by number (`itoa`): cheaper than `Ipv4Addr`'s `Display` on
/// a hot path.
fn fmt_v4(octets: [u8; 4], port: u16) -> String {
    let mut digits = itoa::Buffer::new();
    let mut s = String::with_capacity(21);
    for (i, o) in octets.into_iter().enumerate() {
        if i > 0 {
            s.push('.');
        }
        s.push_str(digits.format(o));
    }
    s.push(':');
    s.push_str(digits.format(port));
    s
}

/// `host:port` for a host that may be an IP literal (IPv6 bracketed) or a name.
pub fn host_port(host: &str, port: u16) -> String {
    match host.parse::<IpAddr>() {
        Ok(ip) => fmt_addr(ip, port),
        Err(_) => format!("{host}:{port}"),
    }
}

/// Splits `ip:port` / `[v6]:port` / `host:port` into the host (without brackets) and the
/// port. None without a numeric port.
pub fn split_host_port(s: &str) -> Option<(&str, u16)> {
    let (host, port) = s.rsplit_once(':')?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    Some((host, port.parse().ok()?))
}

/// The port of `ip:port` / `[v6]:port` / `host:port` (`*:8000` too).
pub fn port_of(s: &str) -> Option<u16> {
    split_host_port(s).map(|(_, port)| port)
}

/// An `ip:port` / `[ip]:port` socket address; IPv4-mapped IPv6 becomes IPv4.
pub fn parse_socket_addr(s: &str) -> Option<(IpAddr, u16)> {
    let (host, port) = split_host_port(s)?;
    let ip: IpAddr = host.parse().ok()?;
    Some((ip.to_canonical(), port))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ipv4_addresses_are_written_as_display_writes_them() {
        let octets = [0u8, 1, 9, 10, 99, 100, 127, 199, 200, 255];
        for a in octets {
            for b in octets {
                for port in [0u16, 1, 9, 10, 80, 443, 8000, 9999, 10000, 65535] {
                    let ip = std::net::Ipv4Addr::new(a, b, 255 - b, a);
                    assert_eq!(fmt_addr(IpAddr::V4(ip), port), format!("{ip}:{port}"));
                }
            }
        }
    }

    #[test]
    fn a_dual_stack_sockets_ipv4_peer_is_written_as_ipv4() {
        let mapped: IpAddr = "::ffff:192.0.2.2".parse().unwrap();
        assert_eq!(fmt_addr(mapped, 15228), "192.0.2.2:15228");
        let v6: IpAddr = "2001:db8::1".parse().unwrap();
        assert_eq!(fmt_addr(v6, 80), "[2001:db8::1]:80");
    }

    #[test]
    fn splits_and_formats_addresses() {
        assert_eq!(split_host_port("127.0.0.1:80"), Some(("127.0.0.1", 80)));
        assert_eq!(split_host_port("[::1]:8080"), Some(("::1", 8080)));
        assert_eq!(split_host_port("engine:31012"), Some(("engine", 31012)));
        assert_eq!(split_host_port("*:x"), None);
        assert_eq!(port_of("*:8000"), Some(8000));
        assert_eq!(port_of("[::]:31012"), Some(31012));
        assert_eq!(port_of("8000"), None);
        assert_eq!(
            parse_socket_addr("[::ffff:127.0.0.1]:80"),
            Some(("127.0.0.1".parse().unwrap(), 80))
        );
        assert_eq!(parse_socket_addr("engine:80"), None);
        assert_eq!(host_port("::", 8000), "[::]:8000");
        assert_eq!(host_port("engine", 1), "engine:1");
    }
}
