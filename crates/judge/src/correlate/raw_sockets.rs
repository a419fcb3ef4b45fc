//! The latest socket table as a snapshot's raw file (`raw/sockets.json`, and `raw.sockets`
//! of a daemon's answer): the stack's sockets the model keeps, without the closed
//! connections nobody owns (TIME_WAIT under churn), which are counted per component in a
//! note instead, as the recording leaves them out (`record::writer::trim_sockets`).

use super::Correlator;
use crate::model::addr::port_of;
use crate::model::{SocketEntry, TcpState};
use serde::Serialize;
use std::collections::BTreeMap;

/// A socket table of borrowed entries, serialized like `SocketTable`.
#[derive(Serialize)]
struct RawTable<'a> {
    sockets: Vec<&'a SocketEntry>,
    notes: Vec<String>,
}

/// Whether a socket is a closed connection owned by no process (counted, not listed).
fn closed_unowned(e: &SocketEntry) -> bool {
    e.state == TcpState::TimeWait && e.pid.is_none()
}

impl Correlator {
    /// The raw file of the latest table (None: no table yet).
    pub(super) fn raw_sockets(&self) -> Option<serde_json::Value> {
        let t = self.latest_sockets.as_ref()?;
        let mut closed: BTreeMap<&str, usize> = BTreeMap::new();
        let mut sockets = Vec::with_capacity(t.sockets.len());
        for e in &t.sockets {
            if closed_unowned(e) {
                *closed.entry(self.stack_end(e)).or_default() += 1;
            } else {
                sockets.push(e);
            }
        }
        let mut notes = t.notes.clone();
        if !closed.is_empty() {
            notes.push(closed_note(&closed));
        }
        serde_json::to_value(RawTable { sockets, notes }).ok()
    }

    /// The component a socket is at (its local, else its remote address is one the
    /// component listens on, in its namespace); "" when none is.
    fn stack_end(&self, e: &SocketEntry) -> &str {
        [&e.local, &e.remote]
            .into_iter()
            .filter_map(|a| port_of(a))
            .find_map(|p| self.topology.component_listening_in(e.netns, p))
            .map_or("", |c| c.id.as_str())
    }
}

/// `N closed connections (...) counted, not listed: <component> n, ...`.
fn closed_note(closed: &BTreeMap<&str, usize>) -> String {
    let total: usize = closed.values().sum();
    let per: Vec<String> = closed
        .iter()
        .map(|(c, n)| match *c {
            "" => format!("at no component {n}"),
            c => format!("{c} {n}"),
        })
        .collect();
    format!(
        "{total} closed connections (TIME_WAIT, owned by no process) counted, not listed: {}",
        per.join(", ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_closed_note_names_each_component_and_the_total() {
        let mut m = BTreeMap::new();
        m.insert("proxy@a", 6000);
        m.insert("", 3);
        m.insert("router@b", 40);
        let n = closed_note(&m);
        assert!(n.starts_with("6043 closed connections"), "{n}");
        assert!(
            n.ends_with("at no component 3, proxy@a 6000, router@b 40"),
            "{n}"
        );
    }
}
