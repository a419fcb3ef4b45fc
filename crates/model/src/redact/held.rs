//! Secret values wedgewatch itself holds: a router key from its own environment
//! (`--router-key-env NAME`) and every key it read for a router request. Nothing in the
//! outputs names them (a router may echo its key in any text), so every [`super::Redactor`]
//! starts out knowing them and scrubs them from whatever it redacts.

use std::collections::BTreeSet;
use std::sync::{Mutex, PoisonError};

/// Bound on held values: a node has a few routers, each with one key.
const MAX_HELD: usize = 256;

static HELD: Mutex<BTreeSet<String>> = Mutex::new(BTreeSet::new());

/// Remembers `value` for every redactor made from now on (empty values are not secrets).
pub fn hold(value: &str) {
    if value.is_empty() {
        return;
    }
    let mut held = HELD.lock().unwrap_or_else(PoisonError::into_inner);
    if held.len() < MAX_HELD {
        held.insert(value.to_string());
    }
}

/// The values held so far.
pub(super) fn held() -> BTreeSet<String> {
    HELD.lock().unwrap_or_else(PoisonError::into_inner).clone()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::redact::Redactor;

    #[test]
    fn every_redactor_made_after_a_value_is_held_scrubs_it() {
        let v = "held-router-key-8c2a";
        hold(v);
        hold("");
        let text = format!("echo: Bearer-less {v} in a label");
        assert!(!Redactor::new().text(&text).contains(v));
        assert!(!Redactor::masking(None).text(&text).contains(v));
        let mut json = serde_json::json!({"workers": [{"url": format!("http://h/{v}")}]});
        Redactor::default().redact_json(&mut json);
        assert!(!json.to_string().contains(v), "{json}");
    }
}
