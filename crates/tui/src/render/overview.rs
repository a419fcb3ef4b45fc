//! Overview tab: the topology tree (edges, children, GPUs) and the findings list.

use super::{fit, keep_visible, para, render_scrolled, sev_tag, source_summary, wrap, Theme};
use crate::app::{in_flight, items, App, Derived, Item};
use crate::model::{Finding, Role, SnapComponent, Snapshot, Status, Verdict};
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

/// One node of the topology tree: role, health, id, the main loop's state, exchanges in
/// flight, GPU activity, pid and the worst finding's kind.
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
    // What tells a wedge comes first, so 80 columns keep it: the loop's state over the
    // window, the requests it holds, the GPU; identification (pid, container) after.
    // An engine with a scheduler process: its own main thread is the HTTP server's, and
    // the loop is the scheduler's (on the line below).
    let has_scheduler = s
        .components
        .iter()
        .any(|x| x.role == Role::Scheduler && x.parent.as_deref() == Some(c.id.as_str()));
    if c.role == Role::Scheduler || (c.role.is_engine() && !has_scheduler) {
        spans.extend(main_loop_span(s, c, theme));
    }
    spans.extend(in_flight_span(s, c, theme));
    if let Some(a) = &c.gpu_activity {
        spans.push(Span::raw("  gpu "));
        spans.push(Span::styled(a.clone(), theme.activity(a)));
    }
    if let Some(pid) = c.main_pid.or(c.pids.first().copied()) {
        spans.push(Span::styled(format!("  pid {pid}"), theme.dim()));
    }
    // The container a top-level component runs in (children share their engine's).
    if let (Some(k), None) = (&c.container, &c.parent) {
        spans.push(Span::styled(format!(" [{k}]"), theme.dim()));
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
/// Each line comes with whether it must survive a cut (a component with a finding).
fn topology_lines(app: &App, s: &Snapshot, theme: Theme) -> Vec<(Line<'static>, bool)> {
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
        // A flagged engine's scheduler stays with it: its loop state is the evidence.
        let flagged = worst_finding(s, &c.id).is_some()
            || (c.role == Role::Scheduler
                && c.parent
                    .as_deref()
                    .is_some_and(|p| worst_finding(s, p).is_some()));
        lines.push((component_line(s, c, theme, &branch), flagged));
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
            lines.push((gpu_tree_line(s, *g, theme, &branch), false));
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
    let mut topo = topology_lines(app, s, theme);
    topo.extend(super::channels::channel_lines(s, theme));
    // One column less: the scrollbar's, when the findings do not fit.
    let width = (area.width as usize).saturating_sub(1);
    let (lines, (first, last)) = finding_lines(app, s, theme, width);
    // The topology gets what the findings leave, but never more than half the body when
    // they need it (a third while evidence is open): the findings are why the user is here.
    let want = topo.len() as u16 + 1;
    let findings_need = lines.len() as u16;
    let share = if app.finding_rows().iter().any(|r| r.item.is_some()) {
        area.height / 3
    } else {
        area.height / 2 + 1
    };
    let room = share.max(area.height.saturating_sub(findings_need));
    let topo_h = want.min(room).min(area.height);
    let [top, bottom] =
        Layout::vertical([Constraint::Length(topo_h), Constraint::Min(0)]).areas(area);
    let mut tl = vec![Line::styled("topology", theme.head())];
    let room = (topo_h as usize).saturating_sub(1);
    if topo.len() > room && room > 0 {
        // Cut, and say where the rest is rather than dropping it silently.
        let hidden = topo.len() - (room - 1);
        tl.extend(cut_tree(topo, room - 1));
        tl.push(Line::styled(
            format!("… {hidden} lines left out: 8 Components lists every component"),
            theme.dim(),
        ));
    } else {
        tl.extend(topo.into_iter().map(|(l, _)| l));
    }
    frame.render_widget(para(tl), top);
    let offset = keep_visible(first, last, bottom.height as usize);
    render_scrolled(frame, bottom, lines, offset);
}

/// The tree in `keep` lines: lines are left out from the bottom up, components with a
/// finding last, so the hop that is wedged stays on screen when the tree is cut.
fn cut_tree(lines: Vec<(Line<'static>, bool)>, keep: usize) -> Vec<Line<'static>> {
    let mut drop = lines.len().saturating_sub(keep);
    let mut kept = vec![true; lines.len()];
    for pass_flagged in [false, true] {
        for (i, (_, flagged)) in lines.iter().enumerate().rev() {
            if drop > 0 && *flagged == pass_flagged && kept[i] {
                kept[i] = false;
                drop -= 1;
            }
        }
    }
    lines
        .into_iter()
        .zip(kept)
        .filter_map(|((l, _), k)| k.then_some(l))
        .collect()
}

/// The findings pane: a title, then each row of [`App::finding_rows`] (a finding's line,
/// or one evidence item of an expanded finding); and the first and last line of the row the
/// cursor is on.
fn finding_lines(
    app: &App,
    s: &Snapshot,
    theme: Theme,
    width: usize,
) -> (Vec<Line<'static>>, (usize, usize)) {
    let d = app.derived();
    let mut lines: Vec<Line<'static>> = vec![Line::styled(
        fit(
            &format!(
                "findings ({}), most severe first — enter: lanes, evidence · t/d/m: follow",
                d.findings.len()
            ),
            width,
        ),
        theme.head(),
    )];
    if d.findings.is_empty() {
        lines.push(Line::styled(
            "  none: no detector fired on this window",
            theme.fg(Color::Green),
        ));
    }
    let mut span = (0, 0);
    for (pos, row) in app.finding_rows().iter().enumerate() {
        let Some(f) = s.findings.get(row.finding) else {
            continue;
        };
        let sel = pos == app.selected();
        let start = lines.len();
        let lanes = d.finding_chains.get(row.finding).copied().flatten();
        let mut block = match row.item {
            None => finding_head(f, app.is_expanded(f), theme, width),
            Some(k) => match items(f, lanes).get(k) {
                Some(Item::Lanes(chain)) => lane_lines(s, d, *chain, theme, width),
                Some(it) => item_lines(f, *it, theme, width),
                None => Vec::new(),
            },
        };
        if sel {
            span = (start, start + block.len().saturating_sub(1));
            block = block
                .into_iter()
                .map(|l| l.patch_style(theme.selected()))
                .collect();
        }
        lines.extend(block);
    }
    (lines, span)
}

/// A finding's line; expanded, followed by its whole summary when the line had to cut it.
fn finding_head(f: &Finding, expanded: bool, theme: Theme, width: usize) -> Vec<Line<'static>> {
    let marker = if expanded { "▾" } else { "▸" };
    let comp = f.component.as_deref().unwrap_or("-");
    let text = format!(
        "{marker} {} {:<14} {comp}  {}",
        sev_tag(f.severity),
        f.kind,
        f.summary
    );
    let mut lines = vec![Line::styled(fit(&text, width), theme.severity(f.severity))];
    if expanded && text.chars().count() > width {
        for l in wrap(&f.summary, width.saturating_sub(4)) {
            lines.push(Line::styled(format!("    {l}"), theme.severity(f.severity)));
        }
    }
    lines
}

/// The lanes of one request a finding names: a title, the column heads, one row per hop.
fn lane_lines(
    s: &Snapshot,
    d: &Derived,
    chain: usize,
    theme: Theme,
    width: usize,
) -> Vec<Line<'static>> {
    let name = d
        .chain_request
        .get(chain)
        .copied()
        .flatten()
        .and_then(|li| s.logical_requests.get(li))
        .map_or("the request", |l| l.id.as_str());
    let title = format!("    lanes of {name}: t d m the stuck hop's thread, diff, metrics");
    let mut lines = vec![Line::styled(fit(&title, width), theme.head())];
    lines.push(super::lanes::heading(theme, width));
    lines.extend(super::lanes::hop_rows(s, d, chain, theme, width));
    lines
}

/// One evidence item of an expanded finding, wrapped to the width.
fn item_lines(f: &Finding, item: Item<'_>, theme: Theme, width: usize) -> Vec<Line<'static>> {
    let (first, rest, text, style) = match item {
        Item::Requests(ids) => (
            "    requests: ",
            "              ",
            ids.join(", "),
            Style::default(),
        ),
        Item::Evidence(k) => {
            let e = &f.evidence[k];
            (
                "    • ",
                "      ",
                format!("[{}] {}", e.source, e.detail),
                Style::default(),
            )
        }
        // Drawn by `lane_lines`.
        Item::Lanes(_) => return Vec::new(),
        Item::Explanation(x) => (
            "    why: ",
            "         ",
            x.to_string(),
            theme.fg(Color::Cyan),
        ),
    };
    wrap(&text, width.saturating_sub(first.chars().count()))
        .into_iter()
        .enumerate()
        .map(|(k, l)| Line::styled(format!("{}{l}", if k == 0 { first } else { rest }), style))
        .collect()
}
