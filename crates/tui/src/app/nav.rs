//! Moving around: what j/k/PgDn/g/G do in each tab, the Overview's finding cursor, and the
//! stuck-first orders applied after `derive`. Kept apart from `mod.rs` (keys to actions) and
//! `derived.rs` (what the tabs list).

use super::cursor::finding_rows;
use super::metric_order::metrics_key_facts_first;
use super::order::{changes_subject_first, connections_stuck_first, threads_stuck_first};
use super::{finding_key, App, Tab};

impl App {
    /// Everything that depends on the derived lists: stuck-first and subject-first orders, the Overview's
    /// rows (the cursor stays on the same finding and item across frames), selections.
    pub(super) fn after_derive(&mut self) {
        let keep = self.pending_cursor.take().or_else(|| self.cursor_key());
        let subject = self.subject_of_views();
        if let Some(f) = &self.current {
            let s = &f.snapshot;
            let subject = subject.as_deref();
            threads_stuck_first(s, &mut self.derived.threads);
            connections_stuck_first(s, &self.derived.rows, &mut self.derived.connections);
            changes_subject_first(s, subject, &mut self.derived.changes);
            metrics_key_facts_first(s, subject, &mut self.derived.metric_lines);
            let expanded = &self.expanded;
            let chains = &self.derived.finding_chains;
            self.finding_rows = finding_rows(
                s,
                &self.derived.findings,
                |f| expanded.contains(&finding_key(f)),
                |fi| chains.get(fi).copied().flatten(),
            );
        } else {
            self.finding_rows.clear();
        }
        if let Some((key, item)) = keep {
            self.put_cursor(&key, item);
        }
        self.clamp_selection();
    }

    /// The finding (by its stable key) and item the Overview's cursor is on.
    pub(super) fn cursor_key(&self) -> Option<(String, Option<usize>)> {
        let row = self
            .finding_rows
            .get(self.selected[Tab::Overview.index()])?;
        let f = self.snapshot()?.findings.get(row.finding)?;
        Some((finding_key(f), row.item))
    }

    /// Puts the Overview's cursor on `item` of the finding with `key` (its own line when the
    /// item is gone); leaves it where it is when the finding is gone.
    fn put_cursor(&mut self, key: &str, item: Option<usize>) {
        let Some(s) = self.current.as_ref().map(|f| &f.snapshot) else {
            return;
        };
        let is_key = |fi: usize| s.findings.get(fi).is_some_and(|f| finding_key(f) == key);
        let pos = self
            .finding_rows
            .iter()
            .position(|r| is_key(r.finding) && r.item == item)
            .or_else(|| {
                self.finding_rows
                    .iter()
                    .position(|r| is_key(r.finding) && r.item.is_none())
            });
        if let Some(p) = pos {
            self.selected[Tab::Overview.index()] = p;
        }
    }

    /// Enter in the Overview: expands or folds the finding the cursor is in, and puts the
    /// cursor on its line.
    pub(super) fn toggle_finding(&mut self) {
        let Some((key, _)) = self.cursor_key() else {
            return;
        };
        if !self.expanded.remove(&key) {
            self.expanded.insert(key.clone());
        }
        self.after_derive();
        self.put_cursor(&key, None);
    }

    /// Lines of the open detail pane that scrolls with j/k (request hops, thread frames,
    /// component detail); `None` when j/k move the selection instead.
    fn scrolling_detail_len(&self) -> Option<usize> {
        if !self.detail {
            return None;
        }
        let s = self.snapshot()?;
        let sel = self.selected();
        match self.tab {
            // The frames pane: its title, the deciding rule, one line per frame.
            Tab::Threads => {
                let t = s.threads.get(*self.derived.threads.get(sel)?)?;
                Some(1 + usize::from(t.rule.is_some()) + t.frames.len().max(1))
            }
            // The hops pane: its title, one line per hop, one per finding naming them.
            Tab::Requests => {
                let row = self
                    .derived
                    .rows
                    .get(*self.derived.request_order.get(sel)?)?;
                Some(self.derived.hop_detail_len(s, row.chain))
            }
            Tab::Components => {
                let c = s.components.get(sel)?;
                Some(super::component_facts(s, c).len())
            }
            _ => None,
        }
    }

    /// The Components tab opens on the hop of the most severe finding (what the on-call
    /// engineer opens it for), unless the selection was moved there before.
    pub(super) fn select_worst_component(&mut self) {
        if self.selected[Tab::Components.index()] != 0 {
            return;
        }
        let Some(s) = self.snapshot() else {
            return;
        };
        let worst = super::follow::worst_component(s)
            .and_then(|c| s.components.iter().position(|x| x.id == c));
        if let Some(i) = worst {
            self.selected[Tab::Components.index()] = i;
        }
    }

    /// The Sockets tab's cursor runs over the summary's components, then the connections
    /// (k above the first connection scrolls a summary cut at 80x24). The connection under
    /// it (position in `derived.connections`), if it is on one.
    pub fn selected_connection(&self) -> Option<usize> {
        let n = self.derived.socket_components.len();
        let sel = self.selected[Tab::Sockets.index()];
        (sel >= n && sel - n < self.derived.connections.len()).then(|| sel - n)
    }

    /// The summary component under the Sockets cursor (position in
    /// `derived.socket_components`), if it is on one.
    pub fn selected_socket_component(&self) -> Option<usize> {
        let sel = self.selected[Tab::Sockets.index()];
        (sel < self.derived.socket_components.len()).then_some(sel)
    }

    /// The Sockets tab opens on the first connection (held by a stuck request, if any),
    /// unless the cursor was moved there before.
    pub(super) fn select_first_connection(&mut self) {
        let i = Tab::Sockets.index();
        if self.selected[i] == 0 && !self.derived.connections.is_empty() {
            self.selected[i] = self.derived.socket_components.len();
        }
    }

    /// j/k/PgDn/PgUp/g/G: scroll the open detail pane, else move the selection.
    pub(super) fn move_selection(&mut self, delta: i64) {
        if let Some(len) = self.scrolling_detail_len() {
            let last = len.saturating_sub(self.detail_viewport.get().max(1));
            let target = (self.detail_scroll as i64).saturating_add(delta);
            self.detail_scroll = target.clamp(0, last as i64) as usize;
            return;
        }
        let len = self.tab_len(self.tab);
        let s = &mut self.selected[self.tab.index()];
        let target = (*s as i64).saturating_add(delta);
        *s = target.clamp(0, len.saturating_sub(1) as i64) as usize;
    }
}
