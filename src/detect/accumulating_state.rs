//! `accumulating_state` (warning).
//!
//! Two ways to fire, so that one look is enough when there is no history:
//!
//! * **Growth** (history): over `accumulate_window_ms` (at least half of it covered, at least
//!   6 points), a component's established connections, CLOSE_WAIT sockets, open fds or threads
//!   grew by at least their minimum (the last third's minimum exceeds the first third's
//!   maximum by that much) and at least 80 % of the steps did not go down.
//! * **Held CLOSE_WAIT** (one look): in the newest socket table, at least
//!   `accumulate_close_wait_silent_min` sockets of the component are in CLOSE_WAIT and each
//!   has been silent (no byte and no ACK either way, from `tcp_info`) for at least
//!   `accumulate_close_wait_silent_ms`. Most incidents have no daemon running beforehand; the
//!   kernel's per-socket clocks carry the history the tool did not see. A normal close
//!   leaves CLOSE_WAIT within milliseconds, and a client pool that closes idle connections
//!   lazily holds a few (bounded by its size), so neither a handful of sockets nor fresh ones
//!   fire. When both ways fire on the same component's CLOSE_WAIT sockets, there is one
//!   finding (the growth one) carrying both evidences.
//!
//! What to do: something is opened and never released. CLOSE_WAIT means the peer hung up and
//! this process never closed: each leaked connection may be a forgotten request, and a pool
//! that counts them runs dry (a restart "unfreezes it for a round or two").
//!
//! Thresholds read: `accumulate_window_ms`, `accumulate_min_connections`,
//! `accumulate_min_close_wait`, `accumulate_min_fds`, `accumulate_min_threads`,
//! `accumulate_close_wait_silent_min`, `accumulate_close_wait_silent_ms`.

use super::secs;
use crate::clock::Millis;
use crate::correlate::{Model, View};
use crate::model::{Evidence, Finding, FindingKind, Severity, SocketEntry, SocketTable, TcpState};
use std::collections::BTreeMap;
use std::net::IpAddr;

/// The growth metric of CLOSE_WAIT sockets (also the key that merges the two ways).
const CLOSE_WAIT_SOCKETS: &str = "CLOSE_WAIT sockets";

/// Sockets listed one by one in the evidence (the most silent first); the rest are summed up.
const LISTED_SOCKETS: usize = 8;

/// `accumulating_state`: connections, CLOSE_WAIT sockets, fds or threads keep growing, or a
/// component holds many long-silent CLOSE_WAIT sockets right now.
pub fn accumulating_state(m: &Model, v: &View) -> Vec<Finding> {
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
fn growth(m: &Model, v: &View) -> Vec<(&'static str, Finding)> {
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

/// The other end of `e`, if this table can tell. The sockets source keeps every socket that
/// touches a component's listen port, so for a socket on such a port whose peer address is on
/// this host, an absent reversed 4-tuple means the peer socket is gone. Only asked of sockets
/// with `tcp_info`: their namespace was dumped whole by sock_diag (a `/proc/net/tcp` fallback
/// or a namespace that could not be read would make "absent" mean nothing).
fn peer_of(m: &Model, table: &SocketTable, e: &SocketEntry) -> Peer {
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
/// "from proxy@...", "to 10.0.0.9:443", "from 10.0.0.7" (a client's ephemeral port is left
/// out, so a hundred sockets from one client host are one group; each socket's line has it).
fn toward_of(m: &Model, table: &SocketTable, owner: &str, e: &SocketEntry) -> String {
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
fn held_close_wait(m: &Model, v: &View) -> Vec<Finding> {
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
    let mut held: BTreeMap<String, Vec<Held>> = BTreeMap::new();
    let mut fresh: BTreeMap<String, u32> = BTreeMap::new();
    let mut unclocked: BTreeMap<String, u32> = BTreeMap::new();
    for e in table
        .sockets
        .iter()
        .filter(|e| e.state == TcpState::CloseWait)
    {
        let Some(c) = e.pid.and_then(|p| m.topology().component_of_pid(p)) else {
            continue;
        };
        let Some(silent) = silent_of(e) else {
            // Read without tcp_info (another namespace through /proc/net/tcp): how long it
            // has been there is unknown, so it does not count.
            *unclocked.entry(c.id.clone()).or_default() += 1;
            continue;
        };
        let silent_ms = i64::from(silent) + aged;
        if silent_ms < th.detect.accumulate_close_wait_silent_ms {
            *fresh.entry(c.id.clone()).or_default() += 1;
            continue;
        }
        held.entry(c.id.clone()).or_default().push(Held {
            e,
            silent_ms,
            toward: toward_of(m, table, &c.id, e),
            peer: peer_of(m, table, e),
        });
    }
    let min = usize::try_from(th.detect.accumulate_close_wait_silent_min).unwrap_or(usize::MAX);
    let mut out = Vec::new();
    for (id, mut socks) in held {
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
        let n = socks.len();
        let oldest = socks.first().map_or(0, |h| h.silent_ms);
        let newest = socks.last().map_or(0, |h| h.silent_ms);
        let mut by_toward: BTreeMap<&str, usize> = BTreeMap::new();
        for h in &socks {
            *by_toward.entry(h.toward.as_str()).or_default() += 1;
        }
        let mut groups: Vec<(&str, usize)> = by_toward.into_iter().collect();
        groups.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
        // The three biggest groups by name; a leak toward many places stays one line.
        let mut named: Vec<String> = groups
            .iter()
            .take(3)
            .map(|(t, k)| format!("{k} {t}"))
            .collect();
        let elsewhere: usize = groups.iter().skip(3).map(|g| g.1).sum();
        if elsewhere > 0 {
            named.push(format!("{elsewhere} elsewhere"));
        }
        let groups_text = named.join(", ");
        let silences = span(newest, oldest);
        let mut evidence = vec![Evidence::new(
            "sockets",
            format!(
                "one look, no history needed: {n} sockets in CLOSE_WAIT silent for at least {} \
                 ({groups_text}); fires at {} such sockets (accumulate_close_wait_silent_min / \
                 _ms){}{}",
                secs(th.detect.accumulate_close_wait_silent_ms),
                th.detect.accumulate_close_wait_silent_min,
                match fresh.get(&id) {
                    Some(k) => format!(
                        "; {k} more in CLOSE_WAIT for less (a close in progress, not counted)"
                    ),
                    None => String::new(),
                },
                match unclocked.get(&id) {
                    Some(k) => format!("; {k} more without tcp_info (age unknown, not counted)"),
                    None => String::new(),
                },
            ),
        )];
        for h in socks.iter().take(LISTED_SOCKETS) {
            evidence.push(Evidence::new("sockets", socket_line(h, aged)));
        }
        if n > LISTED_SOCKETS {
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
        // One count per way the other end is described, in a stable order.
        let mut peers: BTreeMap<String, usize> = BTreeMap::new();
        for h in &socks {
            *peers.entry(peer_text(h.peer)).or_default() += 1;
        }
        let gone = socks.iter().filter(|h| h.peer.gone()).count();
        evidence.push(Evidence::new(
            "sockets",
            format!(
                "fds held against peers that are gone: {gone} of {n} ({})",
                peers
                    .iter()
                    .map(|(what, k)| format!("{what}: {k}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        ));
        evidence.extend(fd_evidence(m, &socks));
        out.push(Finding {
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
        });
    }
    out
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
fn fd_evidence(m: &Model, socks: &[Held]) -> Vec<Evidence> {
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
mod tests {
    use super::*;
    use crate::model::{
        Component, Payload, Role, Sample, SourceStatus, TcpInfo, Thresholds, Topology,
    };

    const T: Millis = 1_795_963_800_000;

    fn topo() -> Topology {
        let mut proxy = Component::new("proxy@127.0.0.1:8000", Role::Proxy, "generic");
        proxy.pids = vec![100];
        proxy.main_pid = Some(100);
        proxy.listen = vec!["127.0.0.1:8000".into()];
        let mut router = Component::new("router@127.0.0.1:30000", Role::Router, "sglang");
        router.pids = vec![200];
        router.main_pid = Some(200);
        router.listen = vec!["127.0.0.1:30000".into()];
        Topology {
            components: vec![proxy, router],
            edges: vec![],
        }
    }

    /// A proxy's upstream socket to the router in CLOSE_WAIT, silent `silent_ms`.
    fn close_wait(port: u16, silent_ms: u32) -> SocketEntry {
        SocketEntry {
            local: format!("127.0.0.1:{port}"),
            remote: "127.0.0.1:30000".into(),
            state: TcpState::CloseWait,
            rx_queue: 0,
            tx_queue: 0,
            inode: u64::from(port),
            uid: 0,
            pid: Some(100),
            netns: None,
            tcp_info: Some(TcpInfo {
                bytes_acked: 526,
                bytes_received: 3497,
                bytes_sent: 525,
                last_data_sent_ms: silent_ms + 400,
                last_data_recv_ms: silent_ms,
                last_ack_recv_ms: silent_ms,
                ..Default::default()
            }),
        }
    }

    /// The router's end of the same connection after its close (orphaned, no pid).
    fn fin_wait2(port: u16) -> SocketEntry {
        SocketEntry {
            local: "127.0.0.1:30000".into(),
            remote: format!("127.0.0.1:{port}"),
            state: TcpState::FinWait2,
            pid: None,
            inode: 0,
            tcp_info: None,
            ..close_wait(port, 0)
        }
    }

    fn run(sockets: Vec<SocketEntry>, th: Thresholds) -> Vec<Finding> {
        let mut m = Model::new(th);
        m.set_topology(topo());
        m.ingest(&Sample {
            t_ms: T,
            status: SourceStatus::ok(),
            took_ms: 3,
            payload: Payload::Sockets(SocketTable {
                sockets,
                notes: vec![],
            }),
        });
        // One second after the table: its "ms ago" values have aged by that much.
        let v = m.view(T + 1000);
        accumulating_state(&m, &v)
    }

    #[test]
    fn many_long_silent_close_wait_sockets_fire_in_one_look() {
        let mut s: Vec<SocketEntry> = (0..24u16)
            .map(|i| close_wait(41000 + i, 40_000 + u32::from(i) * 1000))
            .collect();
        // Half the router's ends are still in FIN_WAIT2, the others gone.
        s.extend((0..12u16).map(|i| fin_wait2(41000 + i)));
        let fs = run(s, Thresholds::default());
        assert_eq!(fs.len(), 1, "{fs:#?}");
        let f = &fs[0];
        assert_eq!(f.kind, FindingKind::AccumulatingState);
        assert_eq!(f.component.as_deref(), Some("proxy@127.0.0.1:8000"));
        assert!(
            f.summary.contains("holds 24 sockets in CLOSE_WAIT")
                && f.summary.contains("24 to router@127.0.0.1:30000")
                && f.summary.contains("silent 41 s to 64 s"),
            "{}",
            f.summary
        );
        let ev: Vec<&str> = f.evidence.iter().map(|e| e.detail.as_str()).collect();
        let all = ev.join("\n");
        assert!(all.contains("one look, no history needed"), "{all}");
        // The most silent socket first, with its clocks (aged by the second since the table).
        assert!(
            ev[1].starts_with("127.0.0.1:41023 -> 127.0.0.1:30000 (to router@127.0.0.1:30000): CLOSE_WAIT, silent 64 s")
                && ev[1].contains("last byte out 64 s ago")
                && ev[1].contains("fd held by pid 100")
                && ev[1].contains("peer socket gone"),
            "{}",
            ev[1]
        );
        assert!(all.contains("... and 16 more CLOSE_WAIT sockets"), "{all}");
        assert!(
            all.contains("fds held against peers that are gone: 24 of 24 (peer closed by its process (FIN_WAIT2, kernel only): 12, peer socket gone: 12)"),
            "{all}"
        );
    }

    #[test]
    fn a_handful_or_fresh_ones_do_not_fire() {
        // A few long-silent ones: a client pool closing idle connections lazily.
        let few: Vec<SocketEntry> = (0..5u16).map(|i| close_wait(41000 + i, 600_000)).collect();
        assert!(run(few, Thresholds::default()).is_empty());
        // Many, but fresh: closes in progress under load.
        let fresh: Vec<SocketEntry> = (0..40u16).map(|i| close_wait(41000 + i, 20)).collect();
        assert!(run(fresh, Thresholds::default()).is_empty());
        // Many just under the silence threshold (the table's age counts).
        let under: Vec<SocketEntry> = (0..40u16).map(|i| close_wait(41000 + i, 28_900)).collect();
        assert!(run(under, Thresholds::default()).is_empty());
    }

    #[test]
    fn without_tcp_info_the_age_is_unknown_and_nothing_fires() {
        let s: Vec<SocketEntry> = (0..30u16)
            .map(|i| SocketEntry {
                tcp_info: None,
                ..close_wait(41000 + i, 0)
            })
            .collect();
        assert!(run(s, Thresholds::default()).is_empty());
    }

    #[test]
    fn thresholds_are_configurable() {
        let s: Vec<SocketEntry> = (0..4u16).map(|i| close_wait(41000 + i, 6_000)).collect();
        let th = Thresholds::from_toml(
            "accumulate_close_wait_silent_min = 3\naccumulate_close_wait_silent_ms = 5000\n",
        )
        .expect("thresholds");
        let fs = run(s.clone(), th);
        assert_eq!(fs.len(), 1, "{fs:#?}");
        assert!(fs[0].evidence[0].detail.contains("fires at 3"), "{fs:#?}");
        assert!(run(s, Thresholds::default()).is_empty());
    }

    /// A socket table captured from the lab (`tests/fixtures/sockets/`, see its `source`),
    /// ingested at its time and looked at right then.
    fn lab_capture(json: &str, th: Thresholds) -> Vec<Finding> {
        let v: serde_json::Value = serde_json::from_str(json).expect("fixture JSON");
        let t = v["taken_at_ms"].as_i64().expect("taken_at_ms");
        let topo: Topology = serde_json::from_value(v["topology"].clone()).expect("topology");
        let table: SocketTable = serde_json::from_value(v["sockets"].clone()).expect("sockets");
        let mut m = Model::new(th);
        m.set_topology(topo);
        m.ingest(&Sample {
            t_ms: t,
            status: SourceStatus::ok(),
            took_ms: 3,
            payload: Payload::Sockets(table),
        });
        accumulating_state(&m, &m.view(t))
    }

    const HELD: &str = include_str!("../../tests/fixtures/sockets/close-wait-held.json");
    const FRESH: &str = include_str!("../../tests/fixtures/sockets/close-wait-fresh.json");

    #[test]
    fn lab_capture_of_held_close_wait_names_the_proxy() {
        let fs = lab_capture(HELD, Thresholds::default());
        assert_eq!(fs.len(), 1, "{fs:#?}");
        let f = &fs[0];
        assert_eq!(f.component.as_deref(), Some("proxy@127.0.0.1:27318"));
        assert_eq!(f.role, Some(Role::Proxy));
        assert_eq!(
            f.summary,
            "proxy@127.0.0.1:27318 holds 24 sockets in CLOSE_WAIT (24 to router@127.0.0.1:22291), \
             silent 39 s to 40 s: the peer hung up and it never closed them"
        );
        let lines: Vec<&str> = f.evidence.iter().map(|e| e.detail.as_str()).collect();
        let listed: Vec<&&str> = lines
            .iter()
            .filter(|l| {
                l.contains(
                    "-> 127.0.0.1:22291 (to router@127.0.0.1:22291): CLOSE_WAIT, silent 40 s",
                )
            })
            .collect();
        assert_eq!(listed.len(), LISTED_SOCKETS, "{lines:#?}");
        assert!(
            listed.iter().all(|l| l.contains("fd held by pid 6071")
                && l.ends_with("peer closed by its process (FIN_WAIT2, kernel only)")),
            "{listed:#?}"
        );
        assert!(
            lines.contains(&"fds held against peers that are gone: 24 of 24 (peer closed by its process (FIN_WAIT2, kernel only): 24)"),
            "{lines:#?}"
        );
    }

    #[test]
    fn lab_capture_of_the_same_leak_seconds_old_says_nothing_yet() {
        assert!(lab_capture(FRESH, Thresholds::default()).is_empty());
        // The same 24 sockets count once they are old enough: age, not count, held it back.
        let mut th = Thresholds::default();
        th.detect.accumulate_close_wait_silent_ms = 3000;
        let fs = lab_capture(FRESH, th);
        assert_eq!(fs.len(), 1, "{fs:#?}");
        assert!(
            fs[0].summary.contains("holds 24 sockets"),
            "{}",
            fs[0].summary
        );
    }

    #[test]
    fn growth_and_held_sockets_on_one_component_are_one_finding() {
        // A daemon watching the leak for 6 minutes: one more held socket every 10 s.
        let mut m = Model::new(Thresholds::default());
        m.set_topology(topo());
        for i in 0..36u16 {
            let sockets = (0..i)
                .map(|j| close_wait(41000 + j, u32::from(i - j) * 10_000))
                .collect();
            m.ingest(&Sample {
                t_ms: T + i64::from(i) * 10_000,
                status: SourceStatus::ok(),
                took_ms: 3,
                payload: Payload::Sockets(SocketTable {
                    sockets,
                    notes: vec![],
                }),
            });
        }
        let v = m.view(T + 350_000);
        let fs = accumulating_state(&m, &v);
        assert_eq!(fs.len(), 1, "{fs:#?}");
        assert!(
            fs[0].summary.contains("CLOSE_WAIT sockets grew from"),
            "{}",
            fs[0].summary
        );
        assert!(
            fs[0].evidence.iter().any(|e| e
                .detail
                .starts_with("one look, no history needed: 33 sockets")),
            "{:#?}",
            fs[0].evidence
        );
    }

    #[test]
    fn a_stale_table_says_nothing_about_now() {
        let s: Vec<SocketEntry> = (0..24u16).map(|i| close_wait(41000 + i, 60_000)).collect();
        let mut m = Model::new(Thresholds::default());
        m.set_topology(topo());
        m.ingest(&Sample {
            t_ms: T,
            status: SourceStatus::ok(),
            took_ms: 3,
            payload: Payload::Sockets(SocketTable {
                sockets: s,
                notes: vec![],
            }),
        });
        let v = m.view(T + 3_600_000);
        assert!(!v.sockets_fresh);
        assert!(accumulating_state(&m, &v).is_empty());
    }

    #[test]
    fn inbound_sockets_name_their_client_and_unknown_peers_are_not_called_gone() {
        // The router holds connections from the proxy (whose end is still there, FIN_WAIT2)
        // and to a host elsewhere (cannot be judged from here).
        let mut s = Vec::new();
        for i in 0..3u16 {
            s.push(SocketEntry {
                local: "127.0.0.1:30000".into(),
                remote: format!("127.0.0.1:{}", 42000 + i),
                pid: Some(200),
                ..close_wait(0, 50_000)
            });
            s.push(SocketEntry {
                local: format!("127.0.0.1:{}", 42000 + i),
                remote: "127.0.0.1:30000".into(),
                state: TcpState::FinWait2,
                pid: Some(100),
                ..close_wait(0, 0)
            });
            s.push(SocketEntry {
                local: format!("10.0.0.5:{}", 43000 + i),
                remote: "10.0.0.9:443".into(),
                pid: Some(200),
                ..close_wait(0, 50_000)
            });
        }
        // An outside client (its socket is on its own host): one group whatever its ports.
        for i in 0..2u16 {
            s.push(SocketEntry {
                local: "127.0.0.1:30000".into(),
                remote: format!("10.0.0.7:{}", 50000 + i),
                pid: Some(200),
                ..close_wait(0, 50_000)
            });
        }
        let mut th = Thresholds::default();
        th.detect.accumulate_close_wait_silent_min = 8;
        let fs = run(s, th);
        assert_eq!(fs.len(), 1, "{fs:#?}");
        assert!(
            fs[0]
                .summary
                .contains("(3 from proxy@127.0.0.1:8000, 3 to 10.0.0.9:443, 2 from 10.0.0.7)"),
            "{}",
            fs[0].summary
        );
        let all: Vec<&str> = fs[0].evidence.iter().map(|e| e.detail.as_str()).collect();
        assert!(
            all.iter().any(|d| d.contains(
                "0 of 8 (peer half-closed (FIN_WAIT2), still held by pid 100: 3, peer not on this host: 5)"
            )),
            "{all:#?}"
        );
    }

    #[test]
    fn a_leak_toward_many_places_names_the_biggest_three() {
        let mut s = Vec::new();
        for (i, host) in [
            "10.0.0.9",
            "10.0.0.9",
            "10.0.0.9",
            "10.0.0.10",
            "10.0.0.11",
            "10.0.0.12",
        ]
        .iter()
        .enumerate()
        {
            s.push(SocketEntry {
                local: format!("127.0.0.1:{}", 44000 + i),
                remote: format!("{host}:443"),
                ..close_wait(0, 50_000)
            });
        }
        let mut th = Thresholds::default();
        th.detect.accumulate_close_wait_silent_min = 6;
        let fs = run(s, th);
        assert_eq!(fs.len(), 1, "{fs:#?}");
        assert!(
            fs[0].summary.contains(
                "(3 to 10.0.0.9:443, 1 to 10.0.0.10:443, 1 to 10.0.0.11:443, 1 elsewhere)"
            ),
            "{}",
            fs[0].summary
        );
    }
}
