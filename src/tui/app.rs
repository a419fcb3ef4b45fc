//! The UI state (model) and key handling. Pure: no terminal, no I/O except the snapshot
//! writer the caller plugs in. Rendering lives in `render.rs` and only reads this state.

use super::feed::{FeedFrame, FeedState, ReplayCommand, SamplerHealth};
use crate::clock::{Clock, SystemClock};
use crate::model::{Finding, Request, RequestState, Role, Snapshot};
use ratatui::crossterm::event::{KeyCode, KeyEvent, KeyModifiers};
use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
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
    /// A request with no response progress for this long counts as stuck.
    pub stuck_after_ms: f64,
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
            stuck_after_ms: 10_000.0,
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
            .field("stuck_after_ms", &self.stuck_after_ms)
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
pub enum View {
    Overview,
    Requests,
    Threads,
    Gpu,
    Sockets,
    Metrics,
    Diff,
}

impl View {
    pub const ALL: [View; 7] = [
        View::Overview,
        View::Requests,
        View::Threads,
        View::Gpu,
        View::Sockets,
        View::Metrics,
        View::Diff,
    ];
    pub fn title(self) -> &'static str {
        match self {
            View::Overview => "Overview",
            View::Requests => "Requests",
            View::Threads => "Threads",
            View::Gpu => "GPU",
            View::Sockets => "Sockets",
            View::Metrics => "Metrics",
            View::Diff => "Diff",
        }
    }
    pub fn index(self) -> usize {
        View::ALL.iter().position(|v| *v == self).unwrap_or(0)
    }
}

/// Sort keys of the Requests view, cycled with `o`.
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

/// The hop lanes of the Requests view.
pub const LANES: [&str; 4] = ["proxy", "router", "prefill", "decode"];

/// Which lane a role's exchanges go in. A unified engine shares the decode lane: it is the
/// hop that serves the tokens.
pub fn lane_of(role: Role) -> usize {
    match role {
        Role::Client | Role::Proxy | Role::Other => 0,
        Role::Router => 1,
        Role::Prefill => 2,
        Role::Decode | Role::Engine | Role::Scheduler | Role::Detokenizer => 3,
    }
}

/// One hop of a request chain as shown in a lane.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Lane {
    pub state: RequestState,
    pub idle_out_ms: f64,
    pub stuck: bool,
}

/// One exchange with what the Requests view needs about its chain, computed once per frame.
#[derive(Debug, Clone)]
pub struct RequestRow {
    /// Index into `snapshot.requests`.
    pub index: usize,
    /// Index of the chain (request entering the stack) this exchange belongs to.
    pub chain: usize,
    /// Not the next hop of another exchange.
    pub is_root: bool,
    pub lane: usize,
    pub lanes: [Option<Lane>; 4],
    /// The chain has a stuck hop.
    pub stuck: bool,
    /// Deepest lane where the chain is stuck.
    pub stuck_at: Option<usize>,
    /// Lower-cased text the `/` filter matches against.
    search: String,
}

/// Everything derived from the displayed snapshot: recomputed on a new frame, a filter or a
/// sort change, never while rendering.
#[derive(Debug, Clone, Default)]
pub struct Derived {
    /// Findings indices, most severe first.
    pub findings: Vec<usize>,
    pub rows: Vec<RequestRow>,
    /// Rows shown in the Requests view, in order (indices into `rows`).
    pub request_order: Vec<usize>,
    /// Members of each chain (indices into `snapshot.requests`), root first.
    pub chains: Vec<Vec<usize>>,
    /// Threads shown, grouped by component then pid, tid (indices into `snapshot.threads`).
    pub threads: Vec<usize>,
    /// Exchanges for the Sockets connection list, longest silence first.
    pub connections: Vec<usize>,
    /// Component id -> index.
    pub component_index: HashMap<String, usize>,
    /// Request id -> findings indices that name it.
    pub findings_by_request: HashMap<String, Vec<usize>>,
    /// Metrics view lines: (component index, metric name).
    pub metric_lines: Vec<(usize, String)>,
    /// Diff view: indices into `config_changed`.
    pub changes: Vec<usize>,
}

/// One GPU's readings in one past frame (None: no reading, never a zero).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct GpuPoint {
    pub util_pct: Option<f64>,
    pub power_w: Option<f64>,
    pub mem_used_bytes: Option<f64>,
}

/// A compact record of one past frame for sparklines (full snapshots would be too big).
#[derive(Debug, Clone, Default)]
pub struct HistoryPoint {
    /// GPU index -> its readings.
    pub gpus: BTreeMap<u32, GpuPoint>,
    /// (GPU index, pid) -> memory used bytes.
    pub gpu_processes: BTreeMap<(u32, i64), Option<f64>>,
    /// Component -> TCP state -> count.
    pub sockets: BTreeMap<String, BTreeMap<String, u32>>,
    /// Component -> metric name -> value.
    pub metrics: BTreeMap<String, BTreeMap<String, f64>>,
    /// Component -> exchanges in flight (waiting, streaming or stalled).
    pub in_flight: BTreeMap<String, u32>,
}

impl HistoryPoint {
    fn of(s: &Snapshot) -> HistoryPoint {
        let mut p = HistoryPoint::default();
        for g in &s.gpus {
            p.gpus.insert(
                g.index,
                GpuPoint {
                    util_pct: g.util_pct,
                    power_w: g.power_w,
                    mem_used_bytes: g.mem_used_bytes.map(|b| b as f64),
                },
            );
            for proc_ in &g.processes {
                p.gpu_processes
                    .insert((g.index, proc_.pid), proc_.used_mem_bytes.map(|b| b as f64));
            }
        }
        for c in &s.components {
            if !c.sockets.is_empty() {
                p.sockets.insert(c.id.clone(), c.sockets.clone());
            }
            if !c.metrics.is_empty() {
                p.metrics.insert(c.id.clone(), c.metrics.clone());
            }
        }
        for r in &s.requests {
            if in_flight(r.state) {
                *p.in_flight.entry(r.component.clone()).or_default() += 1;
            }
        }
        p
    }
}

pub fn in_flight(state: RequestState) -> bool {
    matches!(
        state,
        RequestState::WaitingFirstByte | RequestState::Streaming | RequestState::Stalled
    )
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
    view: View,
    selected: [usize; 7],
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
}

impl std::fmt::Debug for App {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("App")
            .field("view", &self.view)
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
            view: View::Overview,
            selected: [0; 7],
            expanded: BTreeSet::new(),
            detail: false,
            filter: String::new(),
            filter_editing: false,
            sort: SortKey::Stuck,
            all_hops: false,
            help: false,
            status: None,
            frames_received: 0,
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
    pub fn view(&self) -> View {
        self.view
    }
    pub fn selected(&self) -> usize {
        self.selected[self.view.index()]
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
    /// Ids of the requests in the Requests view, in display order.
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
        self.current = Some(frame);
        self.recompute();
    }

    /// Sets the status line (e.g. from the run loop).
    pub fn set_status(&mut self, message: impl Into<String>) {
        self.status = Some(message.into());
    }

    fn recompute(&mut self) {
        self.derived = match &self.current {
            Some(f) => derive(
                &f.snapshot,
                &self.filter,
                self.sort,
                self.all_hops,
                self.opts.stuck_after_ms,
            ),
            None => Derived::default(),
        };
        self.clamp_selection();
    }

    /// Number of selectable items in a view.
    pub fn view_len(&self, view: View) -> usize {
        let d = &self.derived;
        match view {
            View::Overview => d.findings.len(),
            View::Requests => d.request_order.len(),
            View::Threads => d.threads.len(),
            View::Gpu => self.snapshot().map_or(0, gpu_line_count),
            View::Sockets => d.connections.len(),
            View::Metrics => d.metric_lines.len(),
            View::Diff => d.changes.len(),
        }
    }

    fn clamp_selection(&mut self) {
        for v in View::ALL {
            let len = self.view_len(v);
            let s = &mut self.selected[v.index()];
            *s = (*s).min(len.saturating_sub(1));
        }
    }

    fn move_selection(&mut self, delta: i64) {
        let len = self.view_len(self.view);
        let s = &mut self.selected[self.view.index()];
        let target = (*s as i64 + delta).clamp(0, len.saturating_sub(1) as i64);
        *s = target as usize;
    }

    fn set_view(&mut self, view: View) {
        if view != self.view {
            self.view = view;
            self.detail = false;
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
        match self.view {
            View::Overview => {
                let key = self.snapshot().and_then(|s| {
                    let i = *self.derived.findings.get(self.selected())?;
                    s.findings.get(i).map(finding_key)
                });
                if let Some(k) = key {
                    if !self.expanded.remove(&k) {
                        self.expanded.insert(k);
                    }
                }
            }
            View::Requests | View::Threads | View::Sockets => {
                if self.view_len(self.view) > 0 {
                    self.detail = !self.detail;
                }
            }
            View::Gpu | View::Metrics | View::Diff => {}
        }
    }

    /// Handles one key press. Pure state change plus the snapshot writer on `s`.
    pub fn handle_key(&mut self, key: KeyEvent) -> Action {
        let ctrl = key.modifiers.contains(KeyModifiers::CONTROL);
        if ctrl && matches!(key.code, KeyCode::Char('c') | KeyCode::Char('C')) {
            return Action::Quit;
        }
        if self.filter_editing {
            match key.code {
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
            return Action::None;
        }
        if self.help {
            match key.code {
                KeyCode::Char('q') => return Action::Quit,
                KeyCode::Esc | KeyCode::Char('?') | KeyCode::Enter => self.help = false,
                _ => {}
            }
            return Action::None;
        }
        match key.code {
            KeyCode::Char('q') => return Action::Quit,
            KeyCode::Char('?') => self.help = true,
            KeyCode::Char('/') => self.filter_editing = true,
            KeyCode::Tab => self.set_view(View::ALL[(self.view.index() + 1) % View::ALL.len()]),
            KeyCode::BackTab => {
                let n = View::ALL.len();
                self.set_view(View::ALL[(self.view.index() + n - 1) % n])
            }
            KeyCode::Char(c @ '1'..='7') => {
                let i = (c as usize) - ('1' as usize);
                self.set_view(View::ALL[i]);
            }
            KeyCode::Char('j') | KeyCode::Down => self.move_selection(1),
            KeyCode::Char('k') | KeyCode::Up => self.move_selection(-1),
            KeyCode::PageDown => self.move_selection(10),
            KeyCode::PageUp => self.move_selection(-10),
            KeyCode::Home | KeyCode::Char('g') => self.move_selection(i64::MIN / 2),
            KeyCode::End | KeyCode::Char('G') => self.move_selection(i64::MAX / 2),
            KeyCode::Enter => self.toggle_enter(),
            KeyCode::Esc => {
                if self.detail {
                    self.detail = false;
                } else if !self.filter.is_empty() {
                    self.filter.clear();
                    self.recompute();
                } else {
                    self.status = None;
                }
            }
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
            KeyCode::Char(' ') => return Action::Replay(ReplayCommand::TogglePause),
            KeyCode::Char('.') => return Action::Replay(ReplayCommand::Step(1)),
            KeyCode::Char(',') => return Action::Replay(ReplayCommand::Step(-1)),
            KeyCode::Char(']') => return Action::Replay(ReplayCommand::Seek(10)),
            KeyCode::Char('[') => return Action::Replay(ReplayCommand::Seek(-10)),
            KeyCode::Char('+') | KeyCode::Char('=') => {
                return Action::Replay(ReplayCommand::Faster)
            }
            KeyCode::Char('-') => return Action::Replay(ReplayCommand::Slower),
            _ => {}
        }
        Action::None
    }
}

fn finding_key(f: &Finding) -> String {
    format!("{}|{}", f.kind, f.component.as_deref().unwrap_or(""))
}

/// Lines the GPU view scrolls over: one per GPU plus one per process.
pub fn gpu_line_count(s: &Snapshot) -> usize {
    s.gpus.iter().map(|g| 1 + g.processes.len()).sum()
}

/// Role of an exchange: its own, else its component's.
pub fn request_role(s: &Snapshot, index: &HashMap<String, usize>, r: &Request) -> Role {
    r.role
        .or_else(|| {
            index
                .get(&r.component)
                .and_then(|&i| s.components.get(i))
                .map(|c| c.role)
        })
        .unwrap_or(Role::Other)
}

fn is_stuck(r: &Request, stuck_after_ms: f64) -> bool {
    matches!(
        r.state,
        RequestState::WaitingFirstByte | RequestState::Stalled
    ) && r.idle_out_ms >= stuck_after_ms
}

/// Computes everything the views list, once per frame/filter/sort change.
pub fn derive(
    s: &Snapshot,
    filter: &str,
    sort: SortKey,
    all_hops: bool,
    stuck_after_ms: f64,
) -> Derived {
    let filter = filter.to_lowercase();
    let mut d = Derived::default();
    for (i, c) in s.components.iter().enumerate() {
        d.component_index.insert(c.id.clone(), i);
    }

    let mut findings: Vec<usize> = (0..s.findings.len())
        .filter(|&i| {
            let f = &s.findings[i];
            filter.is_empty()
                || [
                    f.kind.as_str(),
                    f.component.as_deref().unwrap_or(""),
                    f.summary.as_str(),
                ]
                .iter()
                .any(|p| p.to_lowercase().contains(&filter))
        })
        .collect();
    findings.sort_by_key(|&i| std::cmp::Reverse(s.findings[i].severity));
    d.findings = findings;
    for (fi, f) in s.findings.iter().enumerate() {
        for r in &f.requests {
            d.findings_by_request.entry(r.clone()).or_default().push(fi);
        }
    }

    // Chains: roots are exchanges nobody links to; walk links breadth first. Exchanges left
    // over (a link cycle) start their own chain, so every exchange is in exactly one.
    let by_id: HashMap<&str, usize> = s
        .requests
        .iter()
        .enumerate()
        .map(|(i, r)| (r.id.as_str(), i))
        .collect();
    let mut linked = vec![false; s.requests.len()];
    for r in &s.requests {
        for l in &r.links {
            if let Some(&j) = by_id.get(l.as_str()) {
                linked[j] = true;
            }
        }
    }
    let mut chain_of = vec![usize::MAX; s.requests.len()];
    let starts = (0..s.requests.len())
        .filter(|&i| !linked[i])
        .chain(0..s.requests.len());
    for start in starts {
        if chain_of[start] != usize::MAX {
            continue;
        }
        let chain = d.chains.len();
        let mut members = vec![start];
        chain_of[start] = chain;
        let mut k = 0;
        while k < members.len() {
            let r = &s.requests[members[k]];
            for l in &r.links {
                if let Some(&j) = by_id.get(l.as_str()) {
                    if chain_of[j] == usize::MAX {
                        chain_of[j] = chain;
                        members.push(j);
                    }
                }
            }
            k += 1;
        }
        d.chains.push(members);
    }

    // Lanes per chain.
    let roles: Vec<Role> = s
        .requests
        .iter()
        .map(|r| request_role(s, &d.component_index, r))
        .collect();
    let mut chain_lanes: Vec<[Option<Lane>; 4]> = Vec::with_capacity(d.chains.len());
    let mut chain_stuck_at: Vec<Option<usize>> = Vec::with_capacity(d.chains.len());
    for members in &d.chains {
        let mut lanes: [Option<Lane>; 4] = [None; 4];
        let mut stuck_at = None;
        for &m in members {
            let r = &s.requests[m];
            let lane = lane_of(roles[m]);
            let stuck = is_stuck(r, stuck_after_ms) || d.findings_by_request.contains_key(&r.id);
            let stuck = stuck && r.state != RequestState::Done && r.state != RequestState::Closed;
            // Several exchanges in one lane (retries): the stuck or the most silent one shows.
            let replace = match lanes[lane] {
                None => true,
                Some(l) => (stuck, r.idle_out_ms) > (l.stuck, l.idle_out_ms),
            };
            if replace {
                lanes[lane] = Some(Lane {
                    state: r.state,
                    idle_out_ms: r.idle_out_ms,
                    stuck,
                });
            }
            if stuck {
                stuck_at = Some(stuck_at.map_or(lane, |s: usize| s.max(lane)));
            }
        }
        chain_lanes.push(lanes);
        chain_stuck_at.push(stuck_at);
    }

    d.rows = s
        .requests
        .iter()
        .enumerate()
        .map(|(i, r)| {
            let chain = chain_of[i];
            let stuck_at = chain_stuck_at[chain];
            let mut search = String::with_capacity(96);
            for part in [
                r.id.as_str(),
                r.component.as_str(),
                r.client.as_str(),
                r.server.as_str(),
                r.state.as_str(),
                stuck_at.map_or("", |l| LANES[l]),
            ] {
                search.push_str(&part.to_lowercase());
                search.push(' ');
            }
            RequestRow {
                index: i,
                chain,
                is_root: d.chains[chain].first() == Some(&i),
                lane: lane_of(roles[i]),
                lanes: chain_lanes[chain],
                stuck: stuck_at.is_some(),
                stuck_at,
                search,
            }
        })
        .collect();

    let mut order: Vec<usize> = d
        .rows
        .iter()
        .enumerate()
        .filter(|(_, row)| all_hops || row.is_root)
        .filter(|(_, row)| filter.is_empty() || row.search.contains(&filter))
        .map(|(i, _)| i)
        .collect();
    let key_req = |i: usize| &s.requests[d.rows[i].index];
    match sort {
        SortKey::Stuck => order.sort_by(|&a, &b| {
            let (ra, rb) = (&d.rows[a], &d.rows[b]);
            rb.stuck
                .cmp(&ra.stuck)
                .then(rb.stuck_at.cmp(&ra.stuck_at))
                // All-hops mode: the deepest hop of a chain first (where it is stuck).
                .then(if ra.stuck && rb.stuck {
                    rb.lane.cmp(&ra.lane)
                } else {
                    std::cmp::Ordering::Equal
                })
                .then(in_flight(key_req(b).state).cmp(&in_flight(key_req(a).state)))
                .then(key_req(b).idle_out_ms.total_cmp(&key_req(a).idle_out_ms))
                .then(key_req(b).age_ms.total_cmp(&key_req(a).age_ms))
                .then(key_req(a).id.cmp(&key_req(b).id))
        }),
        SortKey::Age => order.sort_by(|&a, &b| {
            key_req(b)
                .age_ms
                .total_cmp(&key_req(a).age_ms)
                .then(key_req(a).id.cmp(&key_req(b).id))
        }),
        SortKey::Silence => order.sort_by(|&a, &b| {
            key_req(b)
                .idle_out_ms
                .total_cmp(&key_req(a).idle_out_ms)
                .then(key_req(a).id.cmp(&key_req(b).id))
        }),
        SortKey::Component => order.sort_by(|&a, &b| {
            key_req(a)
                .component
                .cmp(&key_req(b).component)
                .then(key_req(a).id.cmp(&key_req(b).id))
        }),
        SortKey::Id => order.sort_by(|&a, &b| key_req(a).id.cmp(&key_req(b).id)),
    }
    d.request_order = order;

    let matches = |parts: &[&str]| {
        filter.is_empty() || parts.iter().any(|p| p.to_lowercase().contains(&filter))
    };

    let mut threads: Vec<usize> = (0..s.threads.len())
        .filter(|&i| {
            let t = &s.threads[i];
            matches(&[
                t.component.as_deref().unwrap_or(""),
                t.name.as_deref().unwrap_or(""),
                &t.state,
                &t.pid.to_string(),
            ])
        })
        .collect();
    threads.sort_by(|&a, &b| {
        let (ta, tb) = (&s.threads[a], &s.threads[b]);
        (ta.component.as_deref(), ta.pid, ta.tid).cmp(&(tb.component.as_deref(), tb.pid, tb.tid))
    });
    d.threads = threads;

    let mut conns: Vec<usize> = (0..s.requests.len())
        .filter(|&i| d.rows[i].search.contains(&filter))
        .collect();
    conns.sort_by(|&a, &b| {
        let (ra, rb) = (&s.requests[a], &s.requests[b]);
        in_flight(rb.state)
            .cmp(&in_flight(ra.state))
            .then(rb.idle_out_ms.total_cmp(&ra.idle_out_ms))
            .then(ra.id.cmp(&rb.id))
    });
    d.connections = conns;

    for (ci, c) in s.components.iter().enumerate() {
        for name in c.metrics.keys() {
            // Rates are shown next to their metric, not as lines of their own.
            if name.ends_with("_rate") && c.metrics.contains_key(name.trim_end_matches("_rate")) {
                continue;
            }
            if matches(&[&c.id, name]) {
                d.metric_lines.push((ci, name.clone()));
            }
        }
    }

    d.changes = (0..s.config_changed.len())
        .filter(|&i| {
            let ch = &s.config_changed[i];
            matches(&[
                &ch.component,
                &ch.field,
                ch.key.as_deref().unwrap_or(""),
                ch.after.as_deref().unwrap_or(""),
            ])
        })
        .collect();
    d
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::FakeClock;
    use crate::model::{Severity, SNAPSHOT_SCHEMA};
    use ratatui::crossterm::event::KeyEventKind;
    use std::sync::Mutex;

    fn key(code: KeyCode) -> KeyEvent {
        KeyEvent::new(code, KeyModifiers::NONE)
    }
    fn ch(c: char) -> KeyEvent {
        key(KeyCode::Char(c))
    }

    fn req(id: &str, comp: &str, role: Role, state: RequestState, idle: f64) -> Request {
        Request {
            id: id.into(),
            component: comp.into(),
            client: "127.0.0.1:50000".into(),
            server: "127.0.0.1:8080".into(),
            state,
            age_ms: idle + 100.0,
            bytes_in: 100,
            bytes_out: 0,
            idle_out_ms: idle,
            links: vec![],
            role: Some(role),
            client_component: None,
            link_confidence: None,
            started_at: None,
        }
    }

    fn snap(taken_at: &str, requests: Vec<Request>) -> Snapshot {
        Snapshot {
            schema: SNAPSHOT_SCHEMA.to_string(),
            taken_at: taken_at.into(),
            window_ms: 3000.0,
            sources: BTreeMap::new(),
            components: vec![],
            requests,
            gpus: vec![],
            threads: vec![],
            findings: vec![],
            edges: vec![],
            redacted: true,
            config_changed: vec![],
            tool: BTreeMap::new(),
        }
    }

    fn chain_snapshot() -> Snapshot {
        let mut a = req(
            "a-proxy",
            "proxy",
            Role::Proxy,
            RequestState::WaitingFirstByte,
            94_000.0,
        );
        a.links = vec!["a-router".into()];
        let mut b = req(
            "a-router",
            "router",
            Role::Router,
            RequestState::WaitingFirstByte,
            94_000.0,
        );
        b.links = vec!["a-decode".into()];
        let c = req(
            "a-decode",
            "decode",
            Role::Decode,
            RequestState::WaitingFirstByte,
            94_000.0,
        );
        let ok = req(
            "b-proxy",
            "proxy",
            Role::Proxy,
            RequestState::Streaming,
            20.0,
        );
        let done = req(
            "c-proxy",
            "proxy",
            Role::Proxy,
            RequestState::Done,
            50_000.0,
        );
        snap("2026-11-29T12:00:00.000Z", vec![ok, done, a, b, c])
    }

    #[test]
    fn stuck_chain_first_and_blamed_on_its_deepest_hop() {
        let mut app = App::new(AppOptions::default());
        app.ingest(FeedFrame::new(chain_snapshot()));
        assert_eq!(app.request_ids(), vec!["a-proxy", "b-proxy", "c-proxy"]);
        let row = &app.derived().rows[app.derived().request_order[0]];
        assert_eq!(row.stuck_at, Some(3));
        assert!(row.lanes[1].is_some_and(|l| l.stuck));
        assert!(row.lanes[2].is_none());
        // `a` shows every hop, stuck first and deepest first.
        app.handle_key(ch('a'));
        assert_eq!(app.request_ids()[..3], ["a-decode", "a-router", "a-proxy"]);
    }

    #[test]
    fn sort_cycles_and_filter_edits() {
        let mut app = App::new(AppOptions::default());
        app.ingest(FeedFrame::new(chain_snapshot()));
        app.handle_key(ch('2'));
        assert_eq!(app.view(), View::Requests);
        app.handle_key(ch('o'));
        assert_eq!(app.sort(), SortKey::Age);
        app.handle_key(ch('o'));
        app.handle_key(ch('o'));
        app.handle_key(ch('o'));
        assert_eq!(app.sort(), SortKey::Id);
        assert_eq!(app.request_ids(), vec!["a-proxy", "b-proxy", "c-proxy"]);
        app.handle_key(ch('o'));
        assert_eq!(app.sort(), SortKey::Stuck);

        app.handle_key(ch('/'));
        assert!(app.is_editing_filter());
        for c in "strEAM".chars() {
            app.handle_key(ch(c));
        }
        // `q` while typing a filter is text, not quit.
        assert_eq!(app.handle_key(ch('q')), Action::None);
        app.handle_key(key(KeyCode::Backspace));
        app.handle_key(key(KeyCode::Enter));
        assert!(!app.is_editing_filter());
        assert_eq!(app.filter(), "strEAM");
        assert_eq!(app.request_ids(), vec!["b-proxy"]);
        app.handle_key(key(KeyCode::Esc));
        assert_eq!(app.filter(), "");
        assert_eq!(app.request_ids().len(), 3);
    }

    #[test]
    fn views_by_tab_backtab_and_numbers() {
        let mut app = App::new(AppOptions::default());
        assert_eq!(app.view(), View::Overview);
        app.handle_key(key(KeyCode::Tab));
        assert_eq!(app.view(), View::Requests);
        app.handle_key(key(KeyCode::BackTab));
        app.handle_key(key(KeyCode::BackTab));
        assert_eq!(app.view(), View::Diff);
        app.handle_key(ch('4'));
        assert_eq!(app.view(), View::Gpu);
        app.handle_key(ch('9'));
        assert_eq!(app.view(), View::Gpu);
    }

    #[test]
    fn selection_moves_and_clamps() {
        let mut app = App::new(AppOptions::default());
        app.ingest(FeedFrame::new(chain_snapshot()));
        app.handle_key(ch('2'));
        app.handle_key(ch('j'));
        app.handle_key(key(KeyCode::Down));
        assert_eq!(app.selected(), 2);
        app.handle_key(ch('j'));
        assert_eq!(app.selected(), 2, "clamped to the last row");
        app.handle_key(ch('k'));
        assert_eq!(app.selected(), 1);
        app.handle_key(key(KeyCode::Home));
        assert_eq!(app.selected(), 0);
        app.handle_key(key(KeyCode::End));
        assert_eq!(app.selected(), 2);
        app.handle_key(key(KeyCode::Enter));
        assert!(app.detail_open());
        app.handle_key(key(KeyCode::Esc));
        assert!(!app.detail_open());
    }

    #[test]
    fn help_overlay_swallows_keys_until_closed() {
        let mut app = App::new(AppOptions::default());
        app.handle_key(ch('?'));
        assert!(app.help_open());
        app.handle_key(ch('3'));
        assert_eq!(app.view(), View::Overview, "keys go to the help overlay");
        app.handle_key(key(KeyCode::Esc));
        assert!(!app.help_open());
        app.handle_key(ch('?'));
        assert_eq!(app.handle_key(ch('q')), Action::Quit);
    }

    #[test]
    fn quit_keys_and_replay_keys() {
        let mut app = App::new(AppOptions::default());
        assert_eq!(app.handle_key(ch('q')), Action::Quit);
        let ctrl_c = KeyEvent::new_with_kind(
            KeyCode::Char('c'),
            KeyModifiers::CONTROL,
            KeyEventKind::Press,
        );
        assert_eq!(app.handle_key(ctrl_c), Action::Quit);
        app.handle_key(ch('/'));
        assert_eq!(
            app.handle_key(ctrl_c),
            Action::Quit,
            "Ctrl-C quits even mid-filter"
        );
        let mut app = App::new(AppOptions::default());
        let expected = [
            (' ', ReplayCommand::TogglePause),
            ('.', ReplayCommand::Step(1)),
            (',', ReplayCommand::Step(-1)),
            (']', ReplayCommand::Seek(10)),
            ('[', ReplayCommand::Seek(-10)),
            ('+', ReplayCommand::Faster),
            ('-', ReplayCommand::Slower),
        ];
        for (c, cmd) in expected {
            assert_eq!(app.handle_key(ch(c)), Action::Replay(cmd), "key {c:?}");
        }
    }

    #[test]
    fn freeze_holds_frames_and_resumes_with_the_newest() {
        let mut app = App::new(AppOptions::default());
        app.ingest(FeedFrame::new(snap("t1", vec![])));
        app.handle_key(ch('f'));
        assert!(app.is_frozen());
        app.ingest(FeedFrame::new(snap("t2", vec![])));
        app.ingest(FeedFrame::new(snap("t3", vec![])));
        assert_eq!(app.snapshot().map(|s| s.taken_at.as_str()), Some("t1"));
        assert_eq!(app.held_frames(), 2);
        assert_eq!(app.history().len(), 1, "display history frozen too");
        app.handle_key(ch('f'));
        assert!(!app.is_frozen());
        assert_eq!(app.snapshot().map(|s| s.taken_at.as_str()), Some("t3"));
        assert_eq!(app.history().len(), 3, "collection went on while frozen");
        assert_eq!(app.frames_received(), 3);
    }

    #[test]
    fn snapshot_key_calls_the_writer_and_reports() {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let seen_in = seen.clone();
        let opts = AppOptions {
            snapshot_writer: Some(Box::new(move |s: &Snapshot| {
                if let Ok(mut v) = seen_in.lock() {
                    v.push(s.taken_at.clone());
                }
                if s.taken_at == "bad" {
                    Err("disk full".to_string())
                } else {
                    Ok(PathBuf::from("/tmp/ww-bundle"))
                }
            })),
            clock: Arc::new(FakeClock::new(0)),
            ..AppOptions::default()
        };
        let mut app = App::new(opts);
        app.handle_key(ch('s'));
        assert_eq!(app.status(), Some("snapshot: nothing received yet"));
        app.ingest(FeedFrame::new(snap("t1", vec![])));
        app.handle_key(ch('f'));
        app.ingest(FeedFrame::new(snap("t2", vec![])));
        app.handle_key(ch('s'));
        assert_eq!(app.status(), Some("snapshot written: /tmp/ww-bundle"));
        assert_eq!(
            seen.lock().map(|v| v.clone()).unwrap_or_default(),
            vec!["t1".to_string()],
            "writes what is on screen (the frozen frame), not the held one"
        );
        app.handle_key(ch('f'));
        app.ingest(FeedFrame::new(snap("bad", vec![])));
        app.handle_key(ch('s'));
        assert_eq!(app.status(), Some("snapshot failed: disk full"));

        let mut plain = App::new(AppOptions::default());
        plain.ingest(FeedFrame::new(snap("t1", vec![])));
        plain.handle_key(ch('s'));
        assert!(plain
            .status()
            .is_some_and(|s| s.contains("no bundle writer")));
    }

    #[test]
    fn enter_expands_the_selected_finding() {
        let mut s = chain_snapshot();
        let f = |kind: &str, sev| Finding {
            kind: kind.into(),
            severity: sev,
            component: Some("decode".into()),
            role: Some(Role::Decode),
            summary: kind.into(),
            requests: vec![],
            evidence: vec![],
            explanation: None,
        };
        s.findings = vec![
            f("info_one", Severity::Info),
            f("wedged_request", Severity::Critical),
        ];
        let mut app = App::new(AppOptions::default());
        app.ingest(FeedFrame::new(s));
        assert_eq!(app.derived().findings, vec![1, 0], "most severe first");
        app.handle_key(key(KeyCode::Enter));
        let snap = app.snapshot().cloned();
        let snap = snap.as_ref();
        assert!(snap.is_some_and(|s| app.is_expanded(&s.findings[1])));
        assert!(snap.is_some_and(|s| !app.is_expanded(&s.findings[0])));
        app.handle_key(key(KeyCode::Enter));
        assert!(snap.is_some_and(|s| !app.is_expanded(&s.findings[1])));
        // The filter narrows the findings too.
        app.handle_key(ch('/'));
        for c in "info".chars() {
            app.handle_key(ch(c));
        }
        assert_eq!(app.derived().findings, vec![0]);
    }
}
