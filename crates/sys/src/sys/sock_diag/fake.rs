//! A [`SockDiag`] that answers from tables given to it: tests of the sockets source drive
//! it with known sockets, failures and namespaces.

use super::{Dump, SockDiag, SockDiagError};
use crate::model::{SocketEntry, TcpState};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Answers [`SockDiag::dump`] with `own` and [`SockDiag::dump_netns_of`] with `by_pid`.
#[derive(Debug, Clone)]
pub struct FakeSockDiag {
    /// Our namespace's sockets; Err: the dump fails with that text.
    pub own: Result<Vec<SocketEntry>, String>,
    /// Other namespaces' sockets, by a pid that lives there; a pid not listed cannot be
    /// entered.
    pub by_pid: BTreeMap<i32, Vec<SocketEntry>>,
    /// Dumps asked for so far (clones share the count).
    pub dumps: Arc<AtomicUsize>,
}

impl Default for FakeSockDiag {
    fn default() -> Self {
        FakeSockDiag {
            own: Ok(Vec::new()),
            by_pid: BTreeMap::new(),
            dumps: Arc::default(),
        }
    }
}

impl FakeSockDiag {
    /// A fake whose own namespace holds `sockets`.
    pub fn with(sockets: Vec<SocketEntry>) -> Self {
        FakeSockDiag {
            own: Ok(sockets),
            ..FakeSockDiag::default()
        }
    }

    fn answer(&self, sockets: &[SocketEntry], time_wait: bool) -> Dump {
        self.dumps.fetch_add(1, Ordering::SeqCst);
        Dump {
            sockets: sockets
                .iter()
                .filter(|s| time_wait || s.state != TcpState::TimeWait)
                .cloned()
                .collect(),
            undecoded: 0,
        }
    }
}

impl SockDiag for FakeSockDiag {
    fn dump(&self, _timeout: Duration, time_wait: bool) -> Result<Dump, SockDiagError> {
        match &self.own {
            Ok(s) => Ok(self.answer(s, time_wait)),
            Err(e) => Err(SockDiagError::Fake(e.clone())),
        }
    }

    fn dump_netns_of(
        &self,
        pid: i32,
        _timeout: Duration,
        time_wait: bool,
    ) -> Result<Dump, SockDiagError> {
        match self.by_pid.get(&pid) {
            Some(s) => Ok(self.answer(s, time_wait)),
            None => Err(SockDiagError::Fake(format!(
                "fake: cannot enter the namespace of pid {pid}"
            ))),
        }
    }
}
