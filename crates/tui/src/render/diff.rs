//! Diff tab: configuration changes against the baseline, the followed (else the blamed)
//! hop's first, a child process's repeat of its engine's change folded into the engine's
//! row. Values too long for the line get a line each (`- before`, `+ after`) rather than
//! `after` being cut off at the edge: a restart's new pid and time are its point.

use super::{fit, keep_visible, para, render_scrolled, Theme};
use crate::app::App;
use crate::model::{Change, Snapshot};
use ratatui::layout::Rect;
use ratatui::style::Color;
use ratatui::text::{Line, Span};
use ratatui::Frame;

pub(super) fn render(app: &App, s: &Snapshot, theme: Theme, frame: &mut Frame, area: Rect) {
    let w = area.width as usize;
    let d = app.derived();
    let baseline = s.tool.get("baseline").cloned();
    let mut head = vec![Line::styled(
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
        head.push(Line::styled(
            "no changes against the baseline (or no baseline was taken)",
            theme.fg(Color::Green),
        ));
        frame.render_widget(para(head), area);
        return;
    }
    let wide = w >= 120;
    head.push(Line::styled(fit(&column_heading(wide), w), theme.head()));
    let head_h = (head.len() as u16).min(area.height);
    frame.render_widget(
        para(head),
        Rect {
            height: head_h,
            ..area
        },
    );
    let body = Rect {
        y: area.y + head_h,
        height: area.height - head_h,
        ..area
    };
    let (mut lines, mut span) = (Vec::new(), (0, 0));
    for (pos, &ci) in d.changes.iter().enumerate() {
        let Some(c) = s.config_changed.get(ci) else {
            continue;
        };
        let children = d.change_children.get(&ci).map_or(&[][..], Vec::as_slice);
        let block = change_lines(c, children, wide, theme, w, pos == app.selected());
        if pos == app.selected() {
            span = (lines.len(), lines.len() + block.len() - 1);
        }
        lines.extend(block);
    }
    let offset = keep_visible(span.0, span.1, body.height as usize);
    render_scrolled(frame, body, lines, offset);
}

fn column_heading(wide: bool) -> String {
    if wide {
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
    }
}

/// `(and its detokenizer, scheduler)`: the children whose same change was folded in.
fn children_note(children: &[String]) -> String {
    if children.is_empty() {
        return String::new();
    }
    let roles: Vec<&str> = children
        .iter()
        .map(|c| c.split('@').next().unwrap_or(c))
        .collect();
    format!(" (and its {})", roles.join(", "))
}

/// One change: what changed where, then its values: on the same line when they fit (wide
/// screens), else `before -> after` on the next, else `- before` and `+ after` on a line
/// each.
fn change_lines(
    c: &Change,
    children: &[String],
    wide: bool,
    theme: Theme,
    w: usize,
    selected: bool,
) -> Vec<Line<'static>> {
    let before = c.before.as_deref().unwrap_or("(absent)");
    let after = c.after.as_deref().unwrap_or("(absent)");
    let key = c.key.as_deref().unwrap_or("-");
    let ident = if wide {
        format!(
            "{} {} {} ",
            fit(&c.component, 26),
            fit(c.role.as_str(), 8),
            fit(&c.field, 8)
        )
    } else {
        format!("{} {} ", fit(&c.component, 24), fit(&c.field, 8))
    };
    let key_text = if wide { fit(key, 36) } else { key.to_string() };
    let note = Span::styled(children_note(children), theme.dim());
    let mut first = vec![Span::raw(ident), Span::styled(key_text, theme.bold())];
    let used: usize = first
        .iter()
        .map(|s| s.content.chars().count())
        .sum::<usize>()
        + note.content.chars().count();
    let values_w = before.chars().count() + 4 + after.chars().count();
    let change = |b: &str, a: &str| {
        vec![
            Span::styled(b.to_string(), theme.fg(Color::Red)),
            Span::raw(" -> "),
            Span::styled(a.to_string(), theme.fg(Color::Green)),
        ]
    };
    let mut lines = Vec::with_capacity(3);
    if wide && used + 1 + values_w <= w {
        first.push(Span::raw(" "));
        first.extend(change(before, after));
        first.push(note);
        lines.push(Line::from(first));
        return select(lines, selected, theme);
    }
    first.push(note);
    if 4 + values_w <= w {
        lines.push(Line::from(first));
        let mut spans = vec![Span::raw("    ")];
        spans.extend(change(before, after));
        lines.push(Line::from(spans));
    } else {
        lines.push(Line::from(first));
        lines.push(Line::styled(
            fit(&format!("    - {before}"), w),
            theme.fg(Color::Red),
        ));
        lines.push(Line::styled(
            fit(&format!("    + {after}"), w),
            theme.fg(Color::Green),
        ));
    }
    select(lines, selected, theme)
}

/// The selected change shows on its first line.
fn select(mut lines: Vec<Line<'static>>, selected: bool, theme: Theme) -> Vec<Line<'static>> {
    if let (true, Some(first)) = (selected, lines.first_mut()) {
        *first = std::mem::take(first).patch_style(theme.selected());
    }
    lines
}
