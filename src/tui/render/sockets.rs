//! Sockets view: per-component TCP states over time, and the connection list.

use super::{fit, fmt_ms, para, rfit, scroll_offset, source_summary, sparkline, Theme};
use crate::model::{RequestState, Snapshot, Status};
use crate::tui::app::{in_flight, App, Lane};
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Color, Style};
use ratatui::text::{Line, Span};
use ratatui::Frame;

pub(super) fn render(app: &App, s: &Snapshot, theme: Theme, frame: &mut Frame, area: Rect) {
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
