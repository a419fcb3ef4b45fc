//! Every node's exchanges in one list (namespaced), with their node, their start on their
//! node's clock, and an index by id: what linking, skew and judging share.

use crate::model::{Request, Snapshot};
use std::borrow::Cow;
use std::collections::HashMap;

#[derive(Debug, Default)]
pub struct Flat {
    pub requests: Vec<Request>,
    /// The node (input index) of each request.
    pub node: Vec<usize>,
    /// `started_at` in Unix epoch ms on its node's clock.
    pub start_ms: Vec<Option<i64>>,
    /// Request id -> index.
    pub index: HashMap<String, usize>,
    /// Each request's links as indices (`resolve_links`, once linking is done).
    pub children: Vec<Vec<usize>>,
    /// Whether the request was forwarded to another node on a connection whose client
    /// socket has had no byte back since (`links::unanswered`), whatever that node's
    /// correlator guessed.
    pub unanswered: Vec<bool>,
}

impl Flat {
    /// Moves the requests out of the (namespaced) snapshots.
    pub fn take(snaps: &mut [Snapshot]) -> Flat {
        let mut f = Flat::default();
        for (i, s) in snaps.iter_mut().enumerate() {
            for r in std::mem::take(&mut s.requests) {
                f.index.insert(r.id.clone(), f.requests.len());
                f.start_ms.push(r.started_at.as_deref().and_then(parse_ms));
                f.node.push(i);
                f.unanswered.push(false);
                f.requests.push(r);
            }
        }
        f
    }
}

impl Flat {
    /// Resolves every request's links to indices once (links to ids not present dropped).
    pub fn resolve_links(&mut self) {
        self.children = self
            .requests
            .iter()
            .map(|r| {
                r.links
                    .iter()
                    .filter_map(|l| self.index.get(l).copied())
                    .collect()
            })
            .collect();
    }
}

/// An RFC 3339 time as Unix epoch ms.
pub fn parse_ms(s: &str) -> Option<i64> {
    let t = time::OffsetDateTime::parse(s, &time::format_description::well_known::Rfc3339).ok()?;
    i64::try_from(t.unix_timestamp_nanos() / 1_000_000).ok()
}

/// An `ip:port` in one spelling: IPv4-mapped IPv6 (`[::ffff:10.0.0.1]:80`, what a
/// dual-stack listener sees) as IPv4; anything else as it is (not copied).
pub fn canon(addr: &str) -> Cow<'_, str> {
    if !addr.starts_with('[') {
        return Cow::Borrowed(addr);
    }
    match addr.parse::<std::net::SocketAddr>() {
        Ok(std::net::SocketAddr::V6(v6)) => match v6.ip().to_ipv4_mapped() {
            Some(v4) => Cow::Owned(format!("{v4}:{}", v6.port())),
            None => Cow::Owned(v6.to_string()),
        },
        _ => Cow::Borrowed(addr),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_are_spelled_one_way_and_times_parse() {
        assert_eq!(canon("[::ffff:10.77.0.1]:5000"), "10.77.0.1:5000");
        assert_eq!(canon("10.77.0.1:5000"), "10.77.0.1:5000");
        assert_eq!(canon("[fd00::2]:80"), "[fd00::2]:80");
        assert_eq!(canon("garbage"), "garbage");
        assert_eq!(parse_ms("1970-01-01T00:00:01.500Z"), Some(1500));
        assert_eq!(parse_ms("yesterday"), None);
    }
}
