//! The sockets source's latest dump of our own network namespace, kept for a reader that can
//! use one a few seconds old (the daemon's rediscovery): a dump's cost is mostly the kernel's
//! fixed walk of its socket hash (docs/performance-log.md).

use crate::model::{SocketEntry, TcpState};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A dump kept no more often than this: copying one is cheap beside a dump, not free.
const KEEP_EVERY: Duration = Duration::from_secs(1);

/// The latest dump of our own namespace (TIME_WAIT sockets left out), and how old a
/// reader takes it.
#[derive(Debug)]
pub struct RecentDump {
    max_age: Duration,
    latest: Mutex<Option<Kept>>,
}

#[derive(Debug)]
struct Kept {
    taken: Instant,
    sockets: Arc<Vec<SocketEntry>>,
}

impl RecentDump {
    /// A reader takes a kept dump while it is at most `max_age` old.
    pub fn new(max_age: Duration) -> RecentDump {
        RecentDump {
            max_age,
            latest: Mutex::new(None),
        }
    }

    /// Keeps a copy of a complete dump of our own namespace taken at `taken`, unless the
    /// one kept is younger than [`KEEP_EVERY`].
    pub fn offer(&self, taken: Instant, sockets: &[SocketEntry]) {
        let Ok(mut latest) = self.latest.lock() else {
            return;
        };
        if latest
            .as_ref()
            .is_some_and(|k| taken.saturating_duration_since(k.taken) < KEEP_EVERY)
        {
            return;
        }
        let copy: Vec<SocketEntry> = sockets
            .iter()
            .filter(|e| e.state != TcpState::TimeWait)
            .cloned()
            .collect();
        *latest = Some(Kept {
            taken,
            sockets: Arc::new(copy),
        });
    }

    /// The kept dump, if it is at most `max_age` old at `now`.
    pub fn latest(&self, now: Instant) -> Option<Arc<Vec<SocketEntry>>> {
        let latest = self.latest.lock().ok()?;
        let k = latest.as_ref()?;
        (now.saturating_duration_since(k.taken) <= self.max_age).then(|| Arc::clone(&k.sockets))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(port: u16, state: TcpState) -> SocketEntry {
        SocketEntry {
            local: format!("127.0.0.1:{port}"),
            remote: "0.0.0.0:0".into(),
            state,
            rx_queue: 0,
            tx_queue: 0,
            inode: u64::from(port),
            uid: 0,
            pid: None,
            netns: None,
            tcp_info: None,
        }
    }

    #[test]
    fn a_kept_dump_is_taken_only_while_young_enough() {
        let r = RecentDump::new(Duration::from_secs(3));
        let t0 = Instant::now();
        assert!(r.latest(t0).is_none(), "nothing kept yet");
        r.offer(t0, &[entry(8000, TcpState::Listen)]);
        assert_eq!(
            r.latest(t0 + Duration::from_secs(3)).map(|v| v.len()),
            Some(1)
        );
        assert!(
            r.latest(t0 + Duration::from_millis(3001)).is_none(),
            "too old"
        );
    }

    #[test]
    fn time_wait_sockets_are_left_out_and_copies_are_spaced() {
        let r = RecentDump::new(Duration::from_secs(10));
        let t0 = Instant::now();
        r.offer(
            t0,
            &[entry(1, TcpState::Listen), entry(2, TcpState::TimeWait)],
        );
        let kept = r.latest(t0).expect("kept");
        assert_eq!(kept.len(), 1);
        assert_eq!(kept[0].state, TcpState::Listen);
        // Within KEEP_EVERY the older copy stays; after it, the new one replaces it.
        let three = [1, 2, 3].map(|p| entry(p, TcpState::Established));
        r.offer(t0 + Duration::from_millis(500), &three);
        assert_eq!(r.latest(t0).map(|v| v.len()), Some(1));
        r.offer(t0 + KEEP_EVERY, &three);
        assert_eq!(r.latest(t0 + KEEP_EVERY).map(|v| v.len()), Some(3));
    }
}
