//! Threads view: per-thread state over the window's dumps, and the frames of the selected one.

use super::{fit, para, rfit, scroll_offset, source_summary, Theme};
use crate::model::{Snapshot, Status};
use crate::tui::app::App;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::Modifier;
use ratatui::text::{Line, Span};
use ratatui::Frame;

fn state_letter(state: &str) -> char {
    match state {
        "idle" => 'i',
        "running_batch" => 'R',
        "waiting_gpu" | "waiting_gpu_result" => 'W',
        "collective" | "nccl_collective" | "gloo_collective" => 'C',
        "pd_queue_polling" => 'P',
        "kv_transfer" => 'K',
        "stuck" | "stuck_outside_loop" => 'S',
        "" => ' ',
        _ => '?',
    }
}

pub(super) fn render(app: &App, s: &Snapshot, theme: Theme, frame: &mut Frame, area: Rect) {
    let d = app.derived();
    let w = area.width as usize;
    // Fixed columns take 47; the component gets the rest, leaving room for ~10 dumps.
    let comp_w = w.saturating_sub(57).clamp(12, 40);
    if s.threads.is_empty() {
        let st = s.sources.get("stacks");
        let mut lines = vec![Line::styled("no thread dumps in this window", theme.bold())];
        if let Some(st) = st.filter(|st| st.status != Status::Ok) {
            lines.push(Line::styled(
                format!(
                    "stacks {}: {}",
                    source_summary(st),
                    st.reason.as_deref().unwrap_or("no reason given")
                ),
                theme.status(st.status),
            ));
            lines.push(Line::raw(
                "install py-spy (see `wedgewatch doctor`) to see what each scheduler thread does",
            ));
        }
        frame.render_widget(para(lines), area);
        return;
    }
    let frames_h = if app.detail_open() {
        area.height / 2
    } else {
        (area.height / 3).max(3).min(area.height)
    };
    let [top, bottom] =
        Layout::vertical([Constraint::Min(0), Constraint::Length(frames_h)]).areas(area);
    let mut lines = vec![
        Line::styled(
            fit(
                "state per dump, oldest → newest: i idle · R running batch · W waiting GPU · C collective · P PD queue poll · K KV transfer · S stuck · ? other",
                w,
            ),
            theme.dim(),
        ),
        Line::styled(
            fit(
                &format!(
                    "{} {} {} {} {} {}",
                    fit("COMPONENT", comp_w),
                    rfit("PID", 7),
                    rfit("TID", 7),
                    fit("NAME", 14),
                    fit("STATE", 14),
                    "DUMPS"
                ),
                w,
            ),
            theme.bold(),
        ),
    ];
    let rows_h = (top.height as usize).saturating_sub(2);
    let sel = app.selected();
    let offset = scroll_offset(sel, rows_h);
    for (pos, &ti) in d.threads.iter().enumerate().skip(offset).take(rows_h) {
        let t = &s.threads[ti];
        let mut spans = vec![
            Span::raw(format!(
                "{} {} {} {} ",
                fit(t.component.as_deref().unwrap_or("-"), comp_w),
                rfit(&t.pid.to_string(), 7),
                rfit(&t.tid.to_string(), 7),
                fit(t.name.as_deref().unwrap_or("-"), 14)
            )),
            Span::styled(fit(&t.state, 14), theme.thread_state(&t.state)),
            Span::raw(" "),
        ];
        for st in &t.states_over_window {
            spans.push(Span::styled(
                state_letter(st).to_string(),
                theme.thread_state(st),
            ));
        }
        let mut line = Line::from(spans);
        if pos == sel {
            line = line.patch_style(theme.selected());
        }
        lines.push(line);
    }
    frame.render_widget(para(lines), top);

    let mut fl = Vec::new();
    if let Some(t) = d.threads.get(sel).and_then(|&i| s.threads.get(i)) {
        fl.push(Line::styled(
            fit(
                &format!(
                    "frames of {} tid {} ({}), innermost first{}",
                    t.name.as_deref().unwrap_or("thread"),
                    t.tid,
                    t.state,
                    if app.detail_open() {
                        ""
                    } else {
                        " — enter: more"
                    }
                ),
                w,
            ),
            theme.bold().add_modifier(Modifier::UNDERLINED),
        ));
        if t.frames.is_empty() {
            fl.push(Line::styled("  (no frames captured)", theme.dim()));
        }
        for f in &t.frames {
            fl.push(Line::raw(fit(&format!("  {f}"), w)));
        }
    }
    frame.render_widget(para(fl), bottom);
}
