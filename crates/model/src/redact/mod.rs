//! Redaction: the one pass every output goes through (snapshot, bundle `raw/`, report,
//! recording, baselines, replay, export, TUI, logs). Names stay visible; values become
//! `<redacted>` when they are secret by name ([`names`]: `HF_TOKEN`, `--api-key`), by structure
//! ([`structure`]: URL userinfo, secret query parameters, `k=v`, YAML and JSON pairs,
//! `Authorization`, `Bearer`, `Basic`) or by shape ([`shapes`]: `hf_`, `sk-`, `ghp_`, `AKIA`,
//! JWTs, PEM).
//!
//! A [`Redactor`] is built per output and scrubs every secret value it removed from the rest of
//! that output ([`scrubber`]), so an echo in a stack, a thread name or a label does not leak;
//! it starts out knowing the secrets wedgewatch holds itself ([`held`]). Control characters:
//! [`control`]; baseline masks: [`mask`].

pub mod control;
pub mod held;
pub mod mask;
pub mod names;
mod plain;
mod scrubber;
pub mod shapes;
pub mod structure;
mod typed;

pub use mask::MaskKey;
pub use names::is_secret_name;
pub use scrubber::Redactor;

/// A line for a log (stderr): structure and shape redaction, control characters escaped.
pub fn log_line(msg: &str) -> String {
    let redacted = Redactor::new().text(msg);
    control::text(&redacted).into_owned()
}

/// Values as a text output shows them: redacted with one redactor across all of them
/// (learned from every value first) when `redact`, and every string's control characters
/// neutralised. `None` if a value does not survive the JSON round trip (never for our own
/// types); callers then print nothing of it rather than something unredacted.
pub fn for_output<T>(values: &[&T], redact: bool) -> Option<Vec<T>>
where
    T: serde::Serialize + serde::de::DeserializeOwned,
{
    let mut trees = values
        .iter()
        .map(|v| serde_json::to_value(v).ok())
        .collect::<Option<Vec<_>>>()?;
    if redact {
        let mut r = Redactor::new();
        trees.iter().for_each(|t| r.learn_json(t));
        trees.iter_mut().for_each(|t| r.redact_json(t));
    }
    trees
        .into_iter()
        .map(|mut t| {
            control::json(&mut t);
            serde_json::from_value(t).ok()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_lines_are_redacted_and_inert() {
        let line = log_line("GET http://u:log-secret-1@h/m?token=log-secret-2 failed: \u{1b}[2J");
        assert!(
            !line.contains("log-secret-1") && !line.contains("log-secret-2"),
            "{line}"
        );
        assert!(
            !line.contains('\u{1b}') && line.contains(r"\x1b[2J"),
            "{line}"
        );
    }

    #[test]
    fn outputs_share_one_redactor() {
        let a = serde_json::json!({"env": {"HF_TOKEN": "shared-secret-1"}});
        let b = serde_json::json!({"frame": "f(shared-secret-1)\u{7}"});
        let out = for_output(&[&a, &b], true).unwrap_or_default();
        assert_eq!(out[1]["frame"], "f(<redacted>)\\x07");
        let plain = for_output(&[&a], false).unwrap_or_default();
        assert_eq!(
            plain[0]["env"]["HF_TOKEN"], "shared-secret-1",
            "--no-redact"
        );
    }
}
