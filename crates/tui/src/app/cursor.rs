//! The Overview's cursor: it stops on each finding and on each evidence item of an expanded
//! finding, and the tab keeps the item under it in sight, so j/k/PgDn read through the
//! evidence on a small screen. Rows are counted in items, not screen lines, so the state needs
//! no screen width.

use crate::model::{Finding, Snapshot};

/// One row of the Overview's findings pane.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FindingRow {
    /// Index into `snapshot.findings`.
    pub finding: usize,
    /// `None`: the finding's own line. `Some(k)`: its k-th evidence item (see [`Item`]).
    pub item: Option<usize>,
}

/// What an expanded finding shows below its line, in this order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Item<'a> {
    /// The requests it concerns.
    Requests(&'a [String]),
    /// The lanes of one of them (an index into `Derived::chains`): one row per hop.
    Lanes(usize),
    /// One piece of evidence.
    Evidence(usize),
    /// Why it matters and what to do.
    Explanation(&'a str),
}

/// The evidence items of `f`, in display order; `lanes`: the chain of the request whose
/// hops it shows (`Derived::finding_chains`).
pub fn items(f: &Finding, lanes: Option<usize>) -> Vec<Item<'_>> {
    let mut out = Vec::with_capacity(f.evidence.len() + 3);
    if !f.requests.is_empty() {
        out.push(Item::Requests(&f.requests));
    }
    out.extend(lanes.map(Item::Lanes));
    out.extend((0..f.evidence.len()).map(Item::Evidence));
    if let Some(x) = &f.explanation {
        out.push(Item::Explanation(x));
    }
    out
}

/// The rows of the findings pane: each finding in `order`, followed by its items when it is
/// expanded (`lanes`: per finding index, as for [`items`]).
pub fn finding_rows(
    s: &Snapshot,
    order: &[usize],
    expanded: impl Fn(&Finding) -> bool,
    lanes: impl Fn(usize) -> Option<usize>,
) -> Vec<FindingRow> {
    let mut rows = Vec::with_capacity(order.len());
    for &fi in order {
        let Some(f) = s.findings.get(fi) else {
            continue;
        };
        rows.push(FindingRow {
            finding: fi,
            item: None,
        });
        if expanded(f) {
            rows.extend((0..items(f, lanes(fi)).len()).map(|k| FindingRow {
                finding: fi,
                item: Some(k),
            }));
        }
    }
    rows
}
