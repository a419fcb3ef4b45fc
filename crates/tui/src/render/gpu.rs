//! GPU tab: per-GPU utilisation, power and memory sparklines, and per-process memory.

use super::{
    fit, fmt_bytes, keep_visible, render_scrolled, rfit, source_problem_line, sparkline, Theme,
};
use crate::app::{App, HistoryPoint};
use crate::model::{SnapGpu, SnapGpuProcess, Snapshot};
use ratatui::layout::Rect;
use ratatui::style::Color;
use ratatui::text::{Line, Span};
use ratatui::Frame;
use std::collections::VecDeque;

pub(super) fn render(app: &App, s: &Snapshot, theme: Theme, frame: &mut Frame, area: Rect) {
    let w = area.width as usize;
    let spark_w = w.saturating_sub(40).clamp(4, 60);
    let hist = app.history();
    let mut lines = notice_lines(s, theme, w);
    // Selectable items: each GPU's heading, then each of its processes.
    let sel = app.selected();
    let mut item = 0usize;
    let mut selected_line = 0usize;
    let mut selected_end = 0usize;
    for g in &s.gpus {
        if item == sel {
            // A GPU's heading brings its three readings into sight with it.
            selected_line = lines.len();
            selected_end = selected_line + 3;
        }
        lines.push(gpu_heading(g, theme, item == sel));
        item += 1;
        lines.extend(reading_lines(hist, g, theme, spark_w));
        for p in &g.processes {
            if item == sel {
                selected_line = lines.len();
                selected_end = selected_line;
            }
            lines.push(process_line(hist, g.index, p, theme, spark_w, item == sel));
            item += 1;
        }
    }
    let offset = keep_visible(selected_line, selected_end, area.height as usize);
    render_scrolled(frame, area, lines, offset);
}

/// What comes before the GPUs: the source's problem, "no readings", the engines' verdicts.
fn notice_lines(s: &Snapshot, theme: Theme, w: usize) -> Vec<Line<'static>> {
    let mut lines: Vec<Line<'static>> = Vec::new();
    lines.extend(source_problem_line(s, "gpu", theme, w));
    if s.gpus.is_empty() {
        lines.push(Line::styled(
            "no GPU readings: activity cannot be judged from the GPU (shown as unknown, not as idle)",
            theme.dim(),
        ));
    }
    // Engines' verdicts (they combine GPU, per-process samples and engine counters), one a
    // line so none is cut off the edge; the components with no GPU verdict on one line after.
    let (known, unknown): (Vec<_>, Vec<_>) = s
        .components
        .iter()
        .filter_map(|c| Some((c.id.as_str(), c.gpu_activity.as_deref()?)))
        .partition(|&(_, a)| a != "unknown");
    if !known.is_empty() || !unknown.is_empty() {
        lines.push(Line::styled("activity verdicts", theme.bold()));
    }
    let id_w = known
        .iter()
        .map(|(id, _)| id.chars().count())
        .max()
        .unwrap_or(0);
    for (id, a) in known {
        lines.push(Line::from(vec![
            Span::raw(format!("  {} ", fit(id, id_w.min(w.saturating_sub(14))))),
            Span::styled(a.to_string(), theme.activity(a)),
        ]));
    }
    if !unknown.is_empty() {
        let ids: Vec<&str> = unknown.iter().map(|(id, _)| *id).collect();
        lines.push(Line::styled(
            fit(&format!("  unknown: {}", ids.join(", ")), w),
            theme.dim(),
        ));
    }
    lines
}

fn gpu_heading(g: &SnapGpu, theme: Theme, selected: bool) -> Line<'static> {
    let mut head = vec![Span::styled(
        format!("GPU{} {}", g.index, g.name),
        theme.bold(),
    )];
    if let Some(a) = &g.activity {
        head.push(Span::raw("  activity "));
        head.push(Span::styled(a.clone(), theme.activity(a)));
    }
    let head = Line::from(head);
    if selected {
        head.patch_style(theme.selected())
    } else {
        head
    }
}

/// Utilisation, power and memory: the value now and its sparkline.
fn reading_lines(
    hist: &VecDeque<HistoryPoint>,
    g: &SnapGpu,
    theme: Theme,
    spark_w: usize,
) -> Vec<Line<'static>> {
    let series = |k: usize| -> Vec<Option<f64>> {
        hist.iter()
            .map(|p| {
                p.gpus.get(&g.index).and_then(|v| match k {
                    0 => v.util_pct,
                    1 => v.power_w,
                    _ => v.mem_used_bytes,
                })
            })
            .collect()
    };
    let util = g.util_pct.map_or("-".into(), |u| format!("{u:.0} %"));
    let power = g.power_w.map_or("-".into(), |p| format!("{p:.0} W"));
    let mem = g.mem_used_bytes.map_or("-".into(), |b| fmt_bytes(b as f64));
    // Scaled to capacity, not to their own maximum: a steady 70 W on a 700 W card is low,
    // not a full bar. Without a known limit, the largest reading is the top (and said so).
    let power_top = g.power_limit_w;
    let mem_top = g.mem_total_bytes.map(|b| b as f64);
    let of = |top: Option<f64>, unit: fn(f64) -> String| {
        top.map_or(" of max seen".to_string(), |t| format!(" of {}", unit(t)))
    };
    [
        (
            "util",
            util,
            series(0),
            Some(100.0),
            " of 100 %".to_string(),
        ),
        (
            "power",
            power,
            series(1),
            power_top,
            of(power_top, |w| format!("{w:.0} W")),
        ),
        ("memory", mem, series(2), mem_top, of(mem_top, fmt_bytes)),
    ]
    .into_iter()
    .map(|(label, value, data, max, scale)| {
        Line::from(vec![
            Span::raw(format!("  {} {} ", fit(label, 7), rfit(&value, 10))),
            Span::styled(sparkline(&data, spark_w, max), theme.fg(Color::Green)),
            Span::styled(scale, theme.dim()),
        ])
    })
    .collect()
}

fn process_line(
    hist: &VecDeque<HistoryPoint>,
    gpu_index: u32,
    p: &SnapGpuProcess,
    theme: Theme,
    spark_w: usize,
    selected: bool,
) -> Line<'static> {
    let data: Vec<Option<f64>> = hist
        .iter()
        .map(|h| h.gpu_processes.get(&(gpu_index, p.pid)).copied().flatten())
        .collect();
    let text = format!(
        "  pid {} {} mem {} sm {} ",
        rfit(&p.pid.to_string(), 7),
        fit(p.component.as_deref().unwrap_or("-"), 26),
        rfit(
            &p.used_mem_bytes.map_or("-".into(), |b| fmt_bytes(b as f64)),
            10
        ),
        rfit(&p.sm_util_pct.map_or("-".into(), |u| format!("{u}%")), 4),
    );
    let line = Line::from(vec![
        Span::raw(text),
        Span::styled(
            sparkline(&data, spark_w.min(20), None),
            theme.fg(Color::Green),
        ),
    ]);
    if selected {
        line.patch_style(theme.selected())
    } else {
        line
    }
}
