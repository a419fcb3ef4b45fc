//! Metrics view: each component's metrics with rates and history.

use super::{
    fit, fmt_num, para, rfit, scroll_offset, sev_tag, source_problem_line, sparkline, Theme,
};
use crate::model::{Role, SnapComponent, Snapshot};
use crate::tui::app::{App, HistoryPoint};
use ratatui::layout::Rect;
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::Frame;
use std::collections::VecDeque;

pub(super) fn render(app: &App, s: &Snapshot, theme: Theme, frame: &mut Frame, area: Rect) {
    let w = area.width as usize;
    let d = app.derived();
    let hist = app.history();
    let mut lines = notice_lines(s, theme, w);
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
        lines.push(metric_line(hist, c, name, theme, pos == sel));
    }
    if d.metric_lines.is_empty() {
        lines.push(Line::styled("no metrics in this window", theme.dim()));
    }
    frame.render_widget(para(lines), area);
}

/// What comes before the metrics: the source's problem, unresponsive endpoints, and the
/// components that should export metrics but gave none.
fn notice_lines(s: &Snapshot, theme: Theme, w: usize) -> Vec<Line<'static>> {
    let mut lines: Vec<Line<'static>> = Vec::new();
    lines.extend(source_problem_line(s, "metrics", theme, w));
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
    lines
}

/// One metric: value, rate (when the component exports `<name>_rate`) and history.
fn metric_line(
    hist: &VecDeque<HistoryPoint>,
    c: &SnapComponent,
    name: &str,
    theme: Theme,
    selected: bool,
) -> Line<'static> {
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
    let line = Line::from(vec![
        Span::raw(format!(
            "  {} {} ",
            fit(name, 32),
            rfit(&fmt_num(value), 14)
        )),
        Span::styled(rfit(&rate.map_or(String::new(), fmt_num), 12), rate_style),
        Span::raw(" "),
        Span::styled(sparkline(&data, 20, None), theme.fg(Color::Green)),
    ]);
    if selected {
        line.patch_style(theme.selected())
    } else {
        line
    }
}
