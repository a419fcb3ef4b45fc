//! One story in every output, as a check any test can run on a snapshot: the correlator's
//! verdicts (`logical_requests`), the stuck-request findings (their counts and logical ids),
//! the report's "Stuck requests" table and the TUI's "(N stuck)" name the same requests.
//! Used by `tests/pure/one_story.rs` (fixtures, recording) and `tests/labs/e2e_lab.rs`.

use std::collections::BTreeSet;
use wedgewatch::model::{FindingKind, Snapshot, Verdict};

/// The stuck requests by the correlator's verdicts (none of them a probe).
fn by_verdict(s: &Snapshot) -> BTreeSet<String> {
    for l in &s.logical_requests {
        assert!(
            !(l.probe && l.verdict == Verdict::Stuck),
            "{}: a probe is never a stuck request",
            l.id
        );
    }
    s.logical_requests
        .iter()
        .filter(|l| l.verdict == Verdict::Stuck)
        .map(|l| l.id.clone())
        .collect()
}

/// The requests the stuck-request findings name, checking each finding's count ("2
/// requests accepted ...") against the ids it lists.
fn by_findings(s: &Snapshot) -> BTreeSet<String> {
    let mut ids = BTreeSet::new();
    for f in s.findings.iter().filter(|f| {
        matches!(
            f.kind,
            FindingKind::WedgedRequest
                | FindingKind::StalledStream
                | FindingKind::KvTransferStalled
        )
    }) {
        let n: usize = f
            .summary
            .split_whitespace()
            .next()
            .and_then(|w| w.parse().ok())
            .unwrap_or_else(|| panic!("a count first: {}", f.summary));
        let listed: BTreeSet<&String> = f.requests.iter().collect();
        assert_eq!(listed.len(), f.requests.len(), "ids once: {:?}", f.requests);
        assert_eq!(n, listed.len(), "{}: {:?}", f.summary, f.requests);
        for id in &f.requests {
            assert!(
                s.logical_requests.iter().any(|l| &l.id == id),
                "{} names {id}, no logical request",
                f.kind
            );
            assert!(ids.insert(id.clone()), "{id} in two findings");
        }
    }
    ids
}

/// The requests of the report's "Stuck requests" table (first cell: the stuck leg).
fn by_report(s: &Snapshot) -> BTreeSet<String> {
    let md = wedgewatch::report::render(s);
    let mut ids = BTreeSet::new();
    let Some(start) = md.find("## Stuck requests") else {
        return ids;
    };
    for line in md[start..].lines().skip(1) {
        if line.starts_with("## ") {
            break;
        }
        if let Some(cell) = line.strip_prefix("| `") {
            let leg = cell.split('`').next().unwrap_or("");
            let id = leg.split('@').next().unwrap_or(leg);
            assert!(ids.insert(id.to_string()), "{id} twice in the table");
        }
    }
    ids
}

/// The N of the Requests view's "(N stuck" title, one row per request and all hops.
fn by_tui(s: &Snapshot) -> usize {
    use ratatui::backend::TestBackend;
    use ratatui::Terminal;
    use wedgewatch::tui::{App, AppOptions, FeedFrame, SamplerHealth};
    let mut app = App::new(AppOptions::default());
    app.ingest(FeedFrame {
        snapshot: s.clone(),
        sampler: SamplerHealth::default(),
    });
    app.handle_key(ratatui::crossterm::event::KeyEvent::from(
        ratatui::crossterm::event::KeyCode::Char('2'),
    ));
    let mut counts = Vec::new();
    for _ in 0..2 {
        let mut t = Terminal::new(TestBackend::new(200, 50)).expect("test terminal");
        t.draw(|f| app.render(f)).expect("draw");
        let buf = t.backend().buffer();
        let text: String = (0..buf.area.height)
            .map(|y| {
                (0..buf.area.width)
                    .map(|x| buf[(x, y)].symbol().to_string())
                    .collect::<String>()
                    + "\n"
            })
            .collect();
        // The title line of the Requests view (`20 requests (1 stuck, 3 waiting)`, or
        // `N exchanges (...)` listing all hops); the
        // header's headline above it may say "stuck" too.
        let title = text
            .lines()
            .find(|l| l.contains(" requests (") || l.contains(" exchanges ("))
            .unwrap_or_else(|| panic!("no requests title:\n{text}"));
        let at = title
            .find(" stuck")
            .unwrap_or_else(|| panic!("no stuck count:\n{text}"));
        let n = title[..at]
            .rsplit('(')
            .next()
            .and_then(|w| w.trim().parse().ok())
            .unwrap_or_else(|| panic!("no stuck count:\n{text}"));
        counts.push(n);
        // `a`: every hop of every request; the count stays one per request.
        app.handle_key(ratatui::crossterm::event::KeyEvent::from(
            ratatui::crossterm::event::KeyCode::Char('a'),
        ));
    }
    assert_eq!(counts[0], counts[1], "one per request in both lists");
    counts[0]
}

/// All four agree; returns how many are stuck.
pub fn one_story(what: &str, s: &Snapshot) -> usize {
    let verdicts = by_verdict(s);
    assert_eq!(by_findings(s), verdicts, "{what}: findings vs verdicts");
    assert_eq!(by_report(s), verdicts, "{what}: report vs verdicts");
    assert_eq!(by_tui(s), verdicts.len(), "{what}: TUI vs verdicts");
    verdicts.len()
}
