//! The Diff tab's folding: a child process (scheduler, detokenizer) inherits its engine's
//! environment and restarts with it, so its change of the same field and key only repeats
//! the engine's. It is left out and named on the engine's row instead: one restart with an
//! added variable is two rows, not six (the `config_changed` finding folds them alike).

use crate::model::Snapshot;
use std::collections::HashMap;

/// Drops from `changes` (indices into `s.config_changed`) each change whose component's
/// parent has a change of the same field and key; returns, per kept change, the children
/// folded into it (their ids).
pub(super) fn fold_children(s: &Snapshot, changes: &mut Vec<usize>) -> HashMap<usize, Vec<String>> {
    let parent: HashMap<&str, &str> = s
        .components
        .iter()
        .filter_map(|c| Some((c.id.as_str(), c.parent.as_deref()?)))
        .collect();
    let at = |i: usize| s.config_changed.get(i);
    let mut folded: HashMap<usize, Vec<String>> = HashMap::new();
    let kept: Vec<usize> = changes
        .iter()
        .copied()
        .filter(|&i| {
            let Some(c) = at(i) else {
                return false;
            };
            let Some(&p) = parent.get(c.component.as_str()) else {
                return true;
            };
            let same = changes.iter().copied().find(|&j| {
                at(j).is_some_and(|x| x.component == p && x.field == c.field && x.key == c.key)
            });
            match same {
                Some(j) => {
                    folded.entry(j).or_default().push(c.component.clone());
                    false
                }
                None => true,
            }
        })
        .collect();
    *changes = kept;
    folded
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_childs_repeat_of_its_engines_change_is_folded_into_it() {
        let s: Snapshot = serde_json::from_str(include_str!(
            "../../../../tests/fixtures/snapshots/demo.json"
        ))
        .expect("fixture");
        let mut changes: Vec<usize> = (0..s.config_changed.len()).collect();
        let folded = fold_children(&s, &mut changes);
        let kept: Vec<(&str, &str)> = changes
            .iter()
            .map(|&i| {
                let c = &s.config_changed[i];
                (c.component.as_str(), c.key.as_deref().unwrap_or(""))
            })
            .collect();
        assert_eq!(
            kept,
            [
                (
                    "decode@127.0.0.1:30052",
                    "SGLANG_DECODE_PREALLOC_SPLIT_TOKENS"
                ),
                ("decode@127.0.0.1:30052", "restarted"),
                ("proxy@127.0.0.1:30123", "component"),
            ],
            "seven rows for three facts before"
        );
        assert_eq!(
            folded.get(&changes[0]).map(Vec::as_slice),
            Some(
                &[
                    "detokenizer@decode@127.0.0.1:30052".to_string(),
                    "scheduler@decode@127.0.0.1:30052".to_string()
                ][..]
            )
        );
    }
}
