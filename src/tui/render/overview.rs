//! Overview view: the topology tree (edges, children, GPUs) and the findings list.

use super::{fit, para, scroll_offset, sev_tag, source_summary, wrap, Theme};
use crate::model::{Finding, Role, SnapComponent, Snapshot, Status, Verdict};
use crate::tui::app::{in_flight, App};
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Color, Style};
use ratatui::text::{Line, Span};
use ratatui::Frame;
use std::collections::{BTreeSet, HashMap};

fn worst_finding<'a>(s: &'a Snapshot, component: &str) -> Option<&'a Finding> {
    s.findings
        .iter()
        .filter(|f| f.component.as_deref() == Some(component))
        .max_by_key(|f| f.severity)
}

/// One node of the topology tree: role, health, id, pid, exchanges in flight, GPU
/// activity, the main loop's state and the worst finding's kind.
fn component_line(s: &Snapshot, c: &SnapComponent, theme: Theme, prefix: &str) -> Line<'static> {
    let role = match c.role {
        Role::Detokenizer => "detok",
        Role::Scheduler => "sched",
        r => r.as_str(),
    };
    // Health right after the role, so it survives a narrow screen.
    let health = match worst_finding(s, &c.id) {
        Some(f) => Span::styled(sev_tag(f.severity).to_string(), theme.severity(f.severity)),
        None => Span::styled("ok  ".to_string(), theme.fg(Color::Green)),
    };
    let mut spans = vec![
        Span::styled(prefix.to_string(), theme.dim()),
        Span::styled(format!("{role:<8}"), theme.bold()),
        health,
        Span::raw(format!(" {}", c.id)),
    ];
    if let Some(pid) = c.main_pid.or(c.pids.first().copied()) {
        spans.push(Span::styled(format!(" pid {pid}"), theme.dim()));
    }
    // The container a top-level component runs in (children share their engine's).
    if let (Some(k), None) = (&c.container, &c.parent) {
        spans.push(Span::styled(format!(" [{k}]"), theme.dim()));
    }
    spans.extend(in_flight_span(s, c, theme));
    if let Some(a) = &c.gpu_activity {
        spans.push(Span::raw("  gpu "));
        spans.push(Span::styled(a.clone(), theme.activity(a)));
    }
    if c.role == Role::Scheduler || c.role.is_engine() {
        spans.extend(main_loop_span(s, c, theme));
    }
    if let Some(f) = worst_finding(s, &c.id) {
        spans.push(Span::styled(
            format!("  {}", f.kind),
            theme.severity(f.severity),
        ));
    }
    Line::from(spans)
}

/// `"  3 in flight, 1 silent"`; nothing when no exchange is in flight.
fn in_flight_span(s: &Snapshot, c: &SnapComponent, theme: Theme) -> Option<Span<'static>> {
    let flights = s
        .requests
        .iter()
        .filter(|r| r.component == c.id && in_flight(r.state))
        .count();
    if flights == 0 {
        return None;
    }
    // The correlator's verdicts: requests stuck at this component.
    let stuck = s
        .logical_requests
        .iter()
        .filter(|l| l.verdict == Verdict::Stuck && l.stuck_at.as_deref() == Some(c.id.as_str()))
        .count();
    let text = if stuck > 0 {
        format!("  {flights} in flight, {stuck} stuck")
    } else {
        format!("  {flights} in flight")
    };
    let style = if stuck > 0 {
        theme.fg(Color::Red)
    } else {
        Style::default()
    };
    Some(Span::styled(text, style))
}

/// The scheduler's main thread over the window: `"  loop idle 3/3"`.
fn main_loop_span(s: &Snapshot, c: &SnapComponent, theme: Theme) -> Option<Span<'static>> {
    let main: Vec<_> = s
        .threads
        .iter()
        .filter(|t| t.component.as_deref() == Some(c.id.as_str()) && Some(t.tid) == c.main_pid)
        .collect();
    let t = main.first()?;
    let agree = t
        .states_over_window
        .iter()
        .filter(|x| **x == t.state)
        .count();
    let n = t.states_over_window.len();
    let text = if n > 0 {
        format!("  loop {} {agree}/{n}", t.state)
    } else {
        format!("  loop {}", t.state)
    };
    Some(Span::styled(text, theme.thread_state(&t.state)))
}

/// The tree's shape: each component's children (sorted by depth, then id) and the roots.
struct Tree {
    children: Vec<Vec<usize>>,
    roots: Vec<usize>,
}

impl Tree {
    /// Edges (proxy -> router -> engines) first, then each component's parent (schedulers
    /// under their engine).
    fn of(s: &Snapshot, idx: &HashMap<String, usize>) -> Tree {
        let mut children: Vec<Vec<usize>> = vec![Vec::new(); s.components.len()];
        let mut has_parent = vec![false; s.components.len()];
        for e in &s.edges {
            if let (Some(&a), Some(&b)) = (idx.get(&e.from), idx.get(&e.to)) {
                if a != b && !children[a].contains(&b) {
                    children[a].push(b);
                    has_parent[b] = true;
                }
            }
        }
        for (i, c) in s.components.iter().enumerate() {
            // A healthy detokenizer says nothing about a wedge: keep the tree to the hops that do.
            if c.role == Role::Detokenizer && worst_finding(s, &c.id).is_none() {
                has_parent[i] = true;
                continue;
            }
            if let Some(p) = c.parent.as_ref().and_then(|p| idx.get(p)) {
                if *p != i && !children[*p].contains(&i) {
                    children[*p].push(i);
                    has_parent[i] = true;
                }
            }
        }
        for ch in &mut children {
            ch.sort_by_key(|&i| (s.components[i].role.depth(), s.components[i].id.clone()));
        }
        let mut roots: Vec<usize> = (0..s.components.len())
            .filter(|&i| !has_parent[i])
            .collect();
        roots.sort_by_key(|&i| (s.components[i].role.depth(), s.components[i].id.clone()));
        Tree { children, roots }
    }
}

/// The topology as an indented tree: edges (proxy -> router -> engines), then each
/// component's children (schedulers), then the GPUs they use.
fn topology_lines(app: &App, s: &Snapshot, theme: Theme) -> Vec<Line<'static>> {
    let Tree { children, roots } = Tree::of(s, &app.derived().component_index);
    let mut lines = Vec::new();
    let mut seen = BTreeSet::new();
    // Explicit stack instead of recursion: (component, indent prefix, is last child).
    let mut stack: Vec<(usize, String, bool, bool)> = roots
        .iter()
        .rev()
        .enumerate()
        .map(|(k, &r)| (r, String::new(), k == 0, true))
        .collect();
    while let Some((i, indent, last, root)) = stack.pop() {
        if !seen.insert(i) {
            continue;
        }
        let c = &s.components[i];
        let (branch, child_indent) = if root {
            (String::new(), String::new())
        } else if last {
            (format!("{indent}└─ "), format!("{indent}   "))
        } else {
            (format!("{indent}├─ "), format!("{indent}│  "))
        };
        lines.push(component_line(s, c, theme, &branch));
        // GPUs hang off the deepest component that uses them (the scheduler if known).
        let own_gpus: Vec<u32> = if children[i]
            .iter()
            .any(|&ch| s.components[ch].gpus.iter().any(|g| c.gpus.contains(g)))
        {
            Vec::new()
        } else {
            c.gpus.clone()
        };
        let kids: Vec<usize> = children[i]
            .iter()
            .copied()
            .filter(|k| !seen.contains(k))
            .collect();
        for (k, g) in own_gpus.iter().enumerate() {
            let is_last = kids.is_empty() && k + 1 == own_gpus.len();
            let branch = format!("{child_indent}{}", if is_last { "└─ " } else { "├─ " });
            lines.push(gpu_tree_line(s, *g, theme, &branch));
        }
        for (k, &kid) in kids.iter().enumerate().rev() {
            stack.push((kid, child_indent.clone(), k + 1 == kids.len(), false));
        }
    }
    lines
}

fn gpu_tree_line(s: &Snapshot, index: u32, theme: Theme, prefix: &str) -> Line<'static> {
    let mut spans = vec![
        Span::styled(prefix.to_string(), theme.dim()),
        Span::styled(format!("{:<8}", "gpu"), theme.bold()),
    ];
    match s.gpus.iter().find(|g| g.index == index) {
        Some(g) => {
            spans.push(Span::raw(format!(" GPU{} {}", g.index, g.name)));
            let util = g.util_pct.map_or("-".into(), |u| format!("{u:.0}%"));
            let power = g.power_w.map_or("-".into(), |p| format!("{p:.0}W"));
            spans.push(Span::raw(format!("  util {util} power {power}")));
            if let Some(a) = &g.activity {
                spans.push(Span::raw("  "));
                spans.push(Span::styled(a.clone(), theme.activity(a)));
            }
        }
        None => {
            let why = s
                .sources
                .get("gpu")
                .filter(|st| st.status != Status::Ok)
                .map_or("no reading".to_string(), |st| {
                    format!("gpu source {}", source_summary(st))
                });
            spans.push(Span::raw(format!(" GPU{index}")));
            spans.push(Span::styled(format!("  {why}"), theme.fg(Color::Yellow)));
        }
    }
    Line::from(spans)
}

pub(super) fn render(app: &App, s: &Snapshot, theme: Theme, frame: &mut Frame, area: Rect) {
    let topo = topology_lines(app, s, theme);
    let want = topo.len() as u16 + 1;
    let topo_h = want.min(area.height / 2 + 1).min(area.height);
    let [top, bottom] =
        Layout::vertical([Constraint::Length(topo_h), Constraint::Min(0)]).areas(area);
    let mut tl = vec![Line::styled("topology", theme.bold())];
    tl.extend(topo);
    frame.render_widget(para(tl), top);

    let (lines, selected_line) = finding_lines(app, s, theme, bottom.width as usize);
    let h = bottom.height as usize;
    let offset = scroll_offset(selected_line, h);
    let visible: Vec<Line<'static>> = lines.into_iter().skip(offset).take(h).collect();
    frame.render_widget(para(visible), bottom);
}

/// The findings list, most severe first, expanded ones with their evidence; and the line
/// the selection is on.
fn finding_lines(
    app: &App,
    s: &Snapshot,
    theme: Theme,
    width: usize,
) -> (Vec<Line<'static>>, usize) {
    let d = app.derived();
    let mut lines: Vec<Line<'static>> = Vec::new();
    let mut selected_line = 0;
    lines.push(Line::styled(
        format!(
            "findings ({}), most severe first — enter: evidence",
            d.findings.len()
        ),
        theme.bold(),
    ));
    if d.findings.is_empty() {
        lines.push(Line::styled(
            "  none: no detector fired on this window",
            theme.fg(Color::Green),
        ));
    }
    for (pos, &fi) in d.findings.iter().enumerate() {
        let f = &s.findings[fi];
        let expanded = app.is_expanded(f);
        let sel = pos == app.selected();
        if sel {
            selected_line = lines.len();
        }
        let marker = if expanded { "▾" } else { "▸" };
        let comp = f.component.as_deref().unwrap_or("-");
        let text = format!(
            "{marker} {} {:<14} {comp}  {}",
            sev_tag(f.severity),
            f.kind,
            f.summary
        );
        let mut style = theme.severity(f.severity);
        if sel {
            style = style.patch(theme.selected());
        }
        lines.push(Line::styled(fit(&text, width), style));
        if expanded {
            // The summary again, wrapped, when the line above had to cut it.
            let cut = text.chars().count() > width;
            lines.extend(evidence_lines(f, cut, theme, width));
        }
    }
    (lines, selected_line)
}

/// An expanded finding: its whole summary (when `cut`), requests, evidence, explanation.
fn evidence_lines(f: &Finding, cut: bool, theme: Theme, width: usize) -> Vec<Line<'static>> {
    let mut lines = Vec::new();
    if cut {
        for l in wrap(&f.summary, width.saturating_sub(4)) {
            lines.push(Line::styled(format!("    {l}"), theme.severity(f.severity)));
        }
    }
    if !f.requests.is_empty() {
        lines.push(Line::raw(fit(
            &format!("    requests: {}", f.requests.join(", ")),
            width,
        )));
    }
    for e in &f.evidence {
        for (k, l) in wrap(
            &format!("[{}] {}", e.source, e.detail),
            width.saturating_sub(6),
        )
        .into_iter()
        .enumerate()
        {
            let lead = if k == 0 { "    • " } else { "      " };
            lines.push(Line::raw(format!("{lead}{l}")));
        }
    }
    if let Some(x) = &f.explanation {
        for (k, l) in wrap(x, width.saturating_sub(9)).into_iter().enumerate() {
            let lead = if k == 0 { "    why: " } else { "         " };
            lines.push(Line::styled(format!("{lead}{l}"), theme.fg(Color::Cyan)));
        }
    }
    lines
}
