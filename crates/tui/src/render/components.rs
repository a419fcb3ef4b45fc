//! Components tab: every component with its identity, and below the selected one's
//! detail (versions, changes against the baseline, relevant environment, command line one
//! option a line). `enter` gives the detail the room and j/k scroll it.

use super::{cut, fit, para, render_scrolled, scroll_offset, time_of, Theme};
use crate::app::{component_facts, App, Fact};
use crate::model::Snapshot;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::Color;
use ratatui::text::{Line, Span};
use ratatui::Frame;

pub(super) fn render(app: &App, s: &Snapshot, theme: Theme, frame: &mut Frame, area: Rect) {
    let w = area.width as usize;
    let list_h = if app.detail_open() {
        (area.height / 4).max(3)
    } else {
        (s.components.len() as u16 + 2).min(area.height / 2)
    }
    .min(area.height);
    let [top, bottom] =
        Layout::vertical([Constraint::Length(list_h), Constraint::Min(0)]).areas(area);
    let mut lines = vec![host_line(app, theme, w), list_heading(theme, w)];
    let rows_h = (top.height as usize).saturating_sub(2);
    let sel = app.selected();
    let offset = scroll_offset(sel, rows_h);
    for (pos, c) in s.components.iter().enumerate().skip(offset).take(rows_h) {
        let pid = c.main_pid.map_or("-".into(), |p| p.to_string());
        let text = format!(
            "{} {} {} {}",
            fit(&c.id, 36),
            fit(c.role.as_str(), 11),
            fit(&pid, 8),
            c.started_at
                .as_deref()
                .map_or("-", |t| started(t, &s.taken_at))
        );
        let line = Line::raw(fit(&text, w));
        lines.push(if pos == sel {
            line.patch_style(theme.selected())
        } else {
            line
        });
    }
    frame.render_widget(para(lines), top);
    let Some(c) = s.components.get(sel) else {
        return;
    };
    let detail: Vec<Line<'static>> = component_facts(s, c)
        .into_iter()
        .map(|f| fact_line(f, theme, w))
        .collect();
    let offset = if app.detail_open() {
        app.set_detail_viewport(bottom.height as usize);
        app.detail_scroll()
    } else {
        0
    };
    render_scrolled(frame, bottom, detail, offset);
}

/// When a component started: the time of day when it is the snapshot's day (a restart
/// minutes ago is what the column is read for), else the date and minute; the detail below
/// has it whole.
fn started<'a>(at: &'a str, taken_at: &str) -> &'a str {
    if at
        .get(..10)
        .is_some_and(|day| taken_at.get(..10) == Some(day))
    {
        time_of(at)
    } else {
        at.get(..16).unwrap_or(at)
    }
}

/// `wedgewatch 0.1.0 · kernel 6.8 · nvidia_driver 550.54`: what a bug report needs first.
fn host_line(app: &App, theme: Theme, w: usize) -> Line<'static> {
    let v = app.host_versions();
    let text = if v.is_empty() {
        "versions: not in this snapshot".to_string()
    } else {
        let parts: Vec<String> = v.iter().map(|(k, v)| format!("{k} {v}")).collect();
        format!("versions: {}", parts.join(" · "))
    };
    Line::styled(fit(&text, w), theme.head())
}

fn list_heading(theme: Theme, w: usize) -> Line<'static> {
    Line::styled(
        fit(
            &format!(
                "{} {} {} STARTED   (enter: detail, j/k scroll it)",
                fit("COMPONENT", 36),
                fit("ROLE", 11),
                fit("PID", 8)
            ),
            w,
        ),
        theme.head(),
    )
}

/// One detail line, cut to the width.
fn fact_line(f: Fact, theme: Theme, w: usize) -> Line<'static> {
    match f {
        Fact::Heading(h) => Line::styled(fit(&h, w), theme.head()),
        Fact::Pair(k, v) => Line::raw(fit(&format!("  {k:<12} {v}"), w)),
        Fact::Text(t) => Line::raw(fit(&format!("  {t}"), w)),
        Fact::Change {
            field,
            key,
            before,
            after,
        } => {
            let head = format!("  {field:<8} {key}: ");
            let rest = w.saturating_sub(head.chars().count());
            let before = before.unwrap_or("(absent)".into());
            let after = after.unwrap_or("(absent)".into());
            let half = rest.saturating_sub(4) / 2;
            Line::from(vec![
                Span::raw(cut(&head, w)),
                Span::styled(cut(&before, half), theme.fg(Color::Red)),
                Span::raw(" -> "),
                Span::styled(cut(&after, half), theme.fg(Color::Green)),
            ])
        }
    }
}
