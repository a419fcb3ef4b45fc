//! The Metrics tab's order: the blamed hop's series first, and in each component the
//! series that tell a wedge (running, queued, forward time, ...) before the rest; a bucketed
//! series' buckets in numeric order (`le="+Inf"` last), not as text, where `gt="1200"` came
//! before `gt="30"`.

use super::follow::in_family;
use crate::model::Snapshot;
use std::cmp::Ordering;

/// What the engine, router and queues say about a hang, most telling first (the names the
/// metric maps give them, `probes/metrics-*.toml`).
const KEY_FACTS: &[&str] = &[
    "running",
    "queued",
    "forward_seconds_total",
    "generation_tokens_total",
    "http_active",
    "worker_in_flight",
    "token_usage",
    "kv_cache_usage",
    "decode_prealloc_queue",
    "decode_transfer_queue",
    "prefill_bootstrap_queue",
    "prefill_inflight_queue",
    "requests_total",
    "aborted_requests_total",
];

/// `name{label="value"}` split into the name and, if any, its first label and value.
fn split_series(key: &str) -> (&str, Option<(&str, &str)>) {
    let Some((base, rest)) = key.split_once('{') else {
        return (key, None);
    };
    let label = rest.trim_end_matches('}').split_once('=').map(|(k, v)| {
        let v = v.split(',').next().unwrap_or(v);
        (k, v.trim_matches('"'))
    });
    (base, label)
}

/// A label value as a number where it is one (`+Inf` the largest).
fn label_number(v: &str) -> Option<f64> {
    match v {
        "+Inf" | "Inf" => Some(f64::INFINITY),
        "-Inf" => Some(f64::NEG_INFINITY),
        _ => v.parse().ok().filter(|x: &f64| !x.is_nan()),
    }
}

fn fact_rank(base: &str) -> usize {
    KEY_FACTS
        .iter()
        .position(|k| *k == base)
        .unwrap_or(KEY_FACTS.len())
}

/// Two series of one component: key facts first, a name before its labelled series, label
/// values numerically (numbers before words), then as text.
pub(super) fn compare_series(a: &str, b: &str) -> Ordering {
    let ((ba, la), (bb, lb)) = (split_series(a), split_series(b));
    fact_rank(ba)
        .cmp(&fact_rank(bb))
        .then_with(|| ba.cmp(bb))
        .then_with(|| match (la, lb) {
            (None, None) => Ordering::Equal,
            (None, Some(_)) => Ordering::Less,
            (Some(_), None) => Ordering::Greater,
            (Some((ka, va)), Some((kb, vb))) => {
                ka.cmp(kb)
                    .then_with(|| match (label_number(va), label_number(vb)) {
                        (Some(x), Some(y)) => x.total_cmp(&y),
                        (Some(_), None) => Ordering::Less,
                        (None, Some(_)) => Ordering::Greater,
                        (None, None) => Ordering::Equal,
                    })
            }
        })
        .then_with(|| a.cmp(b))
}

/// Orders the Metrics tab's `(component index, series)` lines: the components of
/// `subject`'s family first, then in snapshot order; within one, [`compare_series`].
pub(super) fn metrics_key_facts_first(
    s: &Snapshot,
    subject: Option<&str>,
    lines: &mut [(usize, String)],
) {
    let mine: Vec<bool> = s
        .components
        .iter()
        .map(|c| subject.is_some_and(|top| in_family(s, top, &c.id)))
        .collect();
    let theirs = |ci: usize| !mine.get(ci).copied().unwrap_or(false);
    lines.sort_by(|(ca, a), (cb, b)| {
        theirs(*ca)
            .cmp(&theirs(*cb))
            .then(ca.cmp(cb))
            .then_with(|| compare_series(a, b))
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sorted(keys: &[&str]) -> Vec<String> {
        let mut v: Vec<String> = keys.iter().map(|k| k.to_string()).collect();
        v.sort_by(|a, b| compare_series(a, b));
        v
    }

    #[test]
    fn buckets_sort_as_numbers_with_inf_last() {
        let v = sorted(&[
            r#"d_bucket{le="+Inf"}"#,
            r#"d_bucket{le="10"}"#,
            r#"d_bucket{le="0.5"}"#,
            r#"d_bucket{le="2.5"}"#,
            "d_bucket",
        ]);
        assert_eq!(
            v,
            [
                "d_bucket",
                r#"d_bucket{le="0.5"}"#,
                r#"d_bucket{le="2.5"}"#,
                r#"d_bucket{le="10"}"#,
                r#"d_bucket{le="+Inf"}"#
            ]
        );
        let v = sorted(&[
            r#"aged{gt="1200"}"#,
            r#"aged{gt="30"}"#,
            r#"aged{gt="300"}"#,
            r#"aged{gt="0"}"#,
        ]);
        assert_eq!(
            v,
            [
                r#"aged{gt="0"}"#,
                r#"aged{gt="30"}"#,
                r#"aged{gt="300"}"#,
                r#"aged{gt="1200"}"#
            ]
        );
    }

    #[test]
    fn key_facts_come_before_the_rest() {
        let v = sorted(&[
            "aborted_requests_total",
            "idle_seconds_total",
            "queued",
            "forward_seconds_total",
            "running",
        ]);
        assert_eq!(
            v,
            [
                "running",
                "queued",
                "forward_seconds_total",
                "aborted_requests_total",
                "idle_seconds_total"
            ]
        );
    }
}
