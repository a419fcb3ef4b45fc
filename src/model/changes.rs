//! Changes against a baseline (`model::Change`), below every layer that reports them: which
//! changes are configuration changes (the `config_changed` detector's input) and the one plain
//! rendering of a change that `detect` and `diff` share.

use super::Change;

/// Whether a change is a configuration change: env, cmdline, version or config (restarts and
/// topology changes are consequences, reported elsewhere).
pub fn is_config_change(c: &Change) -> bool {
    matches!(c.field.as_str(), "env" | "cmdline" | "version" | "config")
}

/// One change as a line without colour: `+ env SGLANG_X=1`.
pub fn render_change_plain(c: &Change) -> String {
    let key = c.key.as_deref().unwrap_or("");
    match (c.field.as_str(), &c.before, &c.after) {
        ("topology", None, Some(_)) if key == "component" => "+ component appeared".into(),
        ("topology", Some(_), None) if key == "component" => "- component gone".into(),
        ("process", Some(b), Some(a)) => format!("~ process restarted: {b} -> {a}"),
        (f, None, Some(a)) => format!("+ {f} {key}={a}"),
        (f, Some(b), None) => format!("- {f} {key} (was {b})"),
        (f, Some(b), Some(a)) => format!("~ {f} {key}: {b} -> {a}"),
        (f, None, None) => format!("? {f} {key}"),
    }
}
