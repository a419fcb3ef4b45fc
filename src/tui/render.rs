//! Drawing the state. Reads [`App`] only; everything expensive was computed on ingest, so a
//! frame costs what is visible, not what is in the snapshot.

use super::app::{in_flight, lane_of, request_role, App, Lane, RequestRow, View, LANES};
use super::feed::FeedState;
use crate::model::{
    Finding, RequestState, Role, Severity, SnapComponent, Snapshot, SourceKind, SourceStatus,
    Status,
};
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Clear, Paragraph};
use ratatui::Frame;
use std::collections::BTreeSet;

/// Styles, with every colour dropped under `NO_COLOR` (modifiers stay: they are not colour).
#[derive(Debug, Clone, Copy)]
struct Theme {
    no_color: bool,
}

impl Theme {
    fn fg(self, c: Color) -> Style {
        if self.no_color {
            Style::default()
        } else {
            Style::default().fg(c)
        }
    }
    fn bold(self) -> Style {
        Style::default().add_modifier(Modifier::BOLD)
    }
    fn dim(self) -> Style {
        if self.no_color {
            Style::default()
        } else {
            Style::default().fg(Color::DarkGray)
        }
    }
    fn selected(self) -> Style {
        Style::default().add_modifier(Modifier::REVERSED)
    }
    fn severity(self, s: Severity) -> Style {
        match s {
            Severity::Critical => self.fg(Color::Red).add_modifier(Modifier::BOLD),
            Severity::Warning => self.fg(Color::Yellow),
            Severity::Info => self.fg(Color::Cyan),
        }
    }
    fn status(self, s: Status) -> Style {
        match s {
            Status::Ok => self.fg(Color::Green),
            Status::Degraded => self.fg(Color::Yellow),
            Status::Unavailable => self.fg(Color::Red).add_modifier(Modifier::BOLD),
        }
    }
    fn lane(self, l: &Lane) -> Style {
        if l.stuck {
            return self.fg(Color::Red).add_modifier(Modifier::BOLD);
        }
        match l.state {
            RequestState::WaitingFirstByte => self.fg(Color::Yellow),
            RequestState::Streaming => self.fg(Color::Green),
            RequestState::Stalled => self.fg(Color::Red),
            RequestState::Done => self.fg(Color::Blue),
            RequestState::Idle | RequestState::Closed => self.dim(),
        }
    }
    fn thread_state(self, state: &str) -> Style {
        match state {
            "running_batch" | "kv_transfer" => self.fg(Color::Green),
            "waiting_gpu" | "waiting_gpu_result" => self.fg(Color::Cyan),
            "collective" | "nccl_collective" | "gloo_collective" | "pd_queue_polling" => {
                self.fg(Color::Yellow)
            }
            "stuck" | "stuck_outside_loop" => self.fg(Color::Red).add_modifier(Modifier::BOLD),
            "idle" => self.dim(),
            _ => Style::default(),
        }
    }
    fn activity(self, a: &str) -> Style {
        match a {
            "working" => self.fg(Color::Green),
            "idle" => self.fg(Color::Yellow),
            "spinning" => self.fg(Color::Red).add_modifier(Modifier::BOLD),
            _ => self.dim(),
        }
    }
}

// ------------------------------------------------------------------------------- helpers

/// Pads or cuts `s` to exactly `w` columns (cut with an ellipsis).
fn fit(s: &str, w: usize) -> String {
    let n = s.chars().count();
    if n <= w {
        let mut out = String::with_capacity(w);
        out.push_str(s);
        out.extend(std::iter::repeat_n(' ', w - n));
        out
    } else if w == 0 {
        String::new()
    } else {
        let mut out: String = s.chars().take(w - 1).collect();
        out.push('…');
        out
    }
}

/// Right-aligned to `w` columns.
fn rfit(s: &str, w: usize) -> String {
    let n = s.chars().count();
    if n >= w {
        fit(s, w)
    } else {
        format!("{}{s}", " ".repeat(w - n))
    }
}

/// `850ms`, `94.2s`, `3m12s`, `2h05m`.
pub fn fmt_ms(ms: f64) -> String {
    if !ms.is_finite() || ms < 0.0 {
        return "-".to_string();
    }
    if ms < 1000.0 {
        format!("{}ms", ms.round() as u64)
    } else if ms < 60_000.0 {
        format!("{:.1}s", ms / 1000.0)
    } else if ms < 3_600_000.0 {
        let s = (ms / 1000.0) as u64;
        format!("{}m{:02}s", s / 60, s % 60)
    } else {
        let m = (ms / 60_000.0) as u64;
        format!("{}h{:02}m", m / 60, m % 60)
    }
}

pub fn fmt_bytes(b: f64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = b;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{} B", v as u64)
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

fn fmt_num(v: f64) -> String {
    if v == v.trunc() && v.abs() < 1e12 {
        format!("{}", v as i64)
    } else if v.abs() >= 100.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.3}")
    }
}

const BARS: [char; 8] = ['▁', '▂', '▃', '▄', '▅', '▆', '▇', '█'];

/// A text sparkline of the last `w` values; `None` (no reading) shows as a space, so a
/// missing sample never looks like a zero.
pub fn sparkline(values: &[Option<f64>], w: usize, max_hint: Option<f64>) -> String {
    let tail = &values[values.len().saturating_sub(w)..];
    let max = max_hint
        .unwrap_or(0.0)
        .max(tail.iter().flatten().fold(0.0f64, |a, b| a.max(*b)));
    tail.iter()
        .map(|v| match v {
            None => ' ',
            Some(v) if max <= 0.0 || *v <= 0.0 => BARS[0],
            Some(v) => {
                let i = ((v / max) * 7.0).round() as usize;
                BARS[i.min(7)]
            }
        })
        .collect()
}

/// Greedy word wrap to `w` columns.
fn wrap(text: &str, w: usize) -> Vec<String> {
    let w = w.max(8);
    let mut out = Vec::new();
    let mut line = String::new();
    for word in text.split_whitespace() {
        let n = line.chars().count();
        if n > 0 && n + 1 + word.chars().count() > w {
            out.push(std::mem::take(&mut line));
        }
        if !line.is_empty() {
            line.push(' ');
        }
        line.push_str(word);
    }
    if !line.is_empty() {
        out.push(line);
    }
    out
}

fn short_state(s: RequestState) -> &'static str {
    match s {
        RequestState::WaitingFirstByte => "wait",
        RequestState::Streaming => "strm",
        RequestState::Stalled => "STAL",
        RequestState::Done => "done",
        RequestState::Idle => "idle",
        RequestState::Closed => "clsd",
    }
}

fn sev_tag(s: Severity) -> &'static str {
    match s {
        Severity::Critical => "CRIT",
        Severity::Warning => "WARN",
        Severity::Info => "info",
    }
}

fn time_of(taken_at: &str) -> &str {
    // RFC 3339: show the wall-clock part; anything else as is.
    taken_at.get(11..19).unwrap_or(taken_at)
}

/// First `offset` so that `selected` is visible in `height` rows.
fn scroll_offset(selected: usize, height: usize) -> usize {
    if height == 0 {
        0
    } else {
        selected.saturating_sub(height - 1)
    }
}

fn para(lines: Vec<Line<'static>>) -> Paragraph<'static> {
    Paragraph::new(lines)
}

// ------------------------------------------------------------------------------- frame

/// Draws the whole UI into `frame`.
pub fn render(app: &App, frame: &mut Frame) {
    let area = frame.area();
    if area.width == 0 || area.height == 0 {
        return;
    }
    let theme = Theme {
        no_color: app.options().no_color,
    };
    if area.width < 20 || area.height < 6 {
        let msg = if area.height >= 2 {
            "wedgewatch: window too small"
        } else {
            "wedgewatch"
        };
        frame.render_widget(Paragraph::new(fit(msg, area.width as usize)), area);
        return;
    }
    let header = header_lines(app, theme, area.width as usize);
    // The header never takes more than a third of the screen.
    let header_h = (header.len() as u16).min(area.height / 3).max(1);
    let status_h =
        u16::from(app.status().is_some() || app.is_editing_filter() || !app.filter().is_empty());
    let [head, tabs, body, status, footer] = Layout::vertical([
        Constraint::Length(header_h),
        Constraint::Length(1),
        Constraint::Min(0),
        Constraint::Length(status_h),
        Constraint::Length(1),
    ])
    .areas(area);
    frame.render_widget(para(header), head);
    frame.render_widget(para(vec![tabs_line(app, theme)]), tabs);
    match app.snapshot() {
        None => frame.render_widget(
            para(vec![Line::from("waiting for the first sample…")]),
            body,
        ),
        Some(s) => match app.view() {
            View::Overview => overview(app, s, theme, frame, body),
            View::Requests => requests(app, s, theme, frame, body),
            View::Threads => threads(app, s, theme, frame, body),
            View::Gpu => gpu(app, s, theme, frame, body),
            View::Sockets => sockets(app, s, theme, frame, body),
            View::Metrics => metrics(app, s, theme, frame, body),
            View::Diff => diff(app, s, theme, frame, body),
        },
    }
    if status_h > 0 {
        frame.render_widget(para(vec![status_line(app, theme)]), status);
    }
    frame.render_widget(para(vec![footer_line(app, theme)]), footer);
    if app.help_open() {
        help(theme, frame, area);
    }
}

fn source_summary(st: &SourceStatus) -> &'static str {
    match st.status {
        Status::Ok => "ok",
        Status::Degraded => "degraded",
        Status::Unavailable => "unavailable",
    }
}

/// Sources in the contract's order (processes, sockets, stacks, gpu, metrics), then others.
fn ordered_sources(s: &Snapshot) -> Vec<(&String, &SourceStatus)> {
    let rank = |name: &str| {
        SourceKind::ALL
            .iter()
            .position(|k| k.as_str() == name)
            .unwrap_or(SourceKind::ALL.len())
    };
    let mut v: Vec<_> = s.sources.iter().collect();
    v.sort_by(|a, b| (rank(a.0), a.0).cmp(&(rank(b.0), b.0)));
    v
}

fn header_lines(app: &App, theme: Theme, width: usize) -> Vec<Line<'static>> {
    let mut first = vec![Span::styled("wedgewatch", theme.bold())];
    let mode = match app.feed_state() {
        FeedState::Live => Span::styled(" LIVE", theme.fg(Color::Green)),
        FeedState::Replay(r) => Span::styled(
            format!(
                " REPLAY {}/{} {} x{}",
                (r.position + 1).min(r.len),
                r.len,
                if r.paused { "paused" } else { "playing" },
                fmt_num(r.speed)
            ),
            theme.fg(Color::Cyan),
        ),
        FeedState::Disconnected(why) => Span::styled(
            format!(" DISCONNECTED ({why})"),
            theme.fg(Color::Red).add_modifier(Modifier::BOLD),
        ),
    };
    first.push(mode);
    if app.is_frozen() {
        first.push(Span::styled(
            format!(" FROZEN (+{} held)", app.held_frames()),
            theme
                .fg(Color::Magenta)
                .add_modifier(Modifier::BOLD | Modifier::REVERSED),
        ));
    }
    if let Some(s) = app.snapshot() {
        first.push(Span::raw(format!(
            "  at {}  window {}",
            time_of(&s.taken_at),
            fmt_ms(s.window_ms)
        )));
    }
    if let Some(h) = app.sampler() {
        let lag = h.lag_ms.map_or("-".to_string(), |l| fmt_ms(l as f64));
        let style = if h.dropped_samples > 0 || h.lag_ms.is_some_and(|l| l > 2000) {
            theme.fg(Color::Yellow)
        } else {
            Style::default()
        };
        first.push(Span::styled(
            format!("  lag {lag}  dropped {}", h.dropped_samples),
            style,
        ));
        if let Some(n) = &h.note {
            first.push(Span::styled(format!("  {n}"), theme.fg(Color::Yellow)));
        }
    }
    let mut lines = vec![Line::from(first)];
    let Some(s) = app.snapshot() else {
        return lines;
    };
    // Sources: one compact line, then one line per source that is not ok, with its reason.
    let sources = ordered_sources(s);
    let mut spans = vec![Span::raw("sources:")];
    for (k, (name, st)) in sources.iter().enumerate() {
        spans.push(Span::raw(if k == 0 { " " } else { " · " }));
        spans.push(Span::styled(
            format!("{name} {}", source_summary(st)),
            theme.status(st.status),
        ));
    }
    if s.sources.is_empty() {
        spans.push(Span::styled(" none reported", theme.fg(Color::Yellow)));
    }
    lines.push(Line::from(spans));
    for (name, st) in sources {
        if st.status != Status::Ok {
            let reason = st.reason.as_deref().unwrap_or("no reason given");
            let text = format!(" {name} {}: {reason}", source_summary(st));
            lines.push(Line::from(Span::styled(
                fit(&text, width),
                theme.status(st.status),
            )));
        }
    }
    lines
}

fn tabs_line(app: &App, theme: Theme) -> Line<'static> {
    let mut spans = Vec::new();
    for v in View::ALL {
        let label = format!(" {} {} ", v.index() + 1, v.title());
        let style = if v == app.view() {
            theme.selected().add_modifier(Modifier::BOLD)
        } else {
            Style::default()
        };
        spans.push(Span::styled(label, style));
    }
    Line::from(spans)
}

fn status_line(app: &App, theme: Theme) -> Line<'static> {
    if app.is_editing_filter() {
        return Line::from(vec![
            Span::styled("/", theme.bold()),
            Span::raw(app.filter().to_string()),
            Span::styled("█", theme.dim()),
            Span::styled("  (enter keeps, esc clears)", theme.dim()),
        ]);
    }
    let mut spans = Vec::new();
    if !app.filter().is_empty() {
        spans.push(Span::styled(
            format!("filter: {}  ", app.filter()),
            theme.fg(Color::Cyan),
        ));
    }
    if let Some(m) = app.status() {
        spans.push(Span::raw(m.to_string()));
    }
    Line::from(spans)
}

fn footer_line(app: &App, theme: Theme) -> Line<'static> {
    let mut keys: Vec<(&str, &str)> = vec![("?", "help"), ("tab/1-7", "view"), ("j/k", "move")];
    match app.view() {
        View::Overview => keys.push(("enter", "evidence")),
        View::Requests => {
            keys.push(("enter", "hops"));
            keys.push(("o", "sort"));
            keys.push(("a", "all hops"));
        }
        View::Threads => keys.push(("enter", "frames")),
        View::Sockets => keys.push(("enter", "detail")),
        _ => {}
    }
    keys.extend([
        ("/", "filter"),
        ("f", "freeze"),
        ("s", "snapshot"),
        ("q", "quit"),
    ]);
    if matches!(app.feed_state(), FeedState::Replay(_)) {
        keys.push(("spc . , [ ] + -", "replay"));
    }
    let mut spans = Vec::new();
    for (k, what) in keys {
        spans.push(Span::styled(
            k.to_string(),
            theme.bold().patch(theme.fg(Color::Cyan)),
        ));
        spans.push(Span::raw(format!(":{what} ")));
    }
    Line::from(spans)
}

/// Every key, for the `?` overlay.
pub const HELP: &[(&str, &str)] = &[
    ("?", "this help (esc closes)"),
    ("tab / shift-tab", "next / previous view"),
    (
        "1 … 7",
        "Overview Requests Threads GPU Sockets Metrics Diff",
    ),
    ("j k ↓ ↑", "move the selection"),
    ("pgdn pgup g G", "page, first, last"),
    (
        "enter",
        "drill in: finding evidence, request hops, thread frames",
    ),
    ("esc", "back: close detail, clear filter"),
    ("/", "filter the current list (enter keeps, esc clears)"),
    (
        "o",
        "Requests: cycle sort (stuck, age, silence, component, id)",
    ),
    ("a", "Requests: all hops / one row per request"),
    ("f", "freeze the display (collection goes on)"),
    ("s", "write a snapshot bundle of what is on screen"),
    ("space", "replay: pause / play"),
    (". ,", "replay: step forward / back"),
    ("] [", "replay: seek 10 frames forward / back"),
    ("+ -", "replay: faster / slower"),
    ("q  ctrl-c", "quit"),
];

fn help(theme: Theme, frame: &mut Frame, area: Rect) {
    let w = area.width.min(76);
    let h = area.height.min(HELP.len() as u16 + 2);
    let x = area.x + (area.width - w) / 2;
    let y = area.y + (area.height - h) / 2;
    let rect = Rect::new(x, y, w, h);
    let lines: Vec<Line> = HELP
        .iter()
        .map(|(k, what)| {
            Line::from(vec![
                Span::styled(fit(k, 16), theme.bold().patch(theme.fg(Color::Cyan))),
                Span::raw(what.to_string()),
            ])
        })
        .collect();
    frame.render_widget(Clear, rect);
    frame.render_widget(
        Paragraph::new(lines).block(Block::bordered().title(" keys ")),
        rect,
    );
}

// ------------------------------------------------------------------------------- Overview

fn worst_finding<'a>(s: &'a Snapshot, component: &str) -> Option<&'a Finding> {
    s.findings
        .iter()
        .filter(|f| f.component.as_deref() == Some(component))
        .max_by_key(|f| f.severity)
}

fn component_line(
    app: &App,
    s: &Snapshot,
    c: &SnapComponent,
    theme: Theme,
    prefix: &str,
) -> Line<'static> {
    let role = match c.role {
        Role::Detokenizer => "detok",
        Role::Scheduler => "sched",
        r => r.as_str(),
    };
    // Health right after the role, so it survives a narrow screen.
    let health = match worst_finding(s, &c.id) {
        Some(f) => Span::styled(sev_tag(f.severity).to_string(), theme.severity(f.severity)),
        None => Span::styled("ok  ".to_string(), theme.fg(Color::Green)),
    };
    let mut spans = vec![
        Span::styled(prefix.to_string(), theme.dim()),
        Span::styled(format!("{role:<8}"), theme.bold()),
        health,
        Span::raw(format!(" {}", c.id)),
    ];
    if let Some(pid) = c.main_pid.or(c.pids.first().copied()) {
        spans.push(Span::styled(format!(" pid {pid}"), theme.dim()));
    }
    let flights = s
        .requests
        .iter()
        .filter(|r| r.component == c.id && in_flight(r.state))
        .count();
    if flights > 0 {
        let stuck = s
            .requests
            .iter()
            .filter(|r| {
                r.component == c.id
                    && in_flight(r.state)
                    && r.state != RequestState::Streaming
                    && r.idle_out_ms >= app.options().stuck_after_ms
            })
            .count();
        let text = if stuck > 0 {
            format!("  {flights} in flight, {stuck} silent")
        } else {
            format!("  {flights} in flight")
        };
        let style = if stuck > 0 {
            theme.fg(Color::Red)
        } else {
            Style::default()
        };
        spans.push(Span::styled(text, style));
    }
    if let Some(a) = &c.gpu_activity {
        spans.push(Span::raw("  gpu "));
        spans.push(Span::styled(a.clone(), theme.activity(a)));
    }
    if c.role == Role::Scheduler || c.role.is_engine() {
        // The scheduler's main thread over the window: "idle 3/3".
        let main: Vec<_> = s
            .threads
            .iter()
            .filter(|t| t.component.as_deref() == Some(c.id.as_str()) && Some(t.tid) == c.main_pid)
            .collect();
        if let Some(t) = main.first() {
            let agree = t
                .states_over_window
                .iter()
                .filter(|x| **x == t.state)
                .count();
            let n = t.states_over_window.len();
            let text = if n > 0 {
                format!("  loop {} {agree}/{n}", t.state)
            } else {
                format!("  loop {}", t.state)
            };
            spans.push(Span::styled(text, theme.thread_state(&t.state)));
        }
    }
    if let Some(f) = worst_finding(s, &c.id) {
        spans.push(Span::styled(
            format!("  {}", f.kind),
            theme.severity(f.severity),
        ));
    }
    Line::from(spans)
}

/// The topology as an indented tree: edges (proxy -> router -> engines), then each
/// component's children (schedulers), then the GPUs they use.
fn topology_lines(app: &App, s: &Snapshot, theme: Theme) -> Vec<Line<'static>> {
    let idx = &app.derived().component_index;
    let mut children: Vec<Vec<usize>> = vec![Vec::new(); s.components.len()];
    let mut has_parent = vec![false; s.components.len()];
    for e in &s.edges {
        if let (Some(&a), Some(&b)) = (idx.get(&e.from), idx.get(&e.to)) {
            if a != b && !children[a].contains(&b) {
                children[a].push(b);
                has_parent[b] = true;
            }
        }
    }
    for (i, c) in s.components.iter().enumerate() {
        // A healthy detokenizer says nothing about a wedge: keep the tree to the hops that do.
        if c.role == Role::Detokenizer && worst_finding(s, &c.id).is_none() {
            has_parent[i] = true;
            continue;
        }
        if let Some(p) = c.parent.as_ref().and_then(|p| idx.get(p)) {
            if *p != i && !children[*p].contains(&i) {
                children[*p].push(i);
                has_parent[i] = true;
            }
        }
    }
    for ch in &mut children {
        ch.sort_by_key(|&i| (s.components[i].role.depth(), s.components[i].id.clone()));
    }
    let mut roots: Vec<usize> = (0..s.components.len())
        .filter(|&i| !has_parent[i])
        .collect();
    roots.sort_by_key(|&i| (s.components[i].role.depth(), s.components[i].id.clone()));

    let mut lines = Vec::new();
    let mut seen = BTreeSet::new();
    // Explicit stack instead of recursion: (component, indent prefix, is last child).
    let mut stack: Vec<(usize, String, bool, bool)> = roots
        .iter()
        .rev()
        .enumerate()
        .map(|(k, &r)| (r, String::new(), k == 0, true))
        .collect();
    while let Some((i, indent, last, root)) = stack.pop() {
        if !seen.insert(i) {
            continue;
        }
        let c = &s.components[i];
        let branch = if root {
            String::new()
        } else if last {
            format!("{indent}└─ ")
        } else {
            format!("{indent}├─ ")
        };
        lines.push(component_line(app, s, c, theme, &branch));
        let child_indent = if root {
            String::new()
        } else if last {
            format!("{indent}   ")
        } else {
            format!("{indent}│  ")
        };
        // GPUs hang off the deepest component that uses them (the scheduler if known).
        let own_gpus: Vec<u32> = if children[i]
            .iter()
            .any(|&ch| s.components[ch].gpus.iter().any(|g| c.gpus.contains(g)))
        {
            Vec::new()
        } else {
            c.gpus.clone()
        };
        let kids: Vec<usize> = children[i]
            .iter()
            .copied()
            .filter(|k| !seen.contains(k))
            .collect();
        let n_items = kids.len() + own_gpus.len();
        for (k, g) in own_gpus.iter().enumerate() {
            let is_last = kids.is_empty() && k + 1 == own_gpus.len();
            let branch = format!("{child_indent}{}", if is_last { "└─ " } else { "├─ " });
            lines.push(gpu_tree_line(s, *g, theme, &branch));
        }
        let _ = n_items;
        for (k, &kid) in kids.iter().enumerate().rev() {
            stack.push((kid, child_indent.clone(), k + 1 == kids.len(), false));
        }
    }
    lines
}

fn gpu_tree_line(s: &Snapshot, index: u32, theme: Theme, prefix: &str) -> Line<'static> {
    let mut spans = vec![
        Span::styled(prefix.to_string(), theme.dim()),
        Span::styled(format!("{:<8}", "gpu"), theme.bold()),
    ];
    match s.gpus.iter().find(|g| g.index == index) {
        Some(g) => {
            spans.push(Span::raw(format!(" GPU{} {}", g.index, g.name)));
            let util = g.util_pct.map_or("-".into(), |u| format!("{u:.0}%"));
            let power = g.power_w.map_or("-".into(), |p| format!("{p:.0}W"));
            spans.push(Span::raw(format!("  util {util} power {power}")));
            if let Some(a) = &g.activity {
                spans.push(Span::raw("  "));
                spans.push(Span::styled(a.clone(), theme.activity(a)));
            }
        }
        None => {
            let why = s
                .sources
                .get("gpu")
                .filter(|st| st.status != Status::Ok)
                .map_or("no reading".to_string(), |st| {
                    format!("gpu source {}", source_summary(st))
                });
            spans.push(Span::raw(format!(" GPU{index}")));
            spans.push(Span::styled(format!("  {why}"), theme.fg(Color::Yellow)));
        }
    }
    Line::from(spans)
}

fn overview(app: &App, s: &Snapshot, theme: Theme, frame: &mut Frame, area: Rect) {
    let topo = topology_lines(app, s, theme);
    let want = topo.len() as u16 + 1;
    let topo_h = want.min(area.height / 2 + 1).min(area.height);
    let [top, bottom] =
        Layout::vertical([Constraint::Length(topo_h), Constraint::Min(0)]).areas(area);
    let mut tl = vec![Line::styled("topology", theme.bold())];
    tl.extend(topo);
    frame.render_widget(para(tl), top);

    let width = bottom.width as usize;
    let d = app.derived();
    let mut lines: Vec<Line<'static>> = Vec::new();
    let mut selected_line = 0;
    lines.push(Line::styled(
        format!(
            "findings ({}), most severe first — enter: evidence",
            d.findings.len()
        ),
        theme.bold(),
    ));
    if d.findings.is_empty() {
        lines.push(Line::styled(
            "  none: no detector fired on this window",
            theme.fg(Color::Green),
        ));
    }
    for (pos, &fi) in d.findings.iter().enumerate() {
        let f = &s.findings[fi];
        let expanded = app.is_expanded(f);
        let sel = pos == app.selected();
        if sel {
            selected_line = lines.len();
        }
        let marker = if expanded { "▾" } else { "▸" };
        let comp = f.component.as_deref().unwrap_or("-");
        let text = format!(
            "{marker} {} {:<14} {comp}  {}",
            sev_tag(f.severity),
            f.kind,
            f.summary
        );
        let mut style = theme.severity(f.severity);
        if sel {
            style = style.patch(theme.selected());
        }
        lines.push(Line::styled(fit(&text, width), style));
        if expanded {
            if text.chars().count() > width {
                for l in wrap(&f.summary, width.saturating_sub(4)) {
                    lines.push(Line::styled(format!("    {l}"), theme.severity(f.severity)));
                }
            }
            if !f.requests.is_empty() {
                lines.push(Line::raw(fit(
                    &format!("    requests: {}", f.requests.join(", ")),
                    width,
                )));
            }
            for e in &f.evidence {
                for (k, l) in wrap(
                    &format!("[{}] {}", e.source, e.detail),
                    width.saturating_sub(6),
                )
                .into_iter()
                .enumerate()
                {
                    let lead = if k == 0 { "    • " } else { "      " };
                    lines.push(Line::raw(format!("{lead}{l}")));
                }
            }
            if let Some(x) = &f.explanation {
                for (k, l) in wrap(x, width.saturating_sub(9)).into_iter().enumerate() {
                    let lead = if k == 0 { "    why: " } else { "         " };
                    lines.push(Line::styled(format!("{lead}{l}"), theme.fg(Color::Cyan)));
                }
            }
        }
    }
    let h = bottom.height as usize;
    let offset = scroll_offset(selected_line, h);
    let visible: Vec<Line<'static>> = lines.into_iter().skip(offset).take(h).collect();
    frame.render_widget(para(visible), bottom);
}

// ------------------------------------------------------------------------------- Requests

struct ReqCols {
    id: usize,
    entry: usize,
    lane: usize,
    stuck_at: usize,
    age: usize,
    silence: usize,
    bytes: usize,
    client: usize,
}

impl ReqCols {
    fn for_width(w: usize, id_w: usize) -> ReqCols {
        // Fixed columns first; entry and client take what is left on wide screens.
        let mut c = ReqCols {
            id: id_w.clamp(8, 28) + 1,
            entry: 0,
            lane: 7,
            stuck_at: 9,
            age: 7,
            silence: 8,
            bytes: 0,
            client: 0,
        };
        let fixed = 2 + c.id + 4 * c.lane + c.stuck_at + c.age + c.silence;
        let rest = w.saturating_sub(fixed);
        if rest >= 75 {
            c.bytes = 17;
            c.client = 22;
            c.entry = rest - c.bytes - c.client;
        } else if rest >= 45 {
            c.bytes = 17;
            c.entry = rest - c.bytes;
        } else {
            c.entry = rest;
        }
        c.entry = c.entry.min(40);
        c
    }
}

fn request_line(
    s: &Snapshot,
    row: &RequestRow,
    cols: &ReqCols,
    theme: Theme,
    selected: bool,
) -> Line<'static> {
    let r = &s.requests[row.index];
    let mut spans = Vec::with_capacity(14);
    let mark = if row.stuck { "! " } else { "  " };
    spans.push(Span::styled(
        mark.to_string(),
        theme.fg(Color::Red).add_modifier(Modifier::BOLD),
    ));
    spans.push(Span::raw(fit(&r.id, cols.id)));
    if cols.entry > 0 {
        spans.push(Span::raw(fit(&r.component, cols.entry.saturating_sub(1))));
        spans.push(Span::raw(" "));
    }
    for (k, lane) in row.lanes.iter().enumerate() {
        let own = k == row.lane;
        match lane {
            Some(l) => {
                let text = if own {
                    format!("[{}]", short_state(l.state))
                } else {
                    format!(" {}", short_state(l.state))
                };
                spans.push(Span::styled(fit(&text, cols.lane), theme.lane(l)));
            }
            None => spans.push(Span::styled(fit("  ·", cols.lane), theme.dim())),
        }
    }
    let stuck_at = row.stuck_at.map_or("", |l| LANES[l]);
    spans.push(Span::styled(
        fit(&format!(" {stuck_at}"), cols.stuck_at),
        theme.fg(Color::Red).add_modifier(Modifier::BOLD),
    ));
    spans.push(Span::raw(rfit(&fmt_ms(r.age_ms), cols.age)));
    let silence_style = if row.stuck {
        theme.fg(Color::Red)
    } else {
        Style::default()
    };
    spans.push(Span::styled(
        rfit(&fmt_ms(r.idle_out_ms), cols.silence),
        silence_style,
    ));
    if cols.bytes > 0 {
        spans.push(Span::raw(rfit(
            &format!(
                "{}/{}",
                fmt_bytes(r.bytes_in as f64).replace(' ', ""),
                fmt_bytes(r.bytes_out as f64).replace(' ', "")
            ),
            cols.bytes,
        )));
    }
    if cols.client > 0 {
        spans.push(Span::styled(
            format!("  {}", fit(&r.client, cols.client - 2)),
            theme.dim(),
        ));
    }
    let mut line = Line::from(spans);
    if selected {
        line = line.patch_style(theme.selected());
    }
    line
}

fn requests(app: &App, s: &Snapshot, theme: Theme, frame: &mut Frame, area: Rect) {
    let d = app.derived();
    let (list_area, detail_area) = if app.detail_open() {
        let [a, b] =
            Layout::vertical([Constraint::Percentage(55), Constraint::Percentage(45)]).areas(area);
        (a, Some(b))
    } else {
        (area, None)
    };
    let w = list_area.width as usize;
    let rows_h = (list_area.height as usize).saturating_sub(2);
    let sel = app.selected();
    let offset = scroll_offset(sel, rows_h);
    // The id column fits the visible ids (formats differ between correlator versions).
    let id_w = d
        .request_order
        .iter()
        .skip(offset)
        .take(rows_h)
        .map(|&i| s.requests[d.rows[i].index].id.chars().count())
        .max()
        .unwrap_or(8);
    let cols = ReqCols::for_width(w, id_w);
    let stuck = d.request_order.iter().filter(|&&i| d.rows[i].stuck).count();
    let title = format!(
        "{} {} ({} stuck) · sort: {} · {}",
        d.request_order.len(),
        if app.all_hops() {
            "exchanges"
        } else {
            "requests"
        },
        stuck,
        app.sort().as_str(),
        if app.all_hops() {
            "all hops (a: one row per request)"
        } else {
            "one row per request (a: all hops)"
        }
    );
    let mut lines = vec![Line::styled(fit(&title, w), theme.bold())];
    let mut head = format!("  {}", fit("ID", cols.id));
    if cols.entry > 0 {
        head.push_str(&fit("AT", cols.entry));
    }
    for l in [" proxy", " router", " prefil", " decode"] {
        head.push_str(&fit(l, cols.lane));
    }
    head.push_str(&fit(" STUCK AT", cols.stuck_at));
    head.push_str(&rfit("AGE", cols.age));
    head.push_str(&rfit("SILENCE", cols.silence));
    if cols.bytes > 0 {
        head.push_str(&rfit("IN/OUT", cols.bytes));
    }
    if cols.client > 0 {
        head.push_str(&format!("  {}", fit("CLIENT", cols.client - 2)));
    }
    lines.push(Line::styled(fit(&head, w), theme.bold().patch(theme.dim())));
    if d.request_order.is_empty() {
        let msg = if app.filter().is_empty() {
            let sockets_ok = s
                .sources
                .get("sockets")
                .is_none_or(|st| st.status == Status::Ok);
            if sockets_ok {
                "no exchanges in this window".to_string()
            } else {
                "no exchanges: the sockets source is not ok (see header)".to_string()
            }
        } else {
            format!("nothing matches the filter {:?}", app.filter())
        };
        lines.push(Line::styled(msg, theme.dim()));
    }
    for (pos, &ri) in d.request_order.iter().enumerate().skip(offset).take(rows_h) {
        lines.push(request_line(s, &d.rows[ri], &cols, theme, pos == sel));
    }
    frame.render_widget(para(lines), list_area);

    if let Some(area) = detail_area {
        let Some(row) = d.request_order.get(sel).and_then(|&i| d.rows.get(i)) else {
            return;
        };
        let w = area.width as usize;
        let mut lines = vec![Line::styled(
            fit("hops of the selected request (esc closes)", w),
            theme.bold().add_modifier(Modifier::UNDERLINED),
        )];
        let members = d.chains.get(row.chain).cloned().unwrap_or_default();
        for m in members {
            let r = &s.requests[m];
            let role = request_role(s, &d.component_index, r);
            let conf = r
                .link_confidence
                .map_or(String::new(), |c| format!(" link {:.0}%", c * 100.0));
            let text = format!(
                "{:<8} {} {} {} -> {}  {}  age {} silence {}  in {} out {}{conf}",
                LANES[lane_of(role)],
                r.id,
                r.component,
                r.client,
                r.server,
                r.state.as_str(),
                fmt_ms(r.age_ms),
                fmt_ms(r.idle_out_ms),
                r.bytes_in,
                r.bytes_out
            );
            let lane = Lane {
                state: r.state,
                idle_out_ms: r.idle_out_ms,
                stuck: row.stuck && row.stuck_at == Some(lane_of(role)),
            };
            lines.push(Line::styled(fit(&text, w), theme.lane(&lane)));
        }
        let ids: BTreeSet<usize> = d
            .chains
            .get(row.chain)
            .into_iter()
            .flatten()
            .filter_map(|&m| d.findings_by_request.get(&s.requests[m].id))
            .flatten()
            .copied()
            .collect();
        for fi in ids {
            let f = &s.findings[fi];
            lines.push(Line::styled(
                fit(
                    &format!("{} {}: {}", sev_tag(f.severity), f.kind, f.summary),
                    w,
                ),
                theme.severity(f.severity),
            ));
        }
        frame.render_widget(para(lines), area);
    }
}

// ------------------------------------------------------------------------------- Threads

fn state_letter(state: &str) -> char {
    match state {
        "idle" => 'i',
        "running_batch" => 'R',
        "waiting_gpu" | "waiting_gpu_result" => 'W',
        "collective" | "nccl_collective" | "gloo_collective" => 'C',
        "pd_queue_polling" => 'P',
        "kv_transfer" => 'K',
        "stuck" | "stuck_outside_loop" => 'S',
        "" => ' ',
        _ => '?',
    }
}

fn threads(app: &App, s: &Snapshot, theme: Theme, frame: &mut Frame, area: Rect) {
    let d = app.derived();
    let w = area.width as usize;
    // Fixed columns take 47; the component gets the rest, leaving room for ~10 dumps.
    let comp_w = w.saturating_sub(57).clamp(12, 40);
    if s.threads.is_empty() {
        let st = s.sources.get("stacks");
        let mut lines = vec![Line::styled("no thread dumps in this window", theme.bold())];
        if let Some(st) = st.filter(|st| st.status != Status::Ok) {
            lines.push(Line::styled(
                format!(
                    "stacks {}: {}",
                    source_summary(st),
                    st.reason.as_deref().unwrap_or("no reason given")
                ),
                theme.status(st.status),
            ));
            lines.push(Line::raw(
                "install py-spy (see `wedgewatch doctor`) to see what each scheduler thread does",
            ));
        }
        frame.render_widget(para(lines), area);
        return;
    }
    let frames_h = if app.detail_open() {
        area.height / 2
    } else {
        (area.height / 3).max(3).min(area.height)
    };
    let [top, bottom] =
        Layout::vertical([Constraint::Min(0), Constraint::Length(frames_h)]).areas(area);
    let mut lines = vec![
        Line::styled(
            fit(
                "state per dump, oldest → newest: i idle · R running batch · W waiting GPU · C collective · P PD queue poll · K KV transfer · S stuck · ? other",
                w,
            ),
            theme.dim(),
        ),
        Line::styled(
            fit(
                &format!(
                    "{} {} {} {} {} {}",
                    fit("COMPONENT", comp_w),
                    rfit("PID", 7),
                    rfit("TID", 7),
                    fit("NAME", 14),
                    fit("STATE", 14),
                    "DUMPS"
                ),
                w,
            ),
            theme.bold(),
        ),
    ];
    let rows_h = (top.height as usize).saturating_sub(2);
    let sel = app.selected();
    let offset = scroll_offset(sel, rows_h);
    for (pos, &ti) in d.threads.iter().enumerate().skip(offset).take(rows_h) {
        let t = &s.threads[ti];
        let mut spans = vec![
            Span::raw(format!(
                "{} {} {} {} ",
                fit(t.component.as_deref().unwrap_or("-"), comp_w),
                rfit(&t.pid.to_string(), 7),
                rfit(&t.tid.to_string(), 7),
                fit(t.name.as_deref().unwrap_or("-"), 14)
            )),
            Span::styled(fit(&t.state, 14), theme.thread_state(&t.state)),
            Span::raw(" "),
        ];
        for st in &t.states_over_window {
            spans.push(Span::styled(
                state_letter(st).to_string(),
                theme.thread_state(st),
            ));
        }
        let mut line = Line::from(spans);
        if pos == sel {
            line = line.patch_style(theme.selected());
        }
        lines.push(line);
    }
    frame.render_widget(para(lines), top);

    let mut fl = Vec::new();
    if let Some(t) = d.threads.get(sel).and_then(|&i| s.threads.get(i)) {
        fl.push(Line::styled(
            fit(
                &format!(
                    "frames of {} tid {} ({}), innermost first{}",
                    t.name.as_deref().unwrap_or("thread"),
                    t.tid,
                    t.state,
                    if app.detail_open() {
                        ""
                    } else {
                        " — enter: more"
                    }
                ),
                w,
            ),
            theme.bold().add_modifier(Modifier::UNDERLINED),
        ));
        if t.frames.is_empty() {
            fl.push(Line::styled("  (no frames captured)", theme.dim()));
        }
        for f in &t.frames {
            fl.push(Line::raw(fit(&format!("  {f}"), w)));
        }
    }
    frame.render_widget(para(fl), bottom);
}

// ------------------------------------------------------------------------------- GPU

fn gpu(app: &App, s: &Snapshot, theme: Theme, frame: &mut Frame, area: Rect) {
    let w = area.width as usize;
    let spark_w = w.saturating_sub(40).clamp(4, 60);
    let hist = app.history();
    let mut lines: Vec<Line<'static>> = Vec::new();
    if let Some(st) = s.sources.get("gpu").filter(|st| st.status != Status::Ok) {
        lines.push(Line::styled(
            fit(
                &format!(
                    "gpu source {}: {}",
                    source_summary(st),
                    st.reason.as_deref().unwrap_or("no reason given")
                ),
                w,
            ),
            theme.status(st.status),
        ));
    }
    if s.gpus.is_empty() {
        lines.push(Line::styled(
            "no GPU readings: activity cannot be judged from the GPU (shown as unknown, not as idle)",
            theme.dim(),
        ));
    }
    // Engines' verdicts (they combine GPU, per-process samples and engine counters).
    let verdicts: Vec<&SnapComponent> = s
        .components
        .iter()
        .filter(|c| c.gpu_activity.is_some())
        .collect();
    if !verdicts.is_empty() {
        let mut spans = vec![Span::styled("activity verdicts:", theme.bold())];
        for c in verdicts {
            let a = c.gpu_activity.clone().unwrap_or_default();
            spans.push(Span::raw(format!(" {} ", c.id)));
            spans.push(Span::styled(a.clone(), theme.activity(&a)));
        }
        lines.push(Line::from(spans));
    }
    let sel = app.selected();
    let mut item = 0usize;
    let mut selected_line = 0usize;
    for g in &s.gpus {
        let series = |k: usize| -> Vec<Option<f64>> {
            hist.iter()
                .map(|p| {
                    p.gpus.get(&g.index).and_then(|v| match k {
                        0 => v.util_pct,
                        1 => v.power_w,
                        _ => v.mem_used_bytes,
                    })
                })
                .collect()
        };
        if item == sel {
            selected_line = lines.len();
        }
        let mut head = vec![Span::styled(
            format!("GPU{} {}", g.index, g.name),
            theme.bold(),
        )];
        if let Some(a) = &g.activity {
            head.push(Span::raw("  activity "));
            head.push(Span::styled(a.clone(), theme.activity(a)));
        }
        let mut head = Line::from(head);
        if item == sel {
            head = head.patch_style(theme.selected());
        }
        lines.push(head);
        item += 1;
        let util = g.util_pct.map_or("-".into(), |u| format!("{u:.0} %"));
        let power = g.power_w.map_or("-".into(), |p| format!("{p:.0} W"));
        let mem = g.mem_used_bytes.map_or("-".into(), |b| fmt_bytes(b as f64));
        for (label, value, data, max) in [
            ("util", util, series(0), Some(100.0)),
            ("power", power, series(1), None),
            ("memory", mem, series(2), None),
        ] {
            lines.push(Line::from(vec![
                Span::raw(format!("  {} {} ", fit(label, 7), rfit(&value, 10))),
                Span::styled(sparkline(&data, spark_w, max), theme.fg(Color::Green)),
            ]));
        }
        for p in &g.processes {
            if item == sel {
                selected_line = lines.len();
            }
            let data: Vec<Option<f64>> = hist
                .iter()
                .map(|h| h.gpu_processes.get(&(g.index, p.pid)).copied().flatten())
                .collect();
            let text = format!(
                "  pid {} {} mem {} sm {} ",
                rfit(&p.pid.to_string(), 7),
                fit(p.component.as_deref().unwrap_or("-"), 26),
                rfit(
                    &p.used_mem_bytes.map_or("-".into(), |b| fmt_bytes(b as f64)),
                    10
                ),
                rfit(&p.sm_util_pct.map_or("-".into(), |u| format!("{u}%")), 4),
            );
            let mut line = Line::from(vec![
                Span::raw(text),
                Span::styled(
                    sparkline(&data, spark_w.min(20), None),
                    theme.fg(Color::Green),
                ),
            ]);
            if item == sel {
                line = line.patch_style(theme.selected());
            }
            lines.push(line);
            item += 1;
        }
    }
    let h = area.height as usize;
    let offset = scroll_offset(selected_line, h);
    frame.render_widget(para(lines.into_iter().skip(offset).take(h).collect()), area);
}

// ------------------------------------------------------------------------------- Sockets

fn sockets(app: &App, s: &Snapshot, theme: Theme, frame: &mut Frame, area: Rect) {
    let w = area.width as usize;
    let d = app.derived();
    let hist = app.history();
    let mut top: Vec<Line<'static>> = Vec::new();
    if let Some(st) = s
        .sources
        .get("sockets")
        .filter(|st| st.status != Status::Ok)
    {
        top.push(Line::styled(
            fit(
                &format!(
                    "sockets source {}: {}",
                    source_summary(st),
                    st.reason.as_deref().unwrap_or("no reason given")
                ),
                w,
            ),
            theme.status(st.status),
        ));
    }
    top.push(Line::styled(
        fit(
            "per component: exchanges in flight, sockets by TCP state (sparklines: over time)",
            w,
        ),
        theme.bold(),
    ));
    // Per-state sparklines only where there is room for them.
    let state_spark = if w >= 120 { 8 } else { 0 };
    let comp_w = if w >= 120 { 30 } else { 24 };
    for c in &s.components {
        if c.sockets.is_empty() && !s.requests.iter().any(|r| r.component == c.id) {
            continue;
        }
        let data: Vec<Option<f64>> = hist
            .iter()
            .map(|p| Some(f64::from(p.in_flight.get(&c.id).copied().unwrap_or(0))))
            .collect();
        let now = s
            .requests
            .iter()
            .filter(|r| r.component == c.id && in_flight(r.state))
            .count();
        let mut spans = vec![Span::raw(format!(
            "  {} {} ",
            fit(&c.id, comp_w),
            rfit(&now.to_string(), 3)
        ))];
        spans.push(Span::styled(
            fit(&sparkline(&data, 8, None), 9),
            theme.fg(Color::Green),
        ));
        for (state, n) in &c.sockets {
            let style = if state == "CLOSE_WAIT" && *n > 0 {
                theme.fg(Color::Yellow)
            } else {
                Style::default()
            };
            spans.push(Span::styled(format!("{state} {n} "), style));
            if state_spark > 0 && state != "LISTEN" {
                let series: Vec<Option<f64>> = hist
                    .iter()
                    .map(|p| {
                        p.sockets
                            .get(&c.id)
                            .map(|m| f64::from(m.get(state).copied().unwrap_or(0)))
                    })
                    .collect();
                spans.push(Span::styled(
                    sparkline(&series, state_spark, None),
                    theme.fg(Color::Green),
                ));
            }
            spans.push(Span::raw(" "));
        }
        top.push(Line::from(spans));
    }
    let top_h = (top.len() as u16).min(area.height / 2);
    let [upper, lower] =
        Layout::vertical([Constraint::Length(top_h), Constraint::Min(0)]).areas(area);
    frame.render_widget(para(top), upper);

    // Narrow screens drop the server column: the component names the server side.
    let wide = w >= 120;
    let (server_w, comp_w) = if wide { (23, 26) } else { (0, 20) };
    let mut lines = vec![
        Line::styled(
            fit(
                "connections (exchanges), in flight and most silent first; silence = time since the server last sent data (tcp_info)",
                w,
            ),
            theme.bold(),
        ),
        Line::styled(
            fit(
                &format!(
                    "{}{} {} {} {} {}",
                    fit("CLIENT", 22),
                    fit(if wide { "SERVER" } else { "" }, server_w),
                    fit("COMPONENT", comp_w),
                    fit("STATE", 18),
                    rfit("SILENCE", 8),
                    rfit("AGE", 8)
                ),
                w,
            ),
            theme.dim(),
        ),
    ];
    let rows_h = (lower.height as usize).saturating_sub(2);
    let sel = app.selected();
    let offset = scroll_offset(sel, rows_h);
    for (pos, &ri) in d.connections.iter().enumerate().skip(offset).take(rows_h) {
        let r = &s.requests[ri];
        let row = &d.rows[ri];
        let lane = Lane {
            state: r.state,
            idle_out_ms: r.idle_out_ms,
            stuck: row.stuck
                && row.stuck_at.is_some()
                && in_flight(r.state)
                && r.state != RequestState::Streaming,
        };
        let mut line = Line::from(vec![
            Span::raw(format!(
                "{}{} {} ",
                fit(&r.client, 22),
                fit(if wide { &r.server } else { "" }, server_w),
                fit(&r.component, comp_w)
            )),
            Span::styled(fit(r.state.as_str(), 18), theme.lane(&lane)),
            Span::raw(format!(
                " {} {}",
                rfit(&fmt_ms(r.idle_out_ms), 8),
                rfit(&fmt_ms(r.age_ms), 8)
            )),
        ]);
        if pos == sel {
            line = line.patch_style(theme.selected());
        }
        lines.push(line);
    }
    if app.detail_open() {
        if let Some(r) = d.connections.get(sel).and_then(|&i| s.requests.get(i)) {
            lines.push(Line::styled(
                fit(
                    &format!(
                        "{}: {} -> {} bytes in {} out {} links {}",
                        r.id,
                        r.client,
                        r.server,
                        r.bytes_in,
                        r.bytes_out,
                        if r.links.is_empty() {
                            "-".to_string()
                        } else {
                            r.links.join(",")
                        }
                    ),
                    w,
                ),
                theme.fg(Color::Cyan),
            ));
        }
    }
    frame.render_widget(para(lines), lower);
}

// ------------------------------------------------------------------------------- Metrics

fn metrics(app: &App, s: &Snapshot, theme: Theme, frame: &mut Frame, area: Rect) {
    let w = area.width as usize;
    let d = app.derived();
    let hist = app.history();
    let mut lines: Vec<Line<'static>> = Vec::new();
    if let Some(st) = s
        .sources
        .get("metrics")
        .filter(|st| st.status != Status::Ok)
    {
        lines.push(Line::styled(
            fit(
                &format!(
                    "metrics source {}: {}",
                    source_summary(st),
                    st.reason.as_deref().unwrap_or("no reason given")
                ),
                w,
            ),
            theme.status(st.status),
        ));
    }
    for f in s
        .findings
        .iter()
        .filter(|f| f.kind == "endpoint_unresponsive")
    {
        lines.push(Line::styled(
            fit(&format!("{} {}", sev_tag(f.severity), f.summary), w),
            theme.severity(f.severity),
        ));
    }
    // Components that should export metrics but gave none: say so instead of leaving them out.
    let silent: Vec<&str> = s
        .components
        .iter()
        .filter(|c| (c.role.is_engine() || c.role == Role::Router) && c.metrics.is_empty())
        .map(|c| c.id.as_str())
        .collect();
    if !silent.is_empty() {
        lines.push(Line::styled(
            fit(
                &format!("no metrics this window from: {}", silent.join(", ")),
                w,
            ),
            theme.fg(Color::Yellow),
        ));
    }
    lines.push(Line::styled(
        fit(
            &format!(
                "{} {} {} {}",
                fit("METRIC", 34),
                rfit("VALUE", 14),
                rfit("RATE/s", 12),
                "HISTORY"
            ),
            w,
        ),
        theme.bold(),
    ));
    let head = lines.len();
    let rows_h = (area.height as usize).saturating_sub(head);
    let sel = app.selected();
    // Component headings are interleaved, so scroll over the metric lines with some slack.
    let offset = scroll_offset(sel, rows_h.saturating_sub(rows_h / 3).max(1));
    let mut last_comp = None;
    for (pos, (ci, name)) in d.metric_lines.iter().enumerate().skip(offset) {
        if lines.len() >= area.height as usize {
            break;
        }
        let c = &s.components[*ci];
        if last_comp != Some(*ci) {
            last_comp = Some(*ci);
            lines.push(Line::styled(
                fit(&format!("{} ({})", c.id, c.role), w),
                theme.fg(Color::Cyan).add_modifier(Modifier::BOLD),
            ));
        }
        let value = c.metrics.get(name).copied().unwrap_or(f64::NAN);
        let rate = c.metrics.get(&format!("{name}_rate")).copied();
        let data: Vec<Option<f64>> = hist
            .iter()
            .map(|p| p.metrics.get(&c.id).and_then(|m| m.get(name)).copied())
            .collect();
        let rate_style = match rate {
            Some(0.0) => theme.fg(Color::Yellow),
            _ => Style::default(),
        };
        let mut line = Line::from(vec![
            Span::raw(format!(
                "  {} {} ",
                fit(name, 32),
                rfit(&fmt_num(value), 14)
            )),
            Span::styled(rfit(&rate.map_or(String::new(), fmt_num), 12), rate_style),
            Span::raw(" "),
            Span::styled(sparkline(&data, 20, None), theme.fg(Color::Green)),
        ]);
        if pos == sel {
            line = line.patch_style(theme.selected());
        }
        lines.push(line);
    }
    if d.metric_lines.is_empty() {
        lines.push(Line::styled("no metrics in this window", theme.dim()));
    }
    frame.render_widget(para(lines), area);
}

// ------------------------------------------------------------------------------- Diff

fn diff(app: &App, s: &Snapshot, theme: Theme, frame: &mut Frame, area: Rect) {
    let w = area.width as usize;
    let d = app.derived();
    let baseline = s.tool.get("baseline").cloned();
    let mut lines = vec![Line::styled(
        fit(
            &format!(
                "changes against the baseline{}",
                baseline.map_or(String::new(), |b| format!(" ({b})"))
            ),
            w,
        ),
        theme.bold(),
    )];
    if s.config_changed.is_empty() {
        lines.push(Line::styled(
            "no changes against the baseline (or no baseline was taken)",
            theme.fg(Color::Green),
        ));
        frame.render_widget(para(lines), area);
        return;
    }
    // Wide screens: one line per change. Narrow ones: before -> after on a second line, so
    // the key (an env var name can be long) is never cut.
    let wide = w >= 120;
    let header = if wide {
        format!(
            "{} {} {} {} BEFORE -> AFTER",
            fit("COMPONENT", 26),
            fit("ROLE", 8),
            fit("FIELD", 8),
            fit("KEY", 36)
        )
    } else {
        format!(
            "{} {} KEY / before -> after",
            fit("COMPONENT", 24),
            fit("FIELD", 8)
        )
    };
    lines.push(Line::styled(fit(&header, w), theme.dim()));
    let per_item = if wide { 1 } else { 2 };
    let rows_h = (area.height as usize).saturating_sub(2) / per_item;
    let sel = app.selected();
    let offset = scroll_offset(sel, rows_h);
    for (pos, &ci) in d.changes.iter().enumerate().skip(offset).take(rows_h) {
        let c = &s.config_changed[ci];
        let before = c.before.as_deref().unwrap_or("(absent)");
        let after = c.after.as_deref().unwrap_or("(absent)");
        let key = c.key.as_deref().unwrap_or("-");
        let change = vec![
            Span::styled(before.to_string(), theme.fg(Color::Red)),
            Span::raw(" -> "),
            Span::styled(after.to_string(), theme.fg(Color::Green)),
        ];
        let mut first = if wide {
            let mut spans = vec![
                Span::raw(format!(
                    "{} {} {} ",
                    fit(&c.component, 26),
                    fit(c.role.as_str(), 8),
                    fit(&c.field, 8)
                )),
                Span::styled(fit(key, 36), theme.bold()),
                Span::raw(" "),
            ];
            spans.extend(change.clone());
            Line::from(spans)
        } else {
            Line::from(vec![
                Span::raw(format!("{} {} ", fit(&c.component, 24), fit(&c.field, 8))),
                Span::styled(key.to_string(), theme.bold()),
            ])
        };
        if pos == sel {
            first = first.patch_style(theme.selected());
        }
        lines.push(first);
        if !wide {
            let mut spans = vec![Span::raw("    ")];
            spans.extend(change);
            lines.push(Line::from(spans));
        }
    }
    frame.render_widget(para(lines), area);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fit_pads_and_cuts() {
        assert_eq!(fit("abc", 5), "abc  ");
        assert_eq!(fit("abcdef", 4), "abc…");
        assert_eq!(fit("abc", 0), "");
        assert_eq!(rfit("7", 3), "  7");
    }

    #[test]
    fn durations_and_sizes_read_well() {
        assert_eq!(fmt_ms(850.0), "850ms");
        assert_eq!(fmt_ms(94_200.0), "1m34s");
        assert_eq!(fmt_ms(9_400.0), "9.4s");
        assert_eq!(fmt_ms(7_500_000.0), "2h05m");
        assert_eq!(fmt_bytes(512.0), "512 B");
        assert_eq!(fmt_bytes(76_450_000_000.0), "71.2 GiB");
    }

    #[test]
    fn sparkline_scales_and_shows_gaps() {
        assert_eq!(
            sparkline(&[Some(0.0), Some(50.0), Some(100.0)], 10, Some(100.0)),
            "▁▅█"
        );
        assert_eq!(sparkline(&[Some(1.0), None, Some(2.0)], 10, None), "▅ █");
        assert_eq!(sparkline(&[Some(1.0), Some(2.0), Some(3.0)], 2, None), "▆█");
        assert_eq!(sparkline(&[], 5, None), "");
    }

    #[test]
    fn wrap_breaks_on_words() {
        assert_eq!(wrap("aaa bbb ccc", 8), vec!["aaa bbb", "ccc"]);
    }
}
