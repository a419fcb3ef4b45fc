//! The UI state (model) and key handling. Pure: no terminal, no I/O except the snapshot
//! writer the caller plugs in. Rendering lives in `render/` and only reads this state.

mod cause;
mod change_fold;
mod component;
mod cursor;
mod derived;
mod follow;
mod history;
mod metric_order;
mod nav;
mod order;

pub use cause::{Cause, CauseChange, CauseEffect};
pub use component::{component_facts, host_versions, Fact};
pub use cursor::{items, FindingRow, Item};
pub use derived::{derive, in_flight, lane_of, request_role, Derived, Lane, RequestRow, LANES};
use follow::Jump;
pub use history::{GpuPoint, HistoryPoint};

use super::feed::{FeedFrame, FeedState, ReplayCommand, SamplerHealth};
use crate::clock::{Clock, SystemClock};
use crate::model::{Finding, Snapshot};
use ratatui::crossterm::event::{KeyCode, KeyEvent, KeyModifiers};
use std::cell::Cell;
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::path::PathBuf;
use std::sync::Arc;

/// Writes a snapshot bundle of what is on screen and returns where it went. The integrator
/// plugs `snapshot::write_bundle` in here; the UI shows the path or the error.
pub type SnapshotWriter = Box<dyn FnMut(&Snapshot) -> Result<PathBuf, String> + Send>;

/// How the app behaves. `Default` is colours on, no snapshot writer, system clock.
pub struct AppOptions {
    /// No colours at all (the `NO_COLOR` convention); bold/reverse still mark selection.
    pub no_color: bool,
    /// How many past frames feed the sparklines.
    pub history_len: usize,
    /// Called on `s`.
    pub snapshot_writer: Option<SnapshotWriter>,
    /// Time for the replay feed and the status line.
    pub clock: Arc<dyn Clock>,
    /// How long `run` waits for a key before pulling the feed again.
    pub tick_ms: u64,
}

impl Default for AppOptions {
    fn default() -> Self {
        AppOptions {
            no_color: false,
            history_len: 120,
            snapshot_writer: None,
            clock: Arc::new(SystemClock),
            tick_ms: 100,
        }
    }
}

impl AppOptions {
    /// Defaults, with `no_color` from the environment: `NO_COLOR` set and non-empty.
    pub fn from_env() -> Self {
        AppOptions {
            no_color: std::env::var_os("NO_COLOR").is_some_and(|v| !v.is_empty()),
            ..AppOptions::default()
        }
    }
}

impl std::fmt::Debug for AppOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AppOptions")
            .field("no_color", &self.no_color)
            .field("history_len", &self.history_len)
            .field("snapshot_writer", &self.snapshot_writer.is_some())
            .field("tick_ms", &self.tick_ms)
            .finish()
    }
}

/// What the caller of [`App::handle_key`] has to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    None,
    Quit,
    /// Forward to the feed (replay keys).
    Replay(ReplayCommand),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Tab {
    Overview,
    Requests,
    Threads,
    Gpu,
    Sockets,
    Metrics,
    Diff,
    Components,
}

impl Tab {
    pub const ALL: [Tab; 8] = [
        Tab::Overview,
        Tab::Requests,
        Tab::Threads,
        Tab::Gpu,
        Tab::Sockets,
        Tab::Metrics,
        Tab::Diff,
        Tab::Components,
    ];
    pub fn title(self) -> &'static str {
        match self {
            Tab::Overview => "Overview",
            Tab::Requests => "Requests",
            Tab::Threads => "Threads",
            Tab::Gpu => "GPU",
            Tab::Sockets => "Sockets",
            Tab::Metrics => "Metrics",
            Tab::Diff => "Diff",
            Tab::Components => "Components",
        }
    }
    pub fn index(self) -> usize {
        Tab::ALL.iter().position(|v| *v == self).unwrap_or(0)
    }
}

/// Sort keys of the Requests tab, cycled with `o`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SortKey {
    /// Stuck first, then the longest silence: the default.
    Stuck,
    Age,
    Silence,
    Component,
    Id,
}

impl SortKey {
    pub fn as_str(self) -> &'static str {
        match self {
            SortKey::Stuck => "stuck",
            SortKey::Age => "age",
            SortKey::Silence => "silence",
            SortKey::Component => "component",
            SortKey::Id => "id",
        }
    }
    fn next(self) -> SortKey {
        match self {
            SortKey::Stuck => SortKey::Age,
            SortKey::Age => SortKey::Silence,
            SortKey::Silence => SortKey::Component,
            SortKey::Component => SortKey::Id,
            SortKey::Id => SortKey::Stuck,
        }
    }
}

/// The whole UI state.
pub struct App {
    opts: AppOptions,
    /// The frame on screen.
    current: Option<FeedFrame>,
    derived: Derived,
    /// While frozen: the newest frame received, and the history points collected meanwhile.
    held: Option<FeedFrame>,
    held_history: Vec<HistoryPoint>,
    held_count: u64,
    history: VecDeque<HistoryPoint>,
    frozen: bool,
    feed_state: FeedState,
    tab: Tab,
    selected: [usize; Tab::ALL.len()],
    /// The Overview's findings pane: findings and the evidence items of expanded ones.
    finding_rows: Vec<FindingRow>,
    /// First line shown of the open detail pane (thread frames, component detail).
    detail_scroll: usize,
    /// Lines the open detail pane had when last drawn, so scrolling stops at its last page
    /// (set while drawing, which only has `&self`).
    detail_viewport: Cell<usize>,
    /// Where the Overview's cursor was (finding key, item) before a new frame came in.
    pending_cursor: Option<(String, Option<usize>)>,
    /// Versions of the host and tool in the frame on screen (refreshed while the Components
    /// tab is open).
    host_versions: BTreeMap<String, String>,
    /// Expanded findings, by `kind|component` (stable across frames, unlike indices).
    expanded: BTreeSet<String>,
    detail: bool,
    filter: String,
    filter_editing: bool,
    sort: SortKey,
    all_hops: bool,
    help: bool,
    status: Option<String>,
    frames_received: u64,
    /// The hop followed with `t`/`d`/`m` (see `follow`).
    focus: Option<String>,
    /// The tabs esc goes back to after following, newest last.
    back: Vec<Tab>,
}

impl std::fmt::Debug for App {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("App")
            .field("tab", &self.tab)
            .field("frozen", &self.frozen)
            .field("filter", &self.filter)
            .field("frames_received", &self.frames_received)
            .finish()
    }
}

impl App {
    pub fn new(opts: AppOptions) -> App {
        App {
            opts,
            current: None,
            derived: Derived::default(),
            held: None,
            held_history: Vec::new(),
            held_count: 0,
            history: VecDeque::new(),
            frozen: false,
            feed_state: FeedState::Live,
            tab: Tab::Overview,
            selected: [0; Tab::ALL.len()],
            finding_rows: Vec::new(),
            detail_scroll: 0,
            detail_viewport: Cell::new(0),
            pending_cursor: None,
            host_versions: BTreeMap::new(),
            expanded: BTreeSet::new(),
            detail: false,
            filter: String::new(),
            filter_editing: false,
            sort: SortKey::Stuck,
            all_hops: false,
            help: false,
            status: None,
            frames_received: 0,
            focus: None,
            back: Vec::new(),
        }
    }

    // ----- accessors (for rendering and tests)

    pub fn options(&self) -> &AppOptions {
        &self.opts
    }
    pub fn snapshot(&self) -> Option<&Snapshot> {
        self.current.as_ref().map(|f| &f.snapshot)
    }
    pub fn sampler(&self) -> Option<&SamplerHealth> {
        self.current.as_ref().map(|f| &f.sampler)
    }
    pub fn derived(&self) -> &Derived {
        &self.derived
    }
    pub fn history(&self) -> &VecDeque<HistoryPoint> {
        &self.history
    }
    pub fn tab(&self) -> Tab {
        self.tab
    }
    pub fn selected(&self) -> usize {
        self.selected[self.tab.index()]
    }
    pub fn is_frozen(&self) -> bool {
        self.frozen
    }
    /// Frames received while frozen and not shown yet.
    pub fn held_frames(&self) -> u64 {
        self.held_count
    }
    pub fn feed_state(&self) -> &FeedState {
        &self.feed_state
    }
    pub fn filter(&self) -> &str {
        &self.filter
    }
    pub fn is_editing_filter(&self) -> bool {
        self.filter_editing
    }
    pub fn sort(&self) -> SortKey {
        self.sort
    }
    pub fn all_hops(&self) -> bool {
        self.all_hops
    }
    pub fn help_open(&self) -> bool {
        self.help
    }
    pub fn detail_open(&self) -> bool {
        self.detail
    }
    pub fn status(&self) -> Option<&str> {
        self.status.as_deref()
    }
    pub fn frames_received(&self) -> u64 {
        self.frames_received
    }
    pub fn is_expanded(&self, f: &Finding) -> bool {
        self.expanded.contains(&finding_key(f))
    }
    /// The Overview's findings pane rows; `selected()` indexes them in the Overview.
    pub fn finding_rows(&self) -> &[FindingRow] {
        &self.finding_rows
    }
    /// First line of the open detail pane to show.
    pub fn detail_scroll(&self) -> usize {
        self.detail_scroll
    }
    /// Called while drawing: how many lines the open detail pane has on screen.
    pub fn set_detail_viewport(&self, lines: usize) {
        self.detail_viewport.set(lines);
    }
    pub fn host_versions(&self) -> &BTreeMap<String, String> {
        &self.host_versions
    }
    /// Ids of the requests in the Requests tab, in display order.
    pub fn request_ids(&self) -> Vec<&str> {
        let Some(s) = self.snapshot() else {
            return Vec::new();
        };
        self.derived
            .request_order
            .iter()
            .filter_map(|&i| self.derived.rows.get(i))
            .filter_map(|r| s.requests.get(r.index))
            .map(|r| r.id.as_str())
            .collect()
    }

    // ----- feeding

    /// Tells the header what kind of feed this is (live, replay position, disconnected).
    pub fn set_feed_state(&mut self, state: FeedState) {
        self.feed_state = state;
    }

    /// Takes a new frame. While frozen it is held aside (collection goes on), not shown.
    pub fn ingest(&mut self, frame: FeedFrame) {
        self.frames_received += 1;
        let point = HistoryPoint::of(&frame.snapshot);
        if self.frozen {
            self.held_history.push(point);
            if self.held_history.len() > self.opts.history_len {
                self.held_history.remove(0);
            }
            self.held = Some(frame);
            self.held_count += 1;
            return;
        }
        self.push_history(point);
        self.show(frame);
    }

    fn push_history(&mut self, point: HistoryPoint) {
        self.history.push_back(point);
        while self.history.len() > self.opts.history_len.max(1) {
            self.history.pop_front();
        }
    }

    fn show(&mut self, frame: FeedFrame) {
        // Taken before the frame changes: the rows index the old frame's findings.
        self.pending_cursor = self.cursor_key();
        self.current = Some(frame);
        self.recompute();
        self.refresh_host_versions();
    }

    /// Host versions are read by serializing the whole snapshot (see `component::carried_map`),
    /// so only for the tab that shows them: on a new frame while it is open, and on opening it.
    fn refresh_host_versions(&mut self) {
        if self.tab == Tab::Components {
            if let Some(f) = &self.current {
                self.host_versions = host_versions(&f.snapshot);
            }
        }
    }

    /// Sets the status line (e.g. from the run loop).
    pub fn set_status(&mut self, message: impl Into<String>) {
        self.status = Some(message.into());
    }

    fn recompute(&mut self) {
        self.derived = match &self.current {
            Some(f) => derive(&f.snapshot, &self.filter, self.sort, self.all_hops),
            None => Derived::default(),
        };
        self.after_derive();
    }

    /// Number of selectable items in a tab.
    pub fn tab_len(&self, tab: Tab) -> usize {
        let d = &self.derived;
        match tab {
            Tab::Overview => self.finding_rows.len(),
            Tab::Requests => d.request_order.len(),
            Tab::Threads => d.threads.len(),
            Tab::Gpu => self.snapshot().map_or(0, gpu_line_count),
            Tab::Sockets => d.socket_components.len() + d.connections.len(),
            Tab::Metrics => d.metric_lines.len(),
            Tab::Diff => d.changes.len(),
            Tab::Components => self.snapshot().map_or(0, |s| s.components.len()),
        }
    }

    fn clamp_selection(&mut self) {
        for v in Tab::ALL {
            let len = self.tab_len(v);
            let s = &mut self.selected[v.index()];
            *s = (*s).min(len.saturating_sub(1));
        }
    }

    /// A tab chosen by hand (tab, 1-8): leaves a trail of `t`/`d`/`m`.
    fn switch_tab(&mut self, tab: Tab) {
        self.leave_trail();
        self.set_tab(tab);
    }

    fn set_tab(&mut self, tab: Tab) {
        if tab != self.tab {
            self.tab = tab;
            self.detail = false;
            self.detail_scroll = 0;
            if tab == Tab::Components {
                self.select_worst_component();
                self.refresh_host_versions();
            }
            if tab == Tab::Sockets {
                self.select_first_connection();
            }
        }
    }

    fn toggle_freeze(&mut self) {
        if self.frozen {
            self.frozen = false;
            for p in std::mem::take(&mut self.held_history) {
                self.push_history(p);
            }
            if let Some(f) = self.held.take() {
                self.show(f);
            }
            self.held_count = 0;
            self.status = Some("unfrozen: showing the newest frame".to_string());
        } else {
            self.frozen = true;
            self.status = Some("FROZEN: the display stops, collection goes on (f resumes)".into());
        }
    }

    fn write_snapshot(&mut self) {
        let Some(frame) = &self.current else {
            self.status = Some("snapshot: nothing received yet".to_string());
            return;
        };
        let Some(writer) = self.opts.snapshot_writer.as_mut() else {
            self.status = Some("snapshot: no bundle writer configured here".to_string());
            return;
        };
        self.status = Some(match writer(&frame.snapshot) {
            Ok(path) => format!("snapshot written: {}", path.display()),
            Err(e) => format!("snapshot failed: {e}"),
        });
    }

    fn toggle_enter(&mut self) {
        match self.tab {
            Tab::Overview => self.toggle_finding(),
            Tab::Sockets => {
                if self.selected_connection().is_some() {
                    self.detail = !self.detail;
                    self.detail_scroll = 0;
                }
            }
            Tab::Requests | Tab::Threads | Tab::Components => {
                if self.tab_len(self.tab) > 0 {
                    self.detail = !self.detail;
                    self.detail_scroll = 0;
                }
            }
            Tab::Gpu | Tab::Metrics | Tab::Diff => {}
        }
    }

    /// Handles one key press. Pure state change plus the snapshot writer on `s`.
    pub fn handle_key(&mut self, key: KeyEvent) -> Action {
        let ctrl = key.modifiers.contains(KeyModifiers::CONTROL);
        if ctrl && matches!(key.code, KeyCode::Char('c') | KeyCode::Char('C')) {
            return Action::Quit;
        }
        if self.filter_editing {
            return self.filter_key(key.code, ctrl);
        }
        if self.help {
            return self.help_key(key.code);
        }
        if let Some(cmd) = replay_command(key.code) {
            return Action::Replay(cmd);
        }
        match key.code {
            KeyCode::Char('q') => return Action::Quit,
            KeyCode::Char('?') => self.help = true,
            KeyCode::Char('/') => self.filter_editing = true,
            KeyCode::Tab => self.switch_tab(Tab::ALL[(self.tab.index() + 1) % Tab::ALL.len()]),
            KeyCode::BackTab => {
                let n = Tab::ALL.len();
                self.switch_tab(Tab::ALL[(self.tab.index() + n - 1) % n])
            }
            KeyCode::Char(c @ '1'..='8') => {
                let i = (c as usize) - ('1' as usize);
                self.switch_tab(Tab::ALL[i]);
            }
            KeyCode::Char('t') => self.follow(Jump::Thread),
            KeyCode::Char('d') => self.follow(Jump::Diff),
            KeyCode::Char('m') => self.follow(Jump::Metrics),
            KeyCode::Char('j') | KeyCode::Down => self.move_selection(1),
            KeyCode::Char('k') | KeyCode::Up => self.move_selection(-1),
            KeyCode::PageDown => self.move_selection(10),
            KeyCode::PageUp => self.move_selection(-10),
            KeyCode::Home | KeyCode::Char('g') => self.move_selection(i64::MIN / 2),
            KeyCode::End | KeyCode::Char('G') => self.move_selection(i64::MAX / 2),
            KeyCode::Enter => self.toggle_enter(),
            KeyCode::Esc => self.escape(),
            KeyCode::Char('f') => self.toggle_freeze(),
            KeyCode::Char('s') => self.write_snapshot(),
            KeyCode::Char('o') => {
                self.sort = self.sort.next();
                self.recompute();
            }
            KeyCode::Char('a') => {
                self.all_hops = !self.all_hops;
                self.recompute();
            }
            _ => {}
        }
        Action::None
    }

    /// A key while the `/` filter is being typed: text, except esc (clear), enter (keep)
    /// and backspace.
    fn filter_key(&mut self, code: KeyCode, ctrl: bool) -> Action {
        match code {
            KeyCode::Esc => {
                self.filter.clear();
                self.filter_editing = false;
            }
            KeyCode::Enter => self.filter_editing = false,
            KeyCode::Backspace => {
                self.filter.pop();
            }
            KeyCode::Char(c) if !ctrl => self.filter.push(c),
            _ => return Action::None,
        }
        self.recompute();
        Action::None
    }

    /// A key while the help overlay is open: it swallows everything but quit and close.
    fn help_key(&mut self, code: KeyCode) -> Action {
        match code {
            KeyCode::Char('q') => return Action::Quit,
            KeyCode::Esc | KeyCode::Char('?') | KeyCode::Enter => self.help = false,
            _ => {}
        }
        Action::None
    }

    /// Esc: close the detail, else clear the filter, else go back to where `t`/`d`/`m` came
    /// from, else clear the status line.
    fn escape(&mut self) {
        if self.detail {
            self.detail = false;
            self.detail_scroll = 0;
        } else if !self.filter.is_empty() {
            self.filter.clear();
            self.recompute();
        } else if !self.go_back() {
            self.status = None;
        }
    }
}

/// The replay keys (forwarded to the feed).
fn replay_command(code: KeyCode) -> Option<ReplayCommand> {
    match code {
        KeyCode::Char(' ') => Some(ReplayCommand::TogglePause),
        KeyCode::Char('.') => Some(ReplayCommand::Step(1)),
        KeyCode::Char(',') => Some(ReplayCommand::Step(-1)),
        KeyCode::Char(']') => Some(ReplayCommand::Seek(10)),
        KeyCode::Char('[') => Some(ReplayCommand::Seek(-10)),
        KeyCode::Char('+') | KeyCode::Char('=') => Some(ReplayCommand::Faster),
        KeyCode::Char('-') => Some(ReplayCommand::Slower),
        _ => None,
    }
}

fn finding_key(f: &Finding) -> String {
    format!("{}|{}", f.kind, f.component.as_deref().unwrap_or(""))
}

/// Lines the GPU tab scrolls over: one per GPU plus one per process.
pub fn gpu_line_count(s: &Snapshot) -> usize {
    s.gpus.iter().map(|g| 1 + g.processes.len()).sum()
}

#[cfg(test)]
mod scroll_tests;
#[cfg(test)]
mod tests;
