//! Addresses and endpoints: which host to connect to for a listen address, when two hosts
//! are the same, where a component may be scraped (only its own listening sockets), the
//! loopback-only GET discovery uses, and what a router's `/workers` answer lists.

use super::profiles::flag_value;
use crate::model::addr::{host_port, split_host_port};
use crate::model::FetchOutcome;
use crate::probes::Profile;
use crate::sys::addr::url_endpoint;
use crate::sys::http::{self, Limits};
use crate::sys::Url;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

/// Body cap for the router's `/workers` answer.
const MAX_HTTP_BODY: usize = 1 << 20;

fn is_wildcard(ip: &IpAddr) -> bool {
    ip.is_unspecified()
}

/// Host to connect to for a listen host (`0.0.0.0` -> `127.0.0.1`).
pub(super) fn connect_host(host: &str) -> String {
    match host.parse::<IpAddr>() {
        Ok(IpAddr::V4(v4)) if v4.is_unspecified() => "127.0.0.1".into(),
        Ok(IpAddr::V6(v6)) if v6.is_unspecified() => "[::1]".into(),
        Ok(IpAddr::V6(v6)) => format!("[{v6}]"),
        _ => host.to_string(),
    }
}

/// Whether two hosts name the same listener (a wildcard or two loopbacks match).
pub(super) fn hosts_equivalent(a: &str, b: &str) -> bool {
    let norm = |h: &str| -> Option<IpAddr> {
        if h == "localhost" {
            return Some(IpAddr::from([127, 0, 0, 1]));
        }
        h.parse().ok()
    };
    match (norm(a), norm(b)) {
        (Some(x), Some(y)) => {
            x == y || is_wildcard(&x) || is_wildcard(&y) || (x.is_loopback() && y.is_loopback())
        }
        _ => a == b,
    }
}

/// `localhost`, a loopback or a wildcard address: reachable without the network.
pub(super) fn is_loopback_host(h: &str) -> bool {
    h == "localhost"
        || h.parse::<IpAddr>()
            .map(|ip| ip.is_loopback() || ip.is_unspecified())
            .unwrap_or(false)
}

/// GET `http://host:port/path` over loopback with the one timed, size-capped client
/// ([`crate::sys::http`]), `timeout` for the whole request. Refuses non-loopback hosts: discovery
/// never talks to the network.
pub fn loopback_get(
    host: &str,
    port: u16,
    path: &str,
    timeout: Duration,
) -> std::result::Result<String, String> {
    loopback_get_with(host, port, path, timeout, None)
}

/// [`loopback_get`] with an `Authorization` value (a router's own API key).
pub fn loopback_get_with(
    host: &str,
    port: u16,
    path: &str,
    timeout: Duration,
    authorization: Option<String>,
) -> std::result::Result<String, String> {
    loopback_get_in(host, port, path, timeout, authorization, None)
}

/// [`loopback_get_with`] on the loopback of namespace `netns` (a container's; None: ours).
pub fn loopback_get_in(
    host: &str,
    port: u16,
    path: &str,
    timeout: Duration,
    authorization: Option<String>,
    netns: Option<crate::sys::netns::Netns>,
) -> std::result::Result<String, String> {
    if !is_loopback_host(host) {
        return Err(format!("{host} is not a loopback address; not asked"));
    }
    let url = format!("http://{}:{port}{path}", connect_host(host));
    let limits = Limits {
        connect: timeout,
        total: timeout,
        cap: MAX_HTTP_BODY,
    };
    let route = crate::sys::netns::route(netns);
    let r = http::get_blocking_routed(&url, limits, route, authorization);
    match r.outcome {
        FetchOutcome::Ok => Ok(String::from_utf8_lossy(&r.body).into_owned()),
        _ => Err(r.detail.unwrap_or_else(|| format!("{:?}", r.outcome))),
    }
}

/// Where to reach `port` of a process whose flags name `claimed`: one of its own listening
/// sockets (`own`), a wildcard one at loopback. Any local process can pose as an engine, so
/// an address the process does not itself listen on is never scraped. Err says why.
pub fn scrape_addr(
    claimed: &str,
    port: u16,
    own: &[SocketAddr],
) -> std::result::Result<String, String> {
    let on_port: Vec<&SocketAddr> = own.iter().filter(|s| s.port() == port).collect();
    let pick = on_port
        .iter()
        .find(|s| hosts_equivalent(&s.ip().to_string(), claimed))
        .or(on_port.first());
    match pick {
        Some(s) => Ok(format!("{}:{port}", connect_host(&s.ip().to_string()))),
        None if is_loopback_host(claimed) => Err(format!(
            "{}: not one of its listening sockets, so not scraped",
            host_port(claimed, port)
        )),
        None => Err(format!(
            "{}: not on this host (no listening socket of its own on port {port}), so not scraped",
            host_port(claimed, port)
        )),
    }
}

/// Worker URLs from a `/workers` answer (`[...]` or `{"workers": [...]}`, items with `url`).
pub(super) fn worker_urls_from_json(body: &str) -> Vec<String> {
    let Ok(v) = serde_json::from_str::<serde_json::Value>(body) else {
        return Vec::new();
    };
    let items = match &v {
        serde_json::Value::Array(a) => a.clone(),
        serde_json::Value::Object(o) => o
            .get("workers")
            .and_then(|w| w.as_array())
            .cloned()
            .unwrap_or_default(),
        _ => Vec::new(),
    };
    items
        .iter()
        .filter_map(|i| i.get("url").and_then(|u| u.as_str()).map(str::to_string))
        .collect()
}

/// What discovery knows of a component's endpoints.
pub(super) struct EndpointFacts<'a> {
    pub prof: &'a Profile,
    pub args: &'a [String],
    /// `host:port` its flags (or defaults, or sockets) name.
    pub primary: Option<&'a str>,
    pub port: Option<u16>,
    pub listen: &'a [String],
    /// Its own listening sockets.
    pub own: &'a [SocketAddr],
    pub top_level: bool,
}

/// (HTTP API URL, metrics URL, why each endpoint that is not scraped is not): every URL is
/// one of the process's own listening sockets ([`scrape_addr`]).
pub(super) fn endpoint_urls(f: &EndpointFacts) -> (Option<String>, Option<String>, Vec<String>) {
    let mut unscraped: Vec<String> = Vec::new();
    let mut reach = |host: &str, port: u16| match scrape_addr(host, port, f.own) {
        Ok(a) => Some(a),
        Err(why) => {
            if !unscraped.contains(&why) {
                unscraped.push(why);
            }
            None
        }
    };
    let primary = f.primary.and_then(split_host_port);
    let has_port = f.prof.port_flag.is_some() || f.prof.default_port.is_some();
    let http_url = match (primary, f.top_level && has_port) {
        (Some((h, p)), true) => reach(h, p).map(|a| format!("http://{a}")),
        _ => None,
    };
    let metrics_url = f.prof.metrics_path.as_ref().and_then(|path| {
        let mhost = f
            .prof
            .metrics_host_flag
            .as_ref()
            .and_then(|flag| flag_value(f.args, flag))
            .or_else(|| primary.map(|(h, _)| h.to_string()))
            .unwrap_or_else(|| "127.0.0.1".into());
        let mp = metrics_port(f, primary.map(|(_, p)| p))?;
        reach(&mhost, mp).map(|a| format!("http://{a}{path}"))
    });
    (http_url, metrics_url, unscraped)
}

/// The metrics port: its flag, else (when setproctitle took the arguments) the one other
/// listening port (the router listens on exactly its API port and its metrics port), else
/// the profile's default; without a metrics port flag, the HTTP port.
fn metrics_port(f: &EndpointFacts, primary_port: Option<u16>) -> Option<u16> {
    let Some(flag) = &f.prof.metrics_port_flag else {
        return f.port;
    };
    let other_ports: Vec<u16> = f
        .listen
        .iter()
        .filter_map(|a| split_host_port(a).map(|(_, p)| p))
        .filter(|p| Some(*p) != primary_port)
        .collect();
    let from_sockets = match other_ports.as_slice() {
        [only] => Some(*only),
        _ => None,
    };
    flag_value(f.args, flag)
        .and_then(|v| v.parse::<u16>().ok())
        .or(from_sockets)
        .or(f.prof.metrics_default_port)
}

/// `0,1, 3` -> `[0, 1, 3]` (a visible-devices variable).
pub(super) fn parse_gpu_list(v: &str) -> Vec<u32> {
    v.split(',').filter_map(|s| s.trim().parse().ok()).collect()
}

/// The host (IPv6 without brackets) and port a URL names, read with the one URL type.
pub(super) fn endpoint_of(url: &str) -> Option<(String, u16)> {
    url_endpoint(&Url::parse(url).ok()?)
}
