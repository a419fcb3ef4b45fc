//! GPU view: per-GPU utilisation, power and memory sparklines, and per-process memory.

use super::{fit, fmt_bytes, para, rfit, scroll_offset, source_summary, sparkline, Theme};
use crate::model::{SnapComponent, Snapshot, Status};
use crate::tui::app::App;
use ratatui::layout::Rect;
use ratatui::style::Color;
use ratatui::text::{Line, Span};
use ratatui::Frame;

pub(super) fn render(app: &App, s: &Snapshot, theme: Theme, frame: &mut Frame, area: Rect) {
    let w = area.width as usize;
    let spark_w = w.saturating_sub(40).clamp(4, 60);
    let hist = app.history();
    let mut lines: Vec<Line<'static>> = Vec::new();
    if let Some(st) = s.sources.get("gpu").filter(|st| st.status != Status::Ok) {
        lines.push(Line::styled(
            fit(
                &format!(
                    "gpu source {}: {}",
                    source_summary(st),
                    st.reason.as_deref().unwrap_or("no reason given")
                ),
                w,
            ),
            theme.status(st.status),
        ));
    }
    if s.gpus.is_empty() {
        lines.push(Line::styled(
            "no GPU readings: activity cannot be judged from the GPU (shown as unknown, not as idle)",
            theme.dim(),
        ));
    }
    // Engines' verdicts (they combine GPU, per-process samples and engine counters).
    let verdicts: Vec<&SnapComponent> = s
        .components
        .iter()
        .filter(|c| c.gpu_activity.is_some())
        .collect();
    if !verdicts.is_empty() {
        let mut spans = vec![Span::styled("activity verdicts:", theme.bold())];
        for c in verdicts {
            let a = c.gpu_activity.clone().unwrap_or_default();
            spans.push(Span::raw(format!(" {} ", c.id)));
            spans.push(Span::styled(a.clone(), theme.activity(&a)));
        }
        lines.push(Line::from(spans));
    }
    let sel = app.selected();
    let mut item = 0usize;
    let mut selected_line = 0usize;
    for g in &s.gpus {
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
        if item == sel {
            selected_line = lines.len();
        }
        let mut head = vec![Span::styled(
            format!("GPU{} {}", g.index, g.name),
            theme.bold(),
        )];
        if let Some(a) = &g.activity {
            head.push(Span::raw("  activity "));
            head.push(Span::styled(a.clone(), theme.activity(a)));
        }
        let mut head = Line::from(head);
        if item == sel {
            head = head.patch_style(theme.selected());
        }
        lines.push(head);
        item += 1;
        let util = g.util_pct.map_or("-".into(), |u| format!("{u:.0} %"));
        let power = g.power_w.map_or("-".into(), |p| format!("{p:.0} W"));
        let mem = g.mem_used_bytes.map_or("-".into(), |b| fmt_bytes(b as f64));
        for (label, value, data, max) in [
            ("util", util, series(0), Some(100.0)),
            ("power", power, series(1), None),
            ("memory", mem, series(2), None),
        ] {
            lines.push(Line::from(vec![
                Span::raw(format!("  {} {} ", fit(label, 7), rfit(&value, 10))),
                Span::styled(sparkline(&data, spark_w, max), theme.fg(Color::Green)),
            ]));
        }
        for p in &g.processes {
            if item == sel {
                selected_line = lines.len();
            }
            let data: Vec<Option<f64>> = hist
                .iter()
                .map(|h| h.gpu_processes.get(&(g.index, p.pid)).copied().flatten())
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
            let mut line = Line::from(vec![
                Span::raw(text),
                Span::styled(
                    sparkline(&data, spark_w.min(20), None),
                    theme.fg(Color::Green),
                ),
            ]);
            if item == sel {
                line = line.patch_style(theme.selected());
            }
            lines.push(line);
            item += 1;
        }
    }
    let h = area.height as usize;
    let offset = scroll_offset(selected_line, h);
    frame.render_widget(para(lines.into_iter().skip(offset).take(h).collect()), area);
}
