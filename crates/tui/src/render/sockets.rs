//! Sockets tab: per-component TCP states over time, and the connection list.

use super::{
    fit, fmt_ms, keep_visible, para, render_scrolled, rfit, scroll_offset, short_id,
    source_problem_line, sparkline, Theme,
};
use crate::app::{in_flight, App, HistoryPoint, Lane, RequestRow};
use crate::model::{Request, RequestState, SnapComponent, Snapshot};
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Color, Style};
use ratatui::text::{Line, Span};
use ratatui::Frame;
use std::collections::VecDeque;

pub(super) fn render(app: &App, s: &Snapshot, theme: Theme, frame: &mut Frame, area: Rect) {
    let w = area.width as usize;
    let (mut top, comps) = component_lines(app, s, theme, w);
    let first_comp = top.len();
    top.extend(comps);
    // The summary takes at most half; cut, it scrolls (its scrollbar says so) and the
    // cursor reaches its components by going up from the first connection.
    let top_h = (top.len() as u16).min(area.height / 2);
    let [upper, lower] =
        Layout::vertical([Constraint::Length(top_h), Constraint::Min(0)]).areas(area);
    let offset = app.selected_socket_component().map_or(0, |k| {
        keep_visible(first_comp + k, first_comp + k, upper.height as usize)
    });
    render_scrolled(frame, upper, top, offset);
    connection_pane(app, s, theme, frame, lower);
}

/// The upper part: the source's problem if any and the title, then one line per component
/// that has sockets or exchanges (`derived.socket_components`), the one under the cursor
/// highlighted.
fn component_lines(
    app: &App,
    s: &Snapshot,
    theme: Theme,
    w: usize,
) -> (Vec<Line<'static>>, Vec<Line<'static>>) {
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
    let sel = app.selected_socket_component();
    let comps = app
        .derived()
        .socket_components
        .iter()
        .enumerate()
        .map(|(k, &ci)| {
            let line = component_line(
                app.history(),
                s,
                &s.components[ci],
                theme,
                comp_w,
                state_spark,
            );
            if sel == Some(k) {
                line.patch_style(theme.selected())
            } else {
                line
            }
        })
        .collect();
    (top, comps)
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

/// The lower part: the connection list (title, column heads, rows that follow the cursor,
/// with a scrollbar when cut) and, when open, the selected connection's detail below the
/// rows.
fn connection_pane(app: &App, s: &Snapshot, theme: Theme, frame: &mut Frame, area: Rect) {
    let d = app.derived();
    let w = area.width as usize;
    let mut cols = ConnCols::for_width(w);
    let sel = app.selected_connection();
    let detail = app
        .detail_open()
        .then(|| sel.and_then(|k| d.connections.get(k)))
        .flatten()
        .and_then(|&i| s.requests.get(i))
        .map(|r| connection_detail(r, theme, w));
    let room = (area.height as usize)
        .saturating_sub(2)
        .saturating_sub(usize::from(detail.is_some()));
    // Cut, the rows give the scrollbar its column out of the component's when they would
    // reach it, so the age keeps its unit.
    let row_w = 60 + cols.server + cols.component;
    if d.connections.len() > room && room >= 2 && row_w >= w {
        cols.component = cols.component.saturating_sub(row_w + 1 - w);
    }
    let heading = connection_heading(&cols, theme, w);
    let rows: Vec<Line<'static>> = d
        .connections
        .iter()
        .enumerate()
        .map(|(pos, &ri)| {
            let line = connection_line(&s.requests[ri], &d.rows[ri], &cols, theme);
            if Some(pos) == sel {
                line.patch_style(theme.selected())
            } else {
                line
            }
        })
        .collect();
    let rows_h = rows.len().min(room) as u16;
    let head_h = (heading.len() as u16).min(area.height);
    frame.render_widget(
        para(heading),
        Rect {
            height: head_h,
            ..area
        },
    );
    let rows_area = Rect {
        y: area.y + head_h,
        height: rows_h,
        ..area
    };
    render_scrolled(
        frame,
        rows_area,
        rows,
        scroll_offset(sel.unwrap_or(0), rows_h as usize),
    );
    if let Some(line) = detail {
        if area.height > head_h + rows_h {
            let at = Rect {
                y: rows_area.y + rows_h,
                height: 1,
                ..area
            };
            frame.render_widget(para(vec![line]), at);
        }
    }
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
            short_id(&r.component, cols.component)
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
