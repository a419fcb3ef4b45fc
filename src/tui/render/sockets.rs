//! Sockets view: per-component TCP states over time, and the connection list.

use super::{fit, fmt_ms, para, rfit, scroll_offset, source_problem_line, sparkline, Theme};
use crate::model::{Request, RequestState, SnapComponent, Snapshot};
use crate::tui::app::{in_flight, App, HistoryPoint, Lane, RequestRow};
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Color, Style};
use ratatui::text::{Line, Span};
use ratatui::Frame;
use std::collections::VecDeque;

pub(super) fn render(app: &App, s: &Snapshot, theme: Theme, frame: &mut Frame, area: Rect) {
    let w = area.width as usize;
    let mut top = component_lines(app, s, theme, w);
    let top_h = (top.len() as u16).min(area.height / 2);
    if top.len() > top_h as usize && top_h > 0 {
        // Cut: say so instead of dropping components silently.
        let hidden = top.len() - (top_h as usize - 1);
        top.truncate(top_h as usize - 1);
        top.push(Line::styled(
            fit(
                &format!("  … {hidden} more components; every connection is listed below"),
                w,
            ),
            theme.dim(),
        ));
    }
    let [upper, lower] =
        Layout::vertical([Constraint::Length(top_h), Constraint::Min(0)]).areas(area);
    frame.render_widget(para(top), upper);
    frame.render_widget(para(connection_lines(app, s, theme, w, lower)), lower);
}

/// The upper part: the source's problem if any, then one line per component that has
/// sockets or exchanges.
fn component_lines(app: &App, s: &Snapshot, theme: Theme, w: usize) -> Vec<Line<'static>> {
    let mut top: Vec<Line<'static>> = Vec::new();
    top.extend(source_problem_line(s, "sockets", theme, w));
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
        top.push(component_line(
            app.history(),
            s,
            c,
            theme,
            comp_w,
            state_spark,
        ));
    }
    top
}

/// One component: exchanges in flight now and over time, then each TCP state's count (with
/// its sparkline when `state_spark` > 0).
fn component_line(
    hist: &VecDeque<HistoryPoint>,
    s: &Snapshot,
    c: &SnapComponent,
    theme: Theme,
    comp_w: usize,
    state_spark: usize,
) -> Line<'static> {
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
    Line::from(spans)
}

/// Column widths of the connection list. Narrow screens drop the server column: the
/// component names the server side.
struct ConnCols {
    wide: bool,
    server: usize,
    component: usize,
}

impl ConnCols {
    fn for_width(w: usize) -> ConnCols {
        let wide = w >= 120;
        let (server, component) = if wide { (23, 26) } else { (0, 20) };
        ConnCols {
            wide,
            server,
            component,
        }
    }
}

/// The lower part: the connection list (title, column heads, rows) and, when open, the
/// selected connection's detail.
fn connection_lines(
    app: &App,
    s: &Snapshot,
    theme: Theme,
    w: usize,
    area: Rect,
) -> Vec<Line<'static>> {
    let d = app.derived();
    let cols = ConnCols::for_width(w);
    let mut lines = connection_heading(&cols, theme, w);
    let rows_h = (area.height as usize).saturating_sub(2);
    let sel = app.selected();
    let offset = scroll_offset(sel, rows_h);
    for (pos, &ri) in d.connections.iter().enumerate().skip(offset).take(rows_h) {
        let line = connection_line(&s.requests[ri], &d.rows[ri], &cols, theme);
        lines.push(if pos == sel {
            line.patch_style(theme.selected())
        } else {
            line
        });
    }
    if app.detail_open() {
        if let Some(r) = d.connections.get(sel).and_then(|&i| s.requests.get(i)) {
            lines.push(connection_detail(r, theme, w));
        }
    }
    lines
}

fn connection_heading(cols: &ConnCols, theme: Theme, w: usize) -> Vec<Line<'static>> {
    vec![
        Line::styled(
            fit(
                "connections (exchanges): held by a stuck request first, then in flight, most silent first; silence = time since the server last sent data (tcp_info)",
                w,
            ),
            theme.bold(),
        ),
        Line::styled(
            fit(
                &format!(
                    "{}{} {} {} {} {}",
                    fit("CLIENT", 22),
                    fit(if cols.wide { "SERVER" } else { "" }, cols.server),
                    fit("COMPONENT", cols.component),
                    fit("STATE", 18),
                    rfit("SILENCE", 8),
                    rfit("AGE", 8)
                ),
                w,
            ),
            theme.head(),
        ),
    ]
}

fn connection_line(r: &Request, row: &RequestRow, cols: &ConnCols, theme: Theme) -> Line<'static> {
    let lane = Lane {
        state: r.state,
        idle_out_ms: r.idle_out_ms,
        stuck: row.stuck
            && row.stuck_at.is_some()
            && in_flight(r.state)
            && r.state != RequestState::Streaming,
    };
    Line::from(vec![
        Span::raw(format!(
            "{}{} {} ",
            fit(&r.client, 22),
            fit(if cols.wide { &r.server } else { "" }, cols.server),
            fit(&r.component, cols.component)
        )),
        Span::styled(fit(r.state.as_str(), 18), theme.lane(&lane)),
        Span::raw(format!(
            " {} {}",
            rfit(&fmt_ms(r.idle_out_ms), 8),
            rfit(&fmt_ms(r.age_ms), 8)
        )),
    ])
}

fn connection_detail(r: &Request, theme: Theme, w: usize) -> Line<'static> {
    Line::styled(
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
    )
}
