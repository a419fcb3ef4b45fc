//! Reading stored values that may hold keyed masks of secrets (`<redacted:KEYID:MAC>`, made
//! by `redact::mask` for baselines): whether two say the same thing, and how one is shown.
//! Part of the model because the baseline facts compared by `model::changes` hold them;
//! making masks (the key) stays in `redact::mask`.

use std::sync::LazyLock;

/// Today's masks, and the CRC32 masks of earlier versions (`<redacted:8 hex>`), which must
/// not be re-published from old recordings either: they let anyone test guesses.
static MASK: LazyLock<Option<regex::Regex>> = LazyLock::new(|| {
    regex::Regex::new(r"<redacted:(?:(?P<id>[0-9a-f]{8}):[0-9a-f]{16}|[0-9a-f]{8})>").ok()
});
/// The "key id" of the old CRC32 masks (one salt per process, none recorded).
const CRC_KEY_ID: &str = "crc32";

/// Whether `s` holds a mask.
pub fn has_mask(s: &str) -> bool {
    MASK.as_ref().is_some_and(|re| re.is_match(s))
}

/// `s` with every mask shown as plain `<redacted>` (what leaves the daemon in a `Change`).
pub fn unmask(s: &str) -> String {
    match MASK.as_ref() {
        Some(re) => re.replace_all(s, crate::model::REDACTED).into_owned(),
        None => s.to_string(),
    }
}

fn key_ids(s: &str) -> Vec<&str> {
    MASK.as_ref()
        .map(|re| {
            re.captures_iter(s)
                .map(|c| c.name("id").map_or(CRC_KEY_ID, |m| m.as_str()))
                .collect()
        })
        .unwrap_or_default()
}

/// Whether two stored values say the same thing. Masks under different keys cannot be
/// compared: such values count as the same when they match with the masks blanked.
pub fn same(a: &str, b: &str) -> bool {
    if a == b {
        return true;
    }
    let mut ids = key_ids(a);
    ids.extend(key_ids(b));
    ids.sort_unstable();
    ids.dedup();
    ids.len() > 1 && unmask(a) == unmask(b)
}
