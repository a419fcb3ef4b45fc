//! Threads tab: per-thread state over the window's dumps, and the frames of the selected one.

use super::{fit, para, render_scrolled, rfit, scroll_offset, short_id, source_summary, Theme};
use crate::app::App;
use crate::model::{SnapThread, Snapshot, Status, ThreadState};
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::Modifier;
use ratatui::text::{Line, Span};
use ratatui::Frame;

fn state_letter(state: &ThreadState) -> char {
    match state {
        ThreadState::Idle => 'i',
        ThreadState::RunningBatch => 'R',
        ThreadState::WaitingGpuResult => 'W',
        ThreadState::Collective | ThreadState::NcclCollective | ThreadState::GlooCollective => 'C',
        ThreadState::P2pWait => 'X',
        ThreadState::WaitingWorkers => 'w',
        ThreadState::PdQueuePolling => 'P',
        ThreadState::StuckOutsideLoop => 'S',
        ThreadState::Startup => 'u',
        ThreadState::Shutdown => 'D',
        ThreadState::HelperIdle => 'h',
        ThreadState::Waiting => 'q',
        // An earlier build's name, still in tests/fixtures/snapshots/healthy.json.
        ThreadState::Other(s) if s == "waiting_gpu" => 'W',
        // An empty state: a thread from a snapshot that had none.
        ThreadState::Other(s) if s.is_empty() => ' ',
        ThreadState::Unknown | ThreadState::Other(_) => '?',
    }
}

pub(super) fn render(app: &App, s: &Snapshot, theme: Theme, frame: &mut Frame, area: Rect) {
    let d = app.derived();
    let w = area.width as usize;
    if s.threads.is_empty() {
        frame.render_widget(para(no_dump_lines(s, theme)), area);
        return;
    }
    // The frames get what the thread list does not need (at least a third; open, all but
    // a few list rows), so a short list never leaves the frames cut above empty lines.
    let list_need = d.threads.len() as u16 + 2;
    let frames_h = if app.detail_open() {
        area.height - list_need.min((area.height / 4).max(3)).min(area.height)
    } else {
        (area.height / 3)
            .max(area.height.saturating_sub(list_need))
            .max(3)
            .min(area.height)
    };
    let [top, bottom] =
        Layout::vertical([Constraint::Min(0), Constraint::Length(frames_h)]).areas(area);
    // Fixed columns take 47; the component gets the rest, leaving room for ~9 dumps.
    let comp_w = w.saturating_sub(56).clamp(12, 40);
    let mut lines = thread_heading(comp_w, theme, w);
    let rows_h = (top.height as usize).saturating_sub(2);
    let sel = app.selected();
    let offset = scroll_offset(sel, rows_h);
    for (pos, &ti) in d.threads.iter().enumerate().skip(offset).take(rows_h) {
        lines.push(thread_line(&s.threads[ti], comp_w, theme, pos == sel));
    }
    frame.render_widget(para(lines), top);

    let fl = match d.threads.get(sel).and_then(|&i| s.threads.get(i)) {
        Some(t) => frame_lines(t, app.detail_open(), theme, w),
        None => Vec::new(),
    };
    // Open (enter), the frames pane scrolls with j/k: a deep stack's outer frames (where
    // the loop is) are the last ones.
    let offset = if app.detail_open() {
        app.set_detail_viewport(bottom.height as usize);
        app.detail_scroll()
    } else {
        0
    };
    render_scrolled(frame, bottom, fl, offset);
}

/// No dumps: say so, and why when the stacks source is not ok.
fn no_dump_lines(s: &Snapshot, theme: Theme) -> Vec<Line<'static>> {
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
    lines
}

/// The legend of the state letters, then the column heads.
fn thread_heading(comp_w: usize, theme: Theme, w: usize) -> Vec<Line<'static>> {
    vec![
        Line::styled(
            fit(
                "state per dump, oldest → newest: i idle · h helper · R running · W wait GPU · w wait workers · C collective · X p2p · P PD poll · K KV · u startup · D shutdown · S stuck · q waiting · ? other",
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
    ]
}

fn thread_line(t: &SnapThread, comp_w: usize, theme: Theme, selected: bool) -> Line<'static> {
    let mut spans = vec![
        Span::raw(format!(
            "{} {} {} {} ",
            short_id(t.component.as_deref().unwrap_or("-"), comp_w),
            rfit(&t.pid.to_string(), 7),
            rfit(&t.tid.to_string(), 7),
            fit(t.name.as_deref().unwrap_or("-"), 14)
        )),
        Span::styled(fit(t.state.as_str(), 14), theme.thread_state(&t.state)),
        Span::raw(" "),
    ];
    for st in &t.states_over_window {
        spans.push(Span::styled(
            state_letter(st).to_string(),
            theme.thread_state(st),
        ));
    }
    // No rule matched: say where it is rather than guess.
    if t.state == ThreadState::Unknown {
        if let Some(top) = t.frames.first() {
            spans.push(Span::styled(format!("  top: {top}"), theme.dim()));
        }
    }
    let line = Line::from(spans);
    if selected {
        line.patch_style(theme.selected())
    } else {
        line
    }
}

/// The selected thread's frames, innermost first.
fn frame_lines(t: &SnapThread, detail_open: bool, theme: Theme, w: usize) -> Vec<Line<'static>> {
    let mut fl = vec![Line::styled(
        fit(
            &format!(
                "frames of {} tid {} ({}), innermost first{}",
                t.name.as_deref().unwrap_or("thread"),
                t.tid,
                t.state,
                if detail_open {
                    " — j/k scroll, esc back"
                } else {
                    " — enter: more"
                }
            ),
            w,
        ),
        theme.head().add_modifier(Modifier::UNDERLINED),
    )];
    // Which rule decided, at which frame: names the collective and where the thread waits.
    if let Some(rule) = &t.rule {
        let at = t
            .decided_by
            .as_deref()
            .map(|f| format!(" at {f}"))
            .unwrap_or_default();
        fl.push(Line::styled(
            fit(&format!("  rule {rule}{at}"), w),
            theme.dim(),
        ));
    }
    if t.frames.is_empty() {
        fl.push(Line::styled("  (no frames captured)", theme.dim()));
    }
    for f in &t.frames {
        fl.push(Line::raw(fit(&format!("  {f}"), w)));
    }
    fl
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(lines: &[Line<'_>]) -> Vec<String> {
        lines
            .iter()
            .map(|l| l.spans.iter().map(|s| s.content.as_ref()).collect())
            .collect()
    }

    /// The frame panel names the deciding rule and frame, so the collective is on screen.
    #[test]
    fn frames_say_which_rule_decided() {
        let mut t = SnapThread {
            pid: 7,
            tid: 7,
            name: Some("MainThread".into()),
            state: ThreadState::Collective,
            frames: vec!["all_reduce (distributed_c10d.py:3075)".into()],
            component: None,
            states_over_window: vec![],
            rule: Some("collective.all_reduce".into()),
            decided_by: Some("all_reduce (distributed_c10d.py:3075)".into()),
        };
        let theme = Theme { no_color: true };
        let lines = text(&frame_lines(&t, true, theme, 100));
        assert_eq!(
            lines[1].trim_end(),
            "  rule collective.all_reduce at all_reduce (distributed_c10d.py:3075)"
        );
        t.rule = None;
        t.decided_by = None;
        let lines = text(&frame_lines(&t, true, theme, 100));
        assert_eq!(
            lines[1].trim_end(),
            "  all_reduce (distributed_c10d.py:3075)"
        );
        assert_eq!(state_letter(&ThreadState::P2pWait), 'X');
        assert_eq!(state_letter(&ThreadState::from("waiting_gpu")), 'W');
        assert_eq!(state_letter(&ThreadState::from("")), ' ');
    }
}
