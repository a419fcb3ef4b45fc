//! Metrics tab: each component's metrics with rates and history.
//!
//! A series is named by what tells it apart: `worker_in_flight{worker="http://10.0.0.7:31001"}`
//! keeps its label values whole and gives up the middle instead (two series cut at one column
//! would look identical). Counters are drawn as their rate (a counter only grows,
//! so its own curve says nothing); gauges with a known capacity are scaled to it.

use super::{
    fit, fmt_num, keep_visible, render_scrolled, rfit, sev_tag, source_problem_line, sparkline,
    Theme,
};
use crate::app::{App, HistoryPoint};
use crate::model::{Role, SnapComponent, Snapshot};
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::Frame;
use std::collections::VecDeque;

/// Column widths: the name gets what the value, rate and sparkline leave.
struct Cols {
    name: usize,
    spark: usize,
}

impl Cols {
    fn for_width(w: usize) -> Cols {
        let spark = (w / 5).clamp(8, 40);
        // "  " name " " value(12) " " rate(10) " " spark
        let name = w
            .saturating_sub(2 + 1 + 12 + 1 + 10 + 1 + spark)
            .clamp(12, 56);
        Cols { name, spark }
    }
}

pub(super) fn render(app: &App, s: &Snapshot, theme: Theme, frame: &mut Frame, area: Rect) {
    let w = area.width as usize;
    let cols = Cols::for_width(w);
    let mut head = notice_lines(s, theme, w);
    head.push(Line::styled(
        fit(
            &format!(
                "  {} {} {} HISTORY",
                fit("SERIES", cols.name),
                rfit("VALUE", 12),
                rfit("RATE/s", 10)
            ),
            w,
        ),
        theme.head(),
    ));
    let head_h = (head.len() as u16).min(area.height / 2);
    let [top, body] =
        Layout::vertical([Constraint::Length(head_h), Constraint::Min(0)]).areas(area);
    frame.render_widget(super::para(head), top);
    let (lines, sel_line) = metric_rows(app, s, theme, &cols, w);
    let offset = keep_visible(sel_line.saturating_sub(1), sel_line, body.height as usize);
    render_scrolled(frame, body, lines, offset);
}

/// Every metric line under its component's heading, and the line of the selected one.
fn metric_rows(
    app: &App,
    s: &Snapshot,
    theme: Theme,
    cols: &Cols,
    w: usize,
) -> (Vec<Line<'static>>, usize) {
    let d = app.derived();
    let mut lines = Vec::new();
    let mut sel_line = 0;
    let mut last_comp = None;
    for (pos, (ci, name)) in d.metric_lines.iter().enumerate() {
        let Some(c) = s.components.get(*ci) else {
            continue;
        };
        if last_comp != Some(*ci) {
            last_comp = Some(*ci);
            lines.push(Line::styled(
                fit(&format!("{} ({})", c.id, c.role), w),
                theme.fg(Color::Cyan).add_modifier(Modifier::BOLD),
            ));
        }
        if pos == app.selected() {
            sel_line = lines.len();
        }
        lines.push(metric_line(
            app.history(),
            c,
            name,
            theme,
            cols,
            pos == app.selected(),
        ));
    }
    if d.metric_lines.is_empty() {
        lines.push(Line::styled("no metrics in this window", theme.dim()));
    }
    (lines, sel_line)
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

/// `name{a="x",b="y"}` shown as `name{a=x,b=y}` in `w` columns. When it does not fit, the
/// middle goes: the name's start and the labels' end (the part that differs between series:
/// the port, the worker) stay.
fn series_label(key: &str, w: usize) -> String {
    let shown = key.replace('"', "");
    let n = shown.chars().count();
    if n <= w || w < 8 {
        return fit(&shown, w);
    }
    let chars: Vec<char> = shown.chars().collect();
    let head = (w / 3).min(shown.find('{').unwrap_or(w / 3));
    let tail = w - head - 1;
    let mut out: String = chars[..head].iter().collect();
    out.push('…');
    out.extend(&chars[n - tail..]);
    out
}

/// The top of a gauge's sparkline when the quantity has a known capacity (a fraction).
fn capacity(name: &str) -> Option<f64> {
    let base = name.split('{').next().unwrap_or(name);
    matches!(base, "token_usage" | "kv_cache_usage" | "cache_usage").then_some(1.0)
}

/// One series: value, rate (when the component exports `<name>_rate`) and history: the
/// rate's for a counter, the value's for a gauge.
fn metric_line(
    hist: &VecDeque<HistoryPoint>,
    c: &SnapComponent,
    name: &str,
    theme: Theme,
    cols: &Cols,
    selected: bool,
) -> Line<'static> {
    let value = c.metrics.get(name).copied().unwrap_or(f64::NAN);
    let rate_key = format!("{name}_rate");
    let rate = c.metrics.get(&rate_key).copied();
    let drawn = if rate.is_some() { &rate_key } else { name };
    let data: Vec<Option<f64>> = hist
        .iter()
        .map(|p| p.metrics.get(&c.id).and_then(|m| m.get(drawn)).copied())
        .collect();
    let rate_style = match rate {
        Some(0.0) => theme.fg(Color::Yellow),
        _ => Style::default(),
    };
    let max = if rate.is_some() { None } else { capacity(name) };
    let line = Line::from(vec![
        Span::raw(format!(
            "  {} {} ",
            series_label(name, cols.name),
            rfit(&fmt_num(value), 12)
        )),
        Span::styled(rfit(&rate.map_or(String::new(), fmt_num), 10), rate_style),
        Span::raw(" "),
        Span::styled(sparkline(&data, cols.spark, max), theme.fg(Color::Green)),
    ]);
    if selected {
        line.patch_style(theme.selected())
    } else {
        line
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn series_keep_what_tells_them_apart() {
        let a = r#"worker_in_flight{worker="http://127.0.0.1:31001"}"#;
        let b = r#"worker_in_flight{worker="http://127.0.0.1:31012"}"#;
        let (sa, sb) = (series_label(a, 32), series_label(b, 32));
        assert_ne!(sa, sb, "cut at the same column they looked identical");
        assert!(sa.ends_with("127.0.0.1:31001}"), "{sa}");
        assert!(sa.starts_with("worker_in"), "{sa}");
        assert_eq!(sa.chars().count(), 32);
        assert_eq!(
            series_label(r#"x{a="1"}"#, 20).trim_end(),
            "x{a=1}",
            "short ones whole"
        );
    }
}
