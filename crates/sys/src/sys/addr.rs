//! The endpoint of a URL read with the one URL type ([`url::Url`]). The one `host:port`
//! splitter and `ip:port` formatter are [`crate::model::addr`]'s (the model needs them too).

use url::{Host, Url};

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
