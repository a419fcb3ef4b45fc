//! Response progress, thinned: a streaming socket's counters move in every sample, but replay
//! needs only that the response still moves, long before a stall counts. So a socket whose only
//! news is more of its response (bytes acked or sent, "ms since" times) is written again at
//! most every [`PROGRESS_EVERY_MS`], the sample carrying the values last written in between.
//! Written at once: a new socket, a change of state, owner or inode, new request bytes, and the
//! response's first bytes beyond headers (`HEADERS_ONLY_MAX_BYTES`: they decide "answered").

use crate::clock::Millis;
use crate::correlate::HEADERS_ONLY_MAX_BYTES;
use crate::model::{SocketEntry, SocketTable, TcpInfo};
use std::collections::HashMap;

/// Longest a socket's response progress goes unwritten.
pub const PROGRESS_EVERY_MS: Millis = 5_000;

type Key = (Option<u64>, String, String);

/// A socket as last written, and when.
#[derive(Debug, Clone)]
struct Written {
    entry: SocketEntry,
    t_ms: Millis,
}

/// The sockets last written of one recording (reset with its delta state at a new segment).
#[derive(Debug, Default)]
pub struct Progress {
    last: HashMap<Key, Written>,
}

impl Progress {
    pub fn reset(&mut self) {
        self.last.clear();
    }

    /// Puts back the last written values of each socket whose only news at `t` is response
    /// progress younger than [`PROGRESS_EVERY_MS`]; remembers what is written.
    pub fn thin(&mut self, t: Millis, table: &mut SocketTable) {
        let mut next = HashMap::with_capacity(table.sockets.len());
        for e in table.sockets.iter_mut() {
            let key = (e.netns, e.local.clone(), e.remote.clone());
            let w = match self.last.remove(&key) {
                Some(w) if nothing_moved(&w.entry, e) => {
                    *e = as_of(&w, t);
                    w
                }
                Some(w) if only_progress(&w.entry, e) && t - w.t_ms < PROGRESS_EVERY_MS => {
                    *e = as_of(&w, t);
                    w
                }
                _ => Written {
                    entry: e.clone(),
                    t_ms: t,
                },
            };
            next.insert(key, w);
        }
        self.last = next;
    }
}

/// Whether `new` is `old` again but for its "ms since" times (which move by more than a tick:
/// the dump reaches the socket after the sample is stamped): no byte moved.
fn nothing_moved(old: &SocketEntry, new: &SocketEntry) -> bool {
    let bytes = |i: &TcpInfo| (i.bytes_acked, i.bytes_received, i.bytes_sent);
    match (old.tcp_info, new.tcp_info) {
        (Some(o), Some(n)) => {
            bytes(&o) == bytes(&n)
                && SocketEntry {
                    tcp_info: None,
                    ..old.clone()
                } == SocketEntry {
                    tcp_info: None,
                    ..new.clone()
                }
        }
        _ => false,
    }
}

/// Whether `new` differs from `old` only by more of its response.
fn only_progress(old: &SocketEntry, new: &SocketEntry) -> bool {
    let same = old.state == new.state
        && old.pid == new.pid
        && old.inode == new.inode
        && old.rx_queue == new.rx_queue
        && old.tx_queue == new.tx_queue
        && old.uid == new.uid;
    match (old.tcp_info, new.tcp_info) {
        (Some(o), Some(n)) => {
            same && o.bytes_received == n.bytes_received
                && o.bytes_acked.max(o.bytes_sent) > HEADERS_ONLY_MAX_BYTES
                && (o.rtt_us, o.retransmits, o.unacked) == (n.rtt_us, n.retransmits, n.unacked)
        }
        _ => false,
    }
}

/// The socket as written at `w.t_ms`, seen from `t`: the same counters, its "ms since"
/// times grown by the time passed (the same absolute times).
fn as_of(w: &Written, t: Millis) -> SocketEntry {
    let dt = u32::try_from(t.saturating_sub(w.t_ms)).unwrap_or(u32::MAX);
    let grow = |ms: u32| ms.saturating_add(dt);
    let tcp_info = w.entry.tcp_info.map(|i| TcpInfo {
        last_data_sent_ms: grow(i.last_data_sent_ms),
        last_data_recv_ms: grow(i.last_data_recv_ms),
        last_ack_recv_ms: grow(i.last_ack_recv_ms),
        ..i
    });
    SocketEntry {
        tcp_info,
        ..w.entry.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::TcpState;

    fn sock(remote: &str, received: u64, acked: u64, ago: u32) -> SocketEntry {
        SocketEntry {
            local: "127.0.0.1:30000".into(),
            remote: remote.into(),
            state: TcpState::Established,
            rx_queue: 0,
            tx_queue: 0,
            inode: 9,
            uid: 0,
            pid: Some(7),
            netns: None,
            tcp_info: Some(TcpInfo {
                bytes_acked: acked,
                bytes_received: received,
                last_data_sent_ms: ago,
                last_data_recv_ms: 800,
                last_ack_recv_ms: ago,
                ..TcpInfo::default()
            }),
        }
    }

    fn recv_ago(mut s: SocketEntry, ms: u32) -> SocketEntry {
        if let Some(i) = s.tcp_info.as_mut() {
            i.last_data_recv_ms = ms;
        }
        s
    }

    fn table(s: Vec<SocketEntry>) -> SocketTable {
        SocketTable {
            sockets: s,
            notes: Vec::new(),
        }
    }

    #[test]
    fn progress_is_written_every_few_seconds_news_at_once() {
        let mut p = Progress::default();
        let mut t0 = table(vec![sock("a:1", 900, 1000, 5), sock("b:1", 900, 200, 5)]);
        p.thin(10_000, &mut t0);
        // a second later: both streamed more; b's first body bytes; a new request on c
        let mut t1 = table(vec![
            sock("a:1", 900, 3000, 3),
            sock("b:1", 900, 700, 3),
            sock("c:1", 500, 0, 9),
        ]);
        p.thin(11_000, &mut t1);
        // a: the values of 10 s, its times as seen a second later
        assert_eq!(t1.sockets[0], recv_ago(sock("a:1", 900, 1000, 1005), 1800));
        assert_eq!(
            t1.sockets[1],
            sock("b:1", 900, 700, 3),
            "beyond headers: at once"
        );
        assert_eq!(t1.sockets[2], sock("c:1", 500, 0, 9), "new: at once");
        // a new request on a, and a's progress once PROGRESS_EVERY_MS passed
        let mut t2 = table(vec![sock("a:1", 1800, 3000, 3)]);
        p.thin(12_000, &mut t2);
        assert_eq!(t2.sockets[0], sock("a:1", 1800, 3000, 3));
        let mut t3 = table(vec![sock("a:1", 1800, 9000, 1)]);
        p.thin(12_000 + PROGRESS_EVERY_MS, &mut t3);
        assert_eq!(t3.sockets[0], sock("a:1", 1800, 9000, 1));
        // nothing moved: the times stay the ones written (seen 100 ms later), though the
        // dump read them 30 ms late
        let mut t5 = table(vec![sock("a:1", 1800, 9000, 131)]);
        p.thin(12_000 + PROGRESS_EVERY_MS + 100, &mut t5);
        assert_eq!(t5.sockets[0], recv_ago(sock("a:1", 1800, 9000, 101), 900));
        // a state change is written at once
        let mut closing = sock("a:1", 1800, 9100, 1);
        closing.state = TcpState::CloseWait;
        let mut t4 = table(vec![closing.clone()]);
        p.thin(12_000 + PROGRESS_EVERY_MS + 250, &mut t4);
        assert_eq!(t4.sockets[0], closing);
    }
}
