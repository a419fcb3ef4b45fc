//! Values no structure or shape rule can match, told by their bytes: the addresses, ids and
//! times wedgewatch formats itself, most of a big node's snapshot. They skip the rules' regexes
//! and are still scrubbed of every learned secret. No rule can match them
//! ([`super::structure`], [`super::shapes`]): those need `/`, `=`, a quote, `:` before a blank,
//! a blank, `_`, an upper-case letter, or a lower-case one next to `-`. So: lower-case letters,
//! digits and `.:@[]%`; or digits with `-:.+TZ` and no other letter (RFC 3339 times).

/// Whether `s` is made only of bytes that no structure or shape rule can match.
pub fn cannot_reveal(s: &str) -> bool {
    let b = s.as_bytes();
    b.iter()
        .all(|&c| matches!(c, b'a'..=b'z' | b'0'..=b'9' | b'.' | b':' | b'@' | b'[' | b']' | b'%'))
        || b.iter()
            .all(|&c| matches!(c, b'0'..=b'9' | b'-' | b':' | b'.' | b'+' | b'T' | b'Z'))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The values of a big node's snapshot are plain; anything a rule could match is not.
    #[test]
    fn our_own_values_are_plain_and_near_misses_are_not() {
        for ours in [
            "127.0.0.1:59714",
            "[::1]:8000",
            "[fe80::1%eth0]:30000",
            "x10773",
            "r106520@router",
            "decode@127.0.0.1:32001",
            "2026-12-02T14:28:14.109Z",
            "2026-12-02T14:28:14+01:00",
            "",
        ] {
            assert!(cannot_reveal(ours), "{ours}");
        }
        for other in [
            "sk-abcdefghijklmnopqrstuvwxyz",
            "glpat-abcdefghijklmnopqrstuv",
            "xoxb-1234567890",
            "hf_abcdefghijklmnopqrstuvwxyz0123",
            "AKIAABCDEFGHIJKLMNOP",
            "token=abc",
            "a: b",
            "http://u:p@h",
            "bearer abcdefgh",
            "ESTABLISHED",
            "-----BEGIN KEY-----",
        ] {
            assert!(!cannot_reveal(other), "{other}");
        }
    }

    /// Whatever the rules are, a plain value never matches one: checked over every string
    /// of up to 4 bytes of each alphabet, and long runs (the shapes need 10 to 35 bytes).
    #[test]
    fn no_rule_matches_a_plain_value() {
        let alphabets = ["az09.:@[]%sk", "09-:.+TZ"];
        for alphabet in alphabets {
            let bytes: Vec<char> = alphabet.chars().collect();
            let mut words: Vec<String> = vec![String::new()];
            let mut frontier = words.clone();
            for _ in 0..4 {
                frontier = frontier
                    .iter()
                    .flat_map(|w| bytes.iter().map(move |c| format!("{w}{c}")))
                    .collect();
                words.extend(frontier.iter().cloned());
            }
            for w in &words {
                let long = format!(
                    "{w}{}{w}",
                    "skabcdefghijklmnopqrstuvwxyz0123456789".repeat(2)
                );
                for s in [w.as_str(), long.as_str()] {
                    if !cannot_reveal(s) {
                        continue;
                    }
                    assert!(super::super::structure::find(s).is_empty(), "{s:?}");
                    assert!(super::super::shapes::find(s).is_empty(), "{s:?}");
                }
            }
        }
    }
}
