//! Addresses as text: the one `host:port` splitter and the one `ip:port` formatter, and the
//! endpoint of a URL read with the one URL type ([`url::Url`]).
//!
//! The model keeps socket addresses as strings (`127.0.0.1:8000`, `[::1]:8000`, as `ss`
//! prints them) because they are shown and serialized as such; these functions are the only
//! place that takes such strings apart.

use std::net::IpAddr;
use url::{Host, Url};

/// `ip:port`, IPv6 as `[ip]:port` (the model's convention).
pub fn fmt_addr(ip: IpAddr, port: u16) -> String {
    match ip {
        IpAddr::V4(a) => format!("{a}:{port}"),
        IpAddr::V6(a) => format!("[{a}]:{port}"),
    }
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

/// An `ip:port` / `[ip]:port` socket address; IPv4-mapped IPv6 becomes IPv4.
pub fn parse_socket_addr(s: &str) -> Option<(IpAddr, u16)> {
    let (host, port) = split_host_port(s)?;
    let ip: IpAddr = host.parse().ok()?;
    Some((ip.to_canonical(), port))
}

/// The host (IPv6 without brackets) and port (the scheme's default when absent) a URL
/// points at; None for a URL without a host (`mailto:`, `localhost:8000` read as a scheme).
pub fn url_endpoint(url: &Url) -> Option<(String, u16)> {
    let host = match url.host()? {
        Host::Domain("") => return None,
        Host::Domain(d) => d.to_string(),
        Host::Ipv4(a) => a.to_string(),
        Host::Ipv6(a) => a.to_string(),
    };
    Some((host, url.port_or_known_default()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_and_formats_addresses() {
        assert_eq!(split_host_port("127.0.0.1:80"), Some(("127.0.0.1", 80)));
        assert_eq!(split_host_port("[::1]:8080"), Some(("::1", 8080)));
        assert_eq!(split_host_port("engine:31012"), Some(("engine", 31012)));
        assert_eq!(split_host_port("*:x"), None);
        assert_eq!(
            parse_socket_addr("[::ffff:127.0.0.1]:80"),
            Some(("127.0.0.1".parse().unwrap(), 80))
        );
        assert_eq!(host_port("::", 8000), "[::]:8000");
        assert_eq!(host_port("engine", 1), "engine:1");
    }

    #[test]
    fn url_endpoints() {
        let ep = |s: &str| Url::parse(s).ok().as_ref().and_then(url_endpoint);
        assert_eq!(
            ep("http://u:p@127.0.0.1:31012/x"),
            Some(("127.0.0.1".into(), 31012))
        );
        assert_eq!(ep("http://[::1]:8000"), Some(("::1".into(), 8000)));
        assert_eq!(ep("https://engine/v1"), Some(("engine".into(), 443)));
        assert_eq!(ep("http://engine"), Some(("engine".into(), 80)));
        assert_eq!(ep("localhost:8000"), None);
        assert_eq!(ep("127.0.0.1:8000"), None);
    }
}
