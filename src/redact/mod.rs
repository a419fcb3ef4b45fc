//! Redaction: the one pass every output goes through (snapshot, bundle `raw/`, report,
//! recording, baselines, replay, export, TUI, logs).
//!
//! Names stay visible; values become `<redacted>` when they are secret
//! - by name ([`names`]): an env variable, option, label or JSON key such as `HF_TOKEN`,
//!   `--api-key`, `DB_PASS`;
//! - by structure ([`structure`]): URL userinfo, secret query parameters, `k=v`, YAML and
//!   JSON pairs under secret keys, `Authorization`/`Bearer` headers;
//! - by shape ([`shapes`]): vendor token formats (`hf_`, `sk-`, `ghp_`, `AKIA`, JWTs, PEM).
//!
//! A [`Redactor`] is built per output. It remembers every secret value it removed and then
//! removes later occurrences of those values anywhere in the same output ([`scrubber`]),
//! so a secret echoed in a stack, a thread name or a metrics label does not leak either.
//! Control characters are neutralised separately ([`control`]); masks for baselines live
//! in [`mask`].

pub mod control;
pub mod mask;
pub mod names;
mod scrubber;
pub mod shapes;
pub mod structure;

pub use mask::MaskKey;
pub use names::is_secret_name;
pub use scrubber::Redactor;

/// A line for a log (stderr): structure and shape redaction, control characters escaped.
pub fn log_line(msg: &str) -> String {
    let redacted = Redactor::new().text(msg);
    control::text(&redacted).into_owned()
}
