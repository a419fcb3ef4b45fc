//! Requests tab: one row per request (or per hop) with its hop lanes, and the hops of the
//! selected request.

use super::lanes::{self, short_state};
use super::{fit, fmt_ms, para, render_scrolled, rfit, scroll_offset, sev_tag, short_id, Theme};
use crate::app::{App, Derived, RequestRow, LANES};
use crate::model::{Request, Snapshot, Status};
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::Frame;
use std::collections::BTreeSet;

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
    all_hops: bool,
) -> Line<'static> {
    let r = &s.requests[row.index];
    let mut spans = Vec::with_capacity(14);
    let mark = if row.stuck { "! " } else { "  " };
    spans.push(Span::styled(
        mark.to_string(),
        theme.fg(Color::Red).add_modifier(Modifier::BOLD),
    ));
    spans.push(Span::raw(fit(row_label(r, all_hops), cols.id)));
    if cols.entry > 0 {
        spans.push(Span::raw(short_id(
            &r.component,
            cols.entry.saturating_sub(1),
        )));
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
        spans.push(Span::raw(rfit(&lanes::in_out(r), cols.bytes)));
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

pub(super) fn render(app: &App, s: &Snapshot, theme: Theme, frame: &mut Frame, area: Rect) {
    let d = app.derived();
    let (list_area, detail_area) = if app.detail_open() {
        let [a, b] =
            Layout::vertical([Constraint::Percentage(55), Constraint::Percentage(45)]).areas(area);
        (a, Some(b))
    } else {
        (area, None)
    };
    frame.render_widget(para(list_lines(app, s, theme, list_area)), list_area);

    if let Some(area) = detail_area {
        let Some(row) = d
            .request_order
            .get(app.selected())
            .and_then(|&i| d.rows.get(i))
        else {
            return;
        };
        // The hop detail scrolls with j/k while open: a long chain's findings come last.
        app.set_detail_viewport(area.height as usize);
        let lines = hop_lines(s, d, row, theme, area.width as usize);
        render_scrolled(frame, area, lines, app.detail_scroll());
    }
}

/// The request list: title, column heads, then the visible rows (or why there are none).
fn list_lines(app: &App, s: &Snapshot, theme: Theme, area: Rect) -> Vec<Line<'static>> {
    let d = app.derived();
    let w = area.width as usize;
    let rows_h = (area.height as usize).saturating_sub(2);
    let sel = app.selected();
    let offset = scroll_offset(sel, rows_h);
    // The id column fits the visible ids (formats differ between correlator versions).
    let id_w = d
        .request_order
        .iter()
        .skip(offset)
        .take(rows_h)
        .map(|&i| {
            row_label(&s.requests[d.rows[i].index], app.all_hops())
                .chars()
                .count()
        })
        .max()
        .unwrap_or(8);
    let cols = ReqCols::for_width(w, id_w);
    let mut lines = vec![Line::styled(fit(&list_title(app, d), w), theme.bold())];
    lines.push(Line::styled(
        fit(&column_heading(&cols), w),
        theme.bold().patch(theme.dim()),
    ));
    if d.request_order.is_empty() {
        lines.push(Line::styled(empty_message(app, s), theme.dim()));
    }
    for (pos, &ri) in d.request_order.iter().enumerate().skip(offset).take(rows_h) {
        lines.push(request_line(
            s,
            &d.rows[ri],
            &cols,
            theme,
            pos == sel,
            app.all_hops(),
        ));
    }
    lines
}

/// A row's name: its logical request (`r17`), or in the all-hops list its leg
/// (`r17@decode`); the exchange id when it is no leg (an idle connection).
fn row_label(r: &Request, all_hops: bool) -> &str {
    let name = if all_hops { &r.leg } else { &r.request };
    name.as_deref().unwrap_or(&r.id)
}

/// `"12 requests (3 stuck, 2 waiting) · sort: stuck · one row per request (a: all hops)"`.
/// Stuck and waiting count logical requests (the correlator's verdicts), also in the
/// all-hops list.
fn list_title(app: &App, d: &Derived) -> String {
    let count = |pick: fn(&RequestRow) -> bool| {
        d.request_order
            .iter()
            .map(|&i| &d.rows[i])
            .filter(|r| pick(r))
            .map(|r| r.chain)
            .collect::<BTreeSet<usize>>()
            .len()
    };
    let waiting = match count(|r| r.waiting) {
        0 => String::new(),
        n => format!(", {n} waiting"),
    };
    format!(
        "{} {} ({} stuck{waiting}) · sort: {} · {}",
        d.request_order.len(),
        if app.all_hops() {
            "exchanges"
        } else {
            "requests"
        },
        count(|r| r.stuck),
        app.sort().as_str(),
        if app.all_hops() {
            "all hops (a: one row per request)"
        } else {
            "one row per request (a: all hops)"
        }
    )
}

fn column_heading(cols: &ReqCols) -> String {
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
    head
}

/// Why the list is empty: the filter, a sockets source that is not ok, or a quiet window.
fn empty_message(app: &App, s: &Snapshot) -> String {
    if app.filter().is_empty() {
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
    }
}

/// The detail pane: the selected request's lanes (one row per hop), then the findings that
/// name any of its hops.
fn hop_lines(
    s: &Snapshot,
    d: &Derived,
    row: &RequestRow,
    theme: Theme,
    w: usize,
) -> Vec<Line<'static>> {
    let name = row_label(&s.requests[row.index], false);
    let title = match row.stuck_at {
        Some(l) => format!(
            "hops of {name}, stuck at {}: t d m its thread, diff, metrics · esc closes",
            LANES[l]
        ),
        None => format!("hops of {name}: t d m thread, diff, metrics · esc closes"),
    };
    let mut lines = vec![
        Line::styled(
            fit(&title, w),
            theme.bold().add_modifier(Modifier::UNDERLINED),
        ),
        lanes::heading(theme, w),
    ];
    lines.extend(lanes::hop_rows(s, d, row.chain, theme, w));
    for fi in d.hop_findings(s, row.chain) {
        let f = &s.findings[fi];
        lines.push(Line::styled(
            fit(
                &format!("{} {}: {}", sev_tag(f.severity), f.kind, f.summary),
                w,
            ),
            theme.severity(f.severity),
        ));
    }
    lines
}
