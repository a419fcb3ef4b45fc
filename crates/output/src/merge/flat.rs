//! Every node's exchanges in one list (namespaced), with their node, their start on their
//! node's clock, their links as indices, and what each node's own verdicts said about them:
//! what linking, skew and judging share.
//!
//! Ids are resolved once, per node, on the node's own spelling (`x12`), before they are
//! prefixed with the node: from then on everything is an index into [`Flat::requests`].

use super::namespace;
use crate::model::{Snapshot, StuckKind, Verdict};
use std::borrow::Cow;
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

#[derive(Debug, Default)]
pub struct Flat {
    pub requests: Vec<crate::model::Request>,
    /// The node (input index) of each request.
    pub node: Vec<usize>,
    /// `started_at` in Unix epoch ms on its node's clock.
    pub start_ms: Vec<Option<i64>>,
    /// Each request's links as indices (links to ids its node does not hold are dropped).
    pub children: Vec<Vec<usize>>,
    /// Whether the request was forwarded to another node on a connection whose client
    /// socket has had no byte back since (`links::unanswered`), whatever that node's
    /// correlator guessed.
    pub unanswered: Vec<bool>,
    /// The legs a node judged its requests stuck at, and how.
    pub stuck: Vec<(usize, StuckKind)>,
    /// Legs of requests their node judged probes (health checks, scrapes: never stuck).
    pub probe: Vec<bool>,
    /// Per node: its logical request ids its findings name -> their first leg.
    pub named: Vec<HashMap<String, usize>>,
}

impl Flat {
    /// Resolves each snapshot's ids, prefixes them with its node (`names`) and moves its
    /// requests out; the nodes' own logical requests are read and dropped.
    pub fn take(snaps: &mut [Snapshot], names: &[String]) -> Flat {
        let total = snaps.iter().map(|s| s.requests.len()).sum();
        let mut f = Flat {
            requests: Vec::with_capacity(total),
            node: Vec::with_capacity(total),
            start_ms: Vec::with_capacity(total),
            children: Vec::with_capacity(total),
            unanswered: vec![false; total],
            probe: vec![false; total],
            ..Flat::default()
        };
        for (i, (s, name)) in snaps.iter_mut().zip(names).enumerate() {
            f.resolve(s);
            namespace::namespace(s, name);
            for r in std::mem::take(&mut s.requests) {
                f.start_ms.push(r.started_at.as_deref().and_then(parse_ms));
                f.node.push(i);
                f.requests.push(r);
            }
        }
        f
    }

    /// One node's links, verdicts and named requests as indices (before `namespace`).
    fn resolve(&mut self, s: &mut Snapshot) {
        let base = self.children.len();
        let mut by_id: HashMap<&str, usize> = HashMap::with_capacity(s.requests.len());
        for (k, r) in s.requests.iter().enumerate() {
            by_id.entry(r.id.as_str()).or_insert(base + k);
        }
        let at = |id: &String| by_id.get(id.as_str()).copied();
        self.children.extend(
            s.requests
                .iter()
                .map(|r| r.links.iter().filter_map(at).collect()),
        );
        let wanted: std::collections::HashSet<&str> = s
            .findings
            .iter()
            .flat_map(|f| f.requests.iter().map(String::as_str))
            .collect();
        let mut named = HashMap::new();
        for l in &s.logical_requests {
            if wanted.contains(l.id.as_str()) {
                if let Some(first) = l.legs.first().and_then(at) {
                    named.insert(l.id.clone(), first);
                }
            }
            if l.probe {
                l.legs
                    .iter()
                    .filter_map(at)
                    .for_each(|i| self.probe[i] = true);
            }
            if l.verdict != Verdict::Stuck {
                continue;
            }
            // the stuck leg is one of its request's legs: only those are looked up
            let want = l.stuck_leg.as_deref();
            let leg = l
                .legs
                .iter()
                .filter_map(at)
                .find(|&i| want.is_some() && s.requests[i - base].leg.as_deref() == want);
            if let Some(i) = leg {
                let kind = l.stuck_kind.unwrap_or(StuckKind::NoResponse);
                self.stuck.push((i, kind));
            }
        }
        self.named.push(named);
        s.logical_requests = Vec::new();
    }
}

/// A hasher for keys made here of our own indices (never for strings from a snapshot: they
/// keep the DoS-resistant default): one multiply per word.
#[derive(Default, Clone, Copy)]
pub struct IndexHasher(u64);

impl Hasher for IndexHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        bytes.iter().for_each(|&b| self.write_u64(u64::from(b)));
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0.rotate_left(5) ^ n).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
    fn write_u32(&mut self, n: u32) {
        self.write_u64(u64::from(n));
    }
    fn write_usize(&mut self, n: usize) {
        self.write_u64(n as u64);
    }
}

/// A set of keys made of our own indices.
pub type IndexSet<K> = std::collections::HashSet<K, BuildHasherDefault<IndexHasher>>;

/// An RFC 3339 time as Unix epoch ms: the shape wedgewatch writes
/// (`2026-12-02T01:46:26.418Z`) read directly, anything else by the `time` crate.
pub fn parse_ms(s: &str) -> Option<i64> {
    fast_ms(s.as_bytes()).or_else(|| crate::clock::parse_rfc3339(s))
}

/// `YYYY-MM-DDTHH:MM:SS.mmmZ` (UTC, milliseconds) only.
fn fast_ms(b: &[u8]) -> Option<i64> {
    if b.len() != 24 || b[23] != b'Z' || b[19] != b'.' {
        return None;
    }
    let seps = [(4, b'-'), (7, b'-'), (10, b'T'), (13, b':'), (16, b':')];
    if seps.iter().any(|&(i, c)| b[i] != c) {
        return None;
    }
    let num = |r: std::ops::Range<usize>| -> Option<i64> {
        b[r].iter().try_fold(0i64, |n, &d| {
            d.is_ascii_digit().then(|| n * 10 + i64::from(d - b'0'))
        })
    };
    let (y, mo, d) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (h, mi, sec, ms) = (num(11..13)?, num(14..16)?, num(17..19)?, num(20..23)?);
    // Days past the 28th are left to the crate, which knows each month's length.
    if !(1..=12).contains(&mo) || !(1..=28).contains(&d) || h > 23 || mi > 59 || sec > 59 {
        return None;
    }
    let days = days_from_civil(y, mo, d);
    Some((((days * 24 + h) * 60 + mi) * 60 + sec) * 1_000 + ms)
}

/// Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant's algorithm).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
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

    #[test]
    fn the_fast_reading_agrees_with_the_time_crate() {
        let slow = crate::clock::parse_rfc3339;
        for ms in [
            0,
            1_500,
            951_782_400_000,
            1_795_000_000_123,
            4_107_542_399_999,
        ] {
            let s = crate::clock::rfc3339(ms);
            assert_eq!(parse_ms(&s), Some(ms), "{s}");
            assert_eq!(slow(&s), Some(ms), "{s}");
            assert!(
                matches!(fast_ms(s.as_bytes()), Some(v) if v == ms) || s[8..10] > *"28",
                "{s}"
            );
        }
        // past the 28th the crate decides: a leap day is read, the 31st of February is not
        assert_eq!(fast_ms(b"2000-02-29T00:00:00.000Z"), None);
        assert_eq!(parse_ms("2000-02-29T00:00:00.000Z"), Some(951_782_400_000));
        assert_eq!(parse_ms("2026-02-31T00:00:00.000Z"), None);
        // other shapes go to the time crate
        assert_eq!(
            parse_ms("2026-12-02T01:46:26.418+01:00"),
            slow("2026-12-02T01:46:26.418+01:00")
        );
        assert_eq!(fast_ms(b"2026-13-02T01:46:26.418Z"), None);
        assert_eq!(fast_ms(b"2026-12-02T01:4x:26.418Z"), None);
    }
}
