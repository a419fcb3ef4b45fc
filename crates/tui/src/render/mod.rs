//! Drawing the state. Reads [`App`] only; everything expensive was computed on ingest, so a
//! frame costs what is visible, not what is in the snapshot.
//!
//! This file holds what every tab shares: the `Theme`, text helpers (fitting, durations,
//! sizes, sparklines), the frame layout (header, tabs, status, footer) and the help overlay.
//! Each tab draws its body in its own file.

mod cause;
mod channels;
mod components;
mod diff;
mod gpu;
mod headline;
mod lanes;
mod metrics;
mod overview;
mod requests;
mod sockets;
mod threads;

use super::app::{App, Lane, Tab};
use super::feed::FeedState;
use crate::model::{
    RequestState, Severity, Snapshot, SourceKind, SourceStatus, Status, ThreadState,
};
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Clear, Paragraph, Scrollbar, ScrollbarOrientation, ScrollbarState};
use ratatui::Frame;

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
    /// Secondary text. The DIM attribute, not colour 8 (dark grey): colour 8 vanishes on
    /// dark themes and some light ones, while DIM is drawn relative to the theme's own
    /// foreground. An attribute, not a colour, so it stays under `NO_COLOR`.
    fn dim(self) -> Style {
        Style::default().add_modifier(Modifier::DIM)
    }
    /// Column heads and section titles: bold, never a faint colour, so they read on dark and
    /// light themes alike.
    fn head(self) -> Style {
        self.bold()
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
            // Not blue: ANSI blue is near-invisible on many dark themes.
            RequestState::Done => Style::default(),
            RequestState::Idle | RequestState::Closed => self.dim(),
        }
    }
    fn thread_state(self, state: &ThreadState) -> Style {
        match state {
            ThreadState::RunningBatch => self.fg(Color::Green),
            ThreadState::WaitingGpuResult | ThreadState::WaitingWorkers => self.fg(Color::Cyan),
            // An earlier build's name, still in tests/fixtures/snapshots/healthy.json.
            ThreadState::Other(s) if s == "waiting_gpu" => self.fg(Color::Cyan),
            ThreadState::Collective
            | ThreadState::NcclCollective
            | ThreadState::GlooCollective
            | ThreadState::P2pWait
            | ThreadState::PdQueuePolling => self.fg(Color::Yellow),
            ThreadState::StuckOutsideLoop | ThreadState::Shutdown => {
                self.fg(Color::Red).add_modifier(Modifier::BOLD)
            }
            ThreadState::Idle | ThreadState::HelperIdle => self.dim(),
            ThreadState::Startup
            | ThreadState::Waiting
            | ThreadState::Unknown
            | ThreadState::Other(_) => Style::default(),
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

/// A component id padded or cut to `w` columns: whole when it fits, else with its host
/// left out (`proxy@…:30123`, `scheduler@decode@…:30052`): the roles and the port tell hops
/// apart where the host is the same for all, and a plain cut loses the port.
fn short_id(id: &str, w: usize) -> String {
    if id.chars().count() > w {
        if let (Some((roles, _)), Some((_, port))) = (id.rsplit_once('@'), id.rsplit_once(':')) {
            let role = roles.split('@').next().unwrap_or(roles);
            for short in [format!("{roles}@…:{port}"), format!("{role}@…:{port}")] {
                if short.chars().count() <= w {
                    return fit(&short, w);
                }
            }
        }
    }
    fit(id, w)
}

/// Cut to at most `w` columns (with an ellipsis), never padded.
fn cut(s: &str, w: usize) -> String {
    if s.chars().count() <= w {
        s.to_string()
    } else {
        fit(s, w)
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

/// First line to show in `height` rows so that lines `first..=last` (the row under the
/// cursor, which may wrap onto several lines) are in sight, its first line winning when it
/// is taller than the pane.
fn keep_visible(first: usize, last: usize, height: usize) -> usize {
    if height == 0 {
        return 0;
    }
    last.saturating_sub(height - 1).min(first)
}

/// Draws `lines` from `offset` into `area`, with a scrollbar on the right edge when they do
/// not all fit, so a pane that hides lines says so (and where in them it is).
fn render_scrolled(frame: &mut Frame, area: Rect, lines: Vec<Line<'static>>, offset: usize) {
    let h = area.height as usize;
    let total = lines.len();
    let offset = offset.min(total.saturating_sub(h));
    let bar = total > h && h >= 2 && area.width >= 2;
    // The scrollbar gets the last column to itself.
    let text_area = if bar {
        Rect {
            width: area.width - 1,
            ..area
        }
    } else {
        area
    };
    frame.render_widget(
        para(lines.into_iter().skip(offset).take(h).collect()),
        text_area,
    );
    if bar {
        let mut state = ScrollbarState::new(total.saturating_sub(h)).position(offset);
        frame.render_stateful_widget(
            Scrollbar::new(ScrollbarOrientation::VerticalRight)
                .symbols(ratatui::symbols::scrollbar::VERTICAL)
                .begin_symbol(None)
                .end_symbol(None),
            area,
            &mut state,
        );
    }
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
    frame.render_widget(para(vec![tabs_line(app, theme, area.width as usize)]), tabs);
    match app.snapshot() {
        None => frame.render_widget(
            para(vec![Line::from("waiting for the first sample…")]),
            body,
        ),
        Some(s) => match app.tab() {
            Tab::Overview => overview::render(app, s, theme, frame, body),
            Tab::Requests => requests::render(app, s, theme, frame, body),
            Tab::Threads => threads::render(app, s, theme, frame, body),
            Tab::Gpu => gpu::render(app, s, theme, frame, body),
            Tab::Sockets => sockets::render(app, s, theme, frame, body),
            Tab::Metrics => metrics::render(app, s, theme, frame, body),
            Tab::Diff => diff::render(app, s, theme, frame, body),
            Tab::Components => components::render(app, s, theme, frame, body),
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

/// `"<name> source degraded: <reason>"`, cut to `width`, when the source `name` is not ok.
fn source_problem_line(
    s: &Snapshot,
    name: &str,
    theme: Theme,
    width: usize,
) -> Option<Line<'static>> {
    let st = s.sources.get(name).filter(|st| st.status != Status::Ok)?;
    Some(Line::styled(
        fit(
            &format!(
                "{name} source {}: {}",
                source_summary(st),
                st.reason.as_deref().unwrap_or("no reason given")
            ),
            width,
        ),
        theme.status(st.status),
    ))
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

/// The header: the feed line, then (when a snapshot is on screen) the most severe finding,
/// the cause line when requests are stuck, and the sources.
fn header_lines(app: &App, theme: Theme, width: usize) -> Vec<Line<'static>> {
    let mut lines = vec![Line::from(feed_spans(app, theme))];
    if let Some(s) = app.snapshot() {
        lines.push(headline::headline(s, theme, width));
        if let Some(c) = &app.derived().cause {
            lines.push(cause::cause_line(c, theme, width));
        }
        lines.extend(source_lines(s, theme, width));
    }
    lines
}

/// The first header line: feed mode, freeze, snapshot time and window, sampler lag.
fn feed_spans(app: &App, theme: Theme) -> Vec<Span<'static>> {
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
    first
}

/// Sources: one compact line, then one line per source that is not ok, with its reason.
fn source_lines(s: &Snapshot, theme: Theme, width: usize) -> Vec<Line<'static>> {
    let mut lines = Vec::new();
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

fn tabs_line(app: &App, theme: Theme, width: usize) -> Line<'static> {
    // One space between tabs below 92 columns, so all eight fit in 80.
    let compact = width < 92;
    let mut spans = Vec::new();
    for v in Tab::ALL {
        let label = if compact {
            format!(" {} {}", v.index() + 1, v.title())
        } else {
            format!(" {} {} ", v.index() + 1, v.title())
        };
        let style = if v == app.tab() {
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
    // The tab's own keys first, so a narrow footer keeps them.
    let mut keys: Vec<(&str, &str)> = vec![("?", "help"), ("q", "quit")];
    match app.tab() {
        Tab::Overview => keys.push(("enter", "lanes+evidence")),
        Tab::Requests => {
            keys.push(("enter", "hops"));
            keys.push(("o", "sort"));
            keys.push(("a", "all hops"));
        }
        Tab::Threads => keys.push(("enter", "frames")),
        Tab::Components => keys.push(("enter", "detail")),
        Tab::Sockets => keys.push(("enter", "detail")),
        _ => {}
    }
    keys.push(("t/d/m", "follow"));
    if app.can_go_back() || app.detail_open() {
        keys.push(("esc", "back"));
    }
    keys.extend([
        ("1-8", "tab"),
        ("/", "filter"),
        ("f", "freeze"),
        ("s", "snapshot"),
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
    ("?  esc", "this help / close it"),
    ("tab / shift-tab", "next / previous tab"),
    ("1 … 8", "the tabs in order: Overview … Diff, Components"),
    ("j k ↓ ↑", "move; in open frames/detail: scroll them"),
    ("pgdn pgup g G", "page, first, last (home, end too)"),
    (
        "enter",
        "drill in: evidence and lanes, hops, frames, detail",
    ),
    (
        "t d m",
        "follow the blamed hop: its scheduler thread, diff, metrics",
    ),
    ("esc", "back: close detail, clear filter, return from t/d/m"),
    ("/", "filter the current list (enter keeps, esc clears)"),
    (
        "o  a",
        "Requests: cycle sort / all hops or one row per request",
    ),
    ("f", "freeze the display (collection goes on)"),
    ("s", "write a snapshot bundle of what is on screen"),
    (
        "space . , ] [ + -",
        "replay: pause, step, seek 10, faster / slower",
    ),
    ("q  ctrl-c", "quit"),
];

/// What the short words and ids on screen mean, for the `?` overlay.
pub const LEGEND: &[(&str, &str)] = &[
    (
        "wait  strm",
        "waiting for the first response byte / streaming",
    ),
    ("STAL  done", "a stream that stopped / answered"),
    (
        "idle  clsd",
        "open with nothing outstanding / connection closed",
    ),
    (
        "r36  r36@decode",
        "a request across its hops / its hop at decode",
    ),
    (
        "x34  c8",
        "one exchange (a hop's HTTP exchange) / an idle connection",
    ),
    (
        "!  [wait]",
        "stuck request; the hop it is stuck at / the row's own hop",
    ),
];

fn help(theme: Theme, frame: &mut Frame, area: Rect) {
    let w = area.width.min(78);
    let lines = help_lines(theme);
    let h = area.height.min(lines.len() as u16 + 2);
    let x = area.x + (area.width - w) / 2;
    let y = area.y + (area.height - h) / 2;
    let rect = Rect::new(x, y, w, h);
    frame.render_widget(Clear, rect);
    frame.render_widget(
        Paragraph::new(lines).block(Block::bordered().title(" keys · legend ")),
        rect,
    );
}

/// The keys, a rule, then the legend.
fn help_lines(theme: Theme) -> Vec<Line<'static>> {
    let key = theme.bold().patch(theme.fg(Color::Cyan));
    let row = |k: &str, what: &str, kw: usize| {
        Line::from(vec![
            Span::styled(fit(k, kw), key),
            Span::raw(what.to_string()),
        ])
    };
    let mut lines: Vec<Line<'static>> = HELP.iter().map(|(k, w)| row(k, w, 18)).collect();
    lines.push(Line::styled("── on screen", theme.head()));
    lines.extend(LEGEND.iter().map(|(k, w)| row(k, w, 18)));
    lines
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
