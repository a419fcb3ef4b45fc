//! Diff view: configuration changes against the baseline.

use super::{fit, para, scroll_offset, Theme};
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
    lines.push(Line::styled(fit(&column_heading(wide), w), theme.head()));
    let per_item = if wide { 1 } else { 2 };
    let rows_h = (area.height as usize).saturating_sub(2) / per_item;
    let sel = app.selected();
    let offset = scroll_offset(sel, rows_h);
    for (pos, &ci) in d.changes.iter().enumerate().skip(offset).take(rows_h) {
        lines.extend(change_lines(&s.config_changed[ci], wide, theme, pos == sel));
    }
    frame.render_widget(para(lines), area);
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

/// One change: a single line on wide screens, key then `before -> after` on narrow ones.
fn change_lines(c: &Change, wide: bool, theme: Theme, selected: bool) -> Vec<Line<'static>> {
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
    if selected {
        first = first.patch_style(theme.selected());
    }
    let mut lines = vec![first];
    if !wide {
        let mut spans = vec![Span::raw("    ")];
        spans.extend(change);
        lines.push(Line::from(spans));
    }
    lines
}
