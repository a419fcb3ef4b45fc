//! `accumulating_state` (warning): a component's connections, CLOSE_WAIT sockets, fds or
//! threads keep growing over `accumulate_window_ms` (history), or it holds many long-silent
//! CLOSE_WAIT sockets now (one look: the kernel's per-socket clocks are the history we did
//! not see). Both on the same sockets make one finding. Rule and what to do:
//! `accumulating_state` in docs/findings.md.
//!
//! Thresholds read: `accumulate_window_ms`, `accumulate_min_connections`,
//! `accumulate_min_close_wait`, `accumulate_min_fds`, `accumulate_min_threads`,
//! `accumulate_close_wait_silent_min`, `accumulate_close_wait_silent_ms`.

use super::secs;
use crate::clock::Millis;
use crate::correlate::{Correlator, View};
use crate::model::{Evidence, Finding, FindingKind, Severity, SocketEntry, SocketTable, TcpState};
use std::collections::BTreeMap;
use std::net::IpAddr;

/// The growth metric of CLOSE_WAIT sockets (also the key that merges the two ways).
const CLOSE_WAIT_SOCKETS: &str = "CLOSE_WAIT sockets";

/// Sockets listed one by one in the evidence (the most silent first); the rest are summed up.
const LISTED_SOCKETS: usize = 8;

/// `accumulating_state`: connections, CLOSE_WAIT sockets, fds or threads keep growing, or a
/// component holds many long-silent CLOSE_WAIT sockets right now.
pub fn accumulating_state(m: &Correlator, v: &View) -> Vec<Finding> {
    let mut grown = growth(m, v);
    let mut out = Vec::new();
    for held in held_close_wait(m, v) {
        let same = grown
            .iter_mut()
            .find(|(what, f)| *what == CLOSE_WAIT_SOCKETS && f.component == held.component);
        match same {
            Some((_, f)) => f.evidence.extend(held.evidence),
            None => out.push(held),
        }
    }
    grown.into_iter().map(|(_, f)| f).chain(out).collect()
}

/// The history way: growth over `accumulate_window_ms`. Each finding with the metric it is
/// about.
fn growth(m: &Correlator, v: &View) -> Vec<(&'static str, Finding)> {
    let th = &m.thresholds;
    let mut out = Vec::new();
    for c in &m.topology().components {
        let Some(q) = m.counts(&c.id) else { continue };
        let from = v.now - th.detect.accumulate_window_ms;
        type Pick = fn(&crate::correlate::CountPoint) -> Option<u32>;
        let metrics: [(&'static str, Pick, u32); 4] = [
            (
                "established connections",
                |p| p.established,
                th.detect.accumulate_min_connections,
            ),
            (
                CLOSE_WAIT_SOCKETS,
                |p| p.close_wait,
                th.detect.accumulate_min_close_wait,
            ),
            ("open fds", |p| p.fds, th.detect.accumulate_min_fds),
            ("threads", |p| p.threads, th.detect.accumulate_min_threads),
        ];
        for (what, pick, min_growth) in metrics {
            let pts: Vec<(Millis, u32)> = q
                .iter()
                .filter(|p| p.t_ms >= from && p.t_ms <= v.now)
                .filter_map(|p| pick(p).map(|x| (p.t_ms, x)))
                .collect();
            if pts.len() < 6 || pts[pts.len() - 1].0 - pts[0].0 < th.detect.accumulate_window_ms / 2
            {
                continue;
            }
            let third = pts.len() / 3;
            let early_max = pts[..third].iter().map(|p| p.1).max().unwrap_or(0);
            let late_min = pts[pts.len() - third..]
                .iter()
                .map(|p| p.1)
                .min()
                .unwrap_or(0);
            let rises = pts.windows(2).filter(|w| w[1].1 >= w[0].1).count();
            if late_min < early_max.saturating_add(min_growth) || rises * 10 < (pts.len() - 1) * 8 {
                continue;
            }
            let (t0, v0) = pts[0];
            let (t1, v1) = pts[pts.len() - 1];
            out.push((what, Finding {
                kind: FindingKind::AccumulatingState,
                severity: Severity::Warning,
                component: Some(c.id.clone()),
                role: Some(c.role),
                summary: format!("{} {what} grew from {v0} to {v1} in {} and keep growing", c.id, secs(t1 - t0)),
                requests: Vec::new(),
                evidence: vec![Evidence::new(
                    if what.contains("fds") || what == "threads" { "processes" } else { "sockets" },
                    format!("{what}: {v0} at start, {early_max} max early, {late_min} min late, {v1} now ({} points)", pts.len()),
                )],
                explanation: Some("Something is opened and never released: leaked connections (CLOSE_WAIT means the peer hung up and this process never closed), fds or threads. Each leaked connection may be a forgotten request.".into()),
            }));
        }
    }
    out
}

/// What is known of the other end of a CLOSE_WAIT socket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Peer {
    /// The peer's socket is on this host and no longer exists: nobody is at the other end.
    Gone,
    /// The peer's socket still exists in this state (FIN_WAIT2, typically) but no process
    /// holds it: its process closed it and only the kernel keeps it (`tcp_fin_timeout`).
    Orphaned(TcpState),
    /// The peer's socket is still held by a process (it half-closed: `shutdown(SHUT_WR)`).
    HalfClosed(TcpState, Option<i32>),
    /// The peer is not on this host (or its socket was not in the table): cannot say.
    Unknown,
}

impl Peer {
    /// Nobody is left at the other end.
    fn gone(self) -> bool {
        matches!(self, Peer::Gone | Peer::Orphaned(_))
    }
}

/// One CLOSE_WAIT socket of a component in the newest table.
struct Held<'a> {
    e: &'a SocketEntry,
    /// Silent (no byte, no ACK either way) for this long at `now`.
    silent_ms: i64,
    /// "to router@..." / "from 127.0.0.1:5000" / "to 10.0.0.9:443".
    toward: String,
    peer: Peer,
}

/// `ip` of an `ip:port` / `[ip]:port` string; IPv4-mapped IPv6 as IPv4.
fn host_of(addr: &str) -> Option<IpAddr> {
    crate::model::addr::parse_socket_addr(addr).map(|(ip, _)| ip)
}

/// Time since anything at all moved on the socket: the kernel's "ms ago" of the last byte in,
/// last byte out and last ACK in (the peer's FIN carries one), whichever is newest.
fn silent_of(e: &SocketEntry) -> Option<u32> {
    let ti = e.tcp_info?;
    Some(
        ti.last_data_recv_ms
            .min(ti.last_data_sent_ms)
            .min(ti.last_ack_recv_ms),
    )
}

/// The other end of `e`, if this table can tell: on a listen port with a local peer, an
/// absent reversed 4-tuple means the peer is gone. Only for sockets with `tcp_info`, whose
/// namespace was dumped whole.
fn peer_of(m: &Correlator, table: &SocketTable, e: &SocketEntry) -> Peer {
    if let Some(p) = table
        .sockets
        .iter()
        .find(|p| p.netns == e.netns && p.local == e.remote && p.remote == e.local)
    {
        // The kernel reports inode 0 for a socket no fd refers to any more.
        return if p.pid.is_none() && p.inode == 0 {
            Peer::Orphaned(p.state)
        } else {
            Peer::HalfClosed(p.state, p.pid)
        };
    }
    let ports: Vec<u16> = m
        .topology()
        .components
        .iter()
        .flat_map(|c| c.listen_ports())
        .collect();
    let on_known_port = [e.local_port(), e.remote_port()]
        .iter()
        .any(|p| p.is_some_and(|p| ports.contains(&p)));
    let remote_ip = host_of(&e.remote);
    let on_this_host = remote_ip.is_some_and(|ip| {
        ip.is_loopback()
            || table
                .sockets
                .iter()
                .any(|s| s.netns == e.netns && host_of(&s.local) == Some(ip))
    });
    if on_known_port && on_this_host {
        Peer::Gone
    } else {
        Peer::Unknown
    }
}

/// Where a held socket leads, the key its sockets are counted under: "to router@...",
/// "from proxy@...", "to 10.0.0.9:443", "from 10.0.0.7" (a client's ephemeral port left out).
fn toward_of(m: &Correlator, table: &SocketTable, owner: &str, e: &SocketEntry) -> String {
    let topo = m.topology();
    let inbound = topo
        .component(owner)
        .zip(e.local_port())
        .is_some_and(|(c, p)| c.listen_ports().contains(&p));
    if inbound {
        // The client's own socket (reversed 4-tuple) names its process, if still there.
        let client = table
            .sockets
            .iter()
            .find(|p| p.netns == e.netns && p.local == e.remote && p.remote == e.local)
            .and_then(|p| p.pid)
            .and_then(|pid| topo.component_of_pid(pid));
        return match (client, host_of(&e.remote)) {
            (Some(c), _) => format!("from {}", c.id),
            (None, Some(ip)) => format!("from {ip}"),
            (None, None) => format!("from {}", e.remote),
        };
    }
    let local_peer = host_of(&e.remote).is_some_and(|ip| ip.is_loopback());
    // The peer in this socket's own namespace (two pods can listen on one port).
    match e
        .remote_port()
        .and_then(|p| topo.component_listening_in(e.netns, p))
    {
        Some(c) if local_peer || c.listen.iter().any(|l| host_of(l) == host_of(&e.remote)) => {
            format!("to {}", c.id)
        }
        _ => format!("to {}", e.remote),
    }
}

/// The one-look way: components holding many long-silent CLOSE_WAIT sockets now.
fn held_close_wait(m: &Correlator, v: &View) -> Vec<Finding> {
    let th = &m.thresholds;
    // Point-in-time evidence must be current: a table from before a gap is not "now".
    if !v.sockets_fresh {
        return Vec::new();
    }
    let Some((t_table, table)) = m.latest_sockets() else {
        return Vec::new();
    };
    // The table's "ms ago" values age with the time since it was taken.
    let aged = (v.now - t_table).max(0);
    let scan = CloseWaits::scan(m, table, aged);
    let min = usize::try_from(th.detect.accumulate_close_wait_silent_min).unwrap_or(usize::MAX);
    let mut out = Vec::new();
    for (id, mut socks) in scan.held {
        if socks.len() < min {
            continue;
        }
        let Some(c) = m.topology().component(&id) else {
            continue;
        };
        socks.sort_by(|a, b| {
            b.silent_ms
                .cmp(&a.silent_ms)
                .then(a.e.local.cmp(&b.e.local))
        });
        let not_counted = NotCounted {
            fresh: scan.fresh.get(&id).copied(),
            unclocked: scan.unclocked.get(&id).copied(),
        };
        out.push(held_finding(m, c, &socks, not_counted, aged));
    }
    out
}

/// The newest table's CLOSE_WAIT sockets of each component, by whether they count.
struct CloseWaits<'a> {
    /// Silent for at least `accumulate_close_wait_silent_ms`: held.
    held: BTreeMap<String, Vec<Held<'a>>>,
    /// In CLOSE_WAIT for less: a close in progress.
    fresh: BTreeMap<String, u32>,
    /// Without `tcp_info`: how long they have been there is unknown.
    unclocked: BTreeMap<String, u32>,
}

impl<'a> CloseWaits<'a> {
    fn scan(m: &Correlator, table: &'a SocketTable, aged: i64) -> CloseWaits<'a> {
        let th = &m.thresholds;
        let mut scan = CloseWaits {
            held: BTreeMap::new(),
            fresh: BTreeMap::new(),
            unclocked: BTreeMap::new(),
        };
        for e in table
            .sockets
            .iter()
            .filter(|e| e.state == TcpState::CloseWait)
        {
            let Some(c) = e.pid.and_then(|p| m.topology().component_of_pid(p)) else {
                continue;
            };
            let Some(silent) = silent_of(e) else {
                // Without tcp_info its age is unknown: it does not count.
                *scan.unclocked.entry(c.id.clone()).or_default() += 1;
                continue;
            };
            let silent_ms = i64::from(silent) + aged;
            if silent_ms < th.detect.accumulate_close_wait_silent_ms {
                *scan.fresh.entry(c.id.clone()).or_default() += 1;
                continue;
            }
            scan.held.entry(c.id.clone()).or_default().push(Held {
                e,
                silent_ms,
                toward: toward_of(m, table, &c.id, e),
                peer: peer_of(m, table, e),
            });
        }
        scan
    }
}

/// A component's CLOSE_WAIT sockets that were seen but do not count.
#[derive(Clone, Copy)]
struct NotCounted {
    fresh: Option<u32>,
    unclocked: Option<u32>,
}

/// The finding of one component's held sockets, `socks` sorted the most silent first.
fn held_finding(
    m: &Correlator,
    c: &crate::model::Component,
    socks: &[Held],
    not_counted: NotCounted,
    aged: i64,
) -> Finding {
    let id = &c.id;
    let n = socks.len();
    let oldest = socks.first().map_or(0, |h| h.silent_ms);
    let newest = socks.last().map_or(0, |h| h.silent_ms);
    let groups = groups_toward(socks);
    let groups_text = groups_text(&groups);
    let silences = span(newest, oldest);
    let mut evidence = vec![held_headline(m, n, &groups_text, not_counted)];
    evidence.extend(listed_sockets(socks, aged));
    evidence.push(peers_evidence(socks));
    evidence.extend(fd_evidence(m, socks));
    Finding {
        kind: FindingKind::AccumulatingState,
        severity: Severity::Warning,
        component: Some(id.clone()),
        role: Some(c.role),
        summary: format!(
            "{id} holds {n} sockets in CLOSE_WAIT ({groups_text}), silent {silences}: the peer \
             hung up and it never closed them"
        ),
        requests: Vec::new(),
        evidence,
        explanation: Some(format!(
            "Seen in one look, no history needed: a socket in CLOSE_WAIT has received the \
             peer's FIN and waits for this process to close it, which a working program \
             does within milliseconds. These have been silent for {silences}, longer than any \
             close in progress: they are held. Each is an fd (and often a connection-pool \
             slot or a request) that is never released; when the pool or a limit runs dry \
             the component accepts requests and never forwards them, and a restart frees \
             everything so it works again for a while. Look for a response or connection \
             on the path {} that is not closed or released when the peer closes it.",
            groups.first().map_or("", |g| g.0)
        )),
    }
}

/// How many held sockets lead where, the biggest group first.
fn groups_toward<'h>(socks: &'h [Held]) -> Vec<(&'h str, usize)> {
    let mut by_toward: BTreeMap<&str, usize> = BTreeMap::new();
    for h in socks {
        *by_toward.entry(h.toward.as_str()).or_default() += 1;
    }
    let mut groups: Vec<(&str, usize)> = by_toward.into_iter().collect();
    groups.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
    groups
}

/// The three biggest groups by name; a leak toward many places stays one line.
fn groups_text(groups: &[(&str, usize)]) -> String {
    let mut named: Vec<String> = groups
        .iter()
        .take(3)
        .map(|(t, k)| format!("{k} {t}"))
        .collect();
    let elsewhere: usize = groups.iter().skip(3).map(|g| g.1).sum();
    if elsewhere > 0 {
        named.push(format!("{elsewhere} elsewhere"));
    }
    named.join(", ")
}

/// The first line: how many are held, where they lead, and those that do not count.
fn held_headline(m: &Correlator, n: usize, groups_text: &str, not_counted: NotCounted) -> Evidence {
    let th = &m.thresholds;
    Evidence::new(
        "sockets",
        format!(
            "one look, no history needed: {n} sockets in CLOSE_WAIT silent for at least {} \
             ({groups_text}); fires at {} such sockets (accumulate_close_wait_silent_min / \
             _ms){}{}",
            secs(th.detect.accumulate_close_wait_silent_ms),
            th.detect.accumulate_close_wait_silent_min,
            match not_counted.fresh {
                Some(k) => {
                    format!("; {k} more in CLOSE_WAIT for less (a close in progress, not counted)")
                }
                None => String::new(),
            },
            match not_counted.unclocked {
                Some(k) => format!("; {k} more without tcp_info (age unknown, not counted)"),
                None => String::new(),
            },
        ),
    )
}

/// The most silent sockets one by one, the rest summed up.
fn listed_sockets(socks: &[Held], aged: i64) -> Vec<Evidence> {
    let mut evidence: Vec<Evidence> = socks
        .iter()
        .take(LISTED_SOCKETS)
        .map(|h| Evidence::new("sockets", socket_line(h, aged)))
        .collect();
    if socks.len() > LISTED_SOCKETS {
        let rest = &socks[LISTED_SOCKETS..];
        let hi = rest.first().map_or(0, |h| h.silent_ms);
        let lo = rest.last().map_or(0, |h| h.silent_ms);
        evidence.push(Evidence::new(
            "sockets",
            format!(
                "... and {} more CLOSE_WAIT sockets silent {}",
                rest.len(),
                span(lo, hi)
            ),
        ));
    }
    evidence
}

/// One count per way the other end is described, in a stable order.
fn peers_evidence(socks: &[Held]) -> Evidence {
    let mut peers: BTreeMap<String, usize> = BTreeMap::new();
    for h in socks {
        *peers.entry(peer_text(h.peer)).or_default() += 1;
    }
    let gone = socks.iter().filter(|h| h.peer.gone()).count();
    Evidence::new(
        "sockets",
        format!(
            "fds held against peers that are gone: {gone} of {} ({})",
            socks.len(),
            peers
                .iter()
                .map(|(what, k)| format!("{what}: {k}"))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    )
}

/// "41 s" when the silences are within a second of each other, else "35 s to 41 s".
fn span(lo: i64, hi: i64) -> String {
    if hi - lo < 1000 {
        secs(hi)
    } else {
        format!("{} to {}", secs(lo), secs(hi))
    }
}

/// How the other end of a held socket is described, per socket and in the counts.
fn peer_text(p: Peer) -> String {
    match p {
        Peer::Gone => "peer socket gone".into(),
        Peer::Orphaned(st) => format!("peer closed by its process ({}, kernel only)", st.as_str()),
        Peer::HalfClosed(st, Some(pid)) => {
            format!(
                "peer half-closed ({}), still held by pid {pid}",
                st.as_str()
            )
        }
        Peer::HalfClosed(st, None) => format!("peer half-closed ({})", st.as_str()),
        Peer::Unknown => "peer not on this host".into(),
    }
}

/// "127.0.0.1:57930 -> 127.0.0.1:32156 (to router@...): CLOSE_WAIT, silent 41 s (...)".
fn socket_line(h: &Held, aged: i64) -> String {
    let e = h.e;
    let ago = |ms: u32| secs(i64::from(ms) + aged);
    let clocks = match e.tcp_info {
        Some(ti) => format!(
            "last byte in {} ago, last byte out {} ago, last ACK in {} ago; {} bytes in, {} out",
            ago(ti.last_data_recv_ms),
            ago(ti.last_data_sent_ms),
            ago(ti.last_ack_recv_ms),
            ti.bytes_received,
            ti.bytes_acked
        ),
        None => String::new(),
    };
    let peer = peer_text(h.peer);
    let holder = e
        .pid
        .map_or_else(String::new, |p| format!("; fd held by pid {p}"));
    format!(
        "{} -> {} ({}): CLOSE_WAIT, silent {} ({clocks}){holder}; {peer}",
        e.local,
        e.remote,
        h.toward,
        secs(h.silent_ms)
    )
}

/// "pid 13835 holds 60 open fds, 24 of them sockets in CLOSE_WAIT", when the processes
/// source read the fd counts.
fn fd_evidence(m: &Correlator, socks: &[Held]) -> Vec<Evidence> {
    let mut per_pid: BTreeMap<i32, usize> = BTreeMap::new();
    for h in socks {
        if let Some(p) = h.e.pid {
            *per_pid.entry(p).or_default() += 1;
        }
    }
    per_pid
        .into_iter()
        .filter_map(|(pid, k)| {
            let fds = m
                .latest_processes()
                .iter()
                .find(|p| p.pid == pid)?
                .fd_count?;
            Some(Evidence::new(
                "processes",
                format!("pid {pid} holds {fds} open fds, {k} of them sockets in CLOSE_WAIT"),
            ))
        })
        .collect()
}

#[cfg(test)]
mod tests;
