//! Neutralising control characters from process env/argv (and anything else read from the
//! host) before they reach a text output: an escape sequence in a cmdline must not drive
//! the reader's terminal (OSC 52 writes the clipboard) or reshape a Markdown report.
//!
//! Every C0/C1 control, DEL, and the bidirectional overrides become visible escapes
//! (`\x1b`, `\u{9b}`, `\u{202e}`). Newlines and tabs from input are escaped too; only the
//! final pass over our own rendered text ([`text`]) keeps them, as that text's structure.

use std::borrow::Cow;
use std::fmt::Write;

/// Bidi controls that can make a line read differently from what it holds.
fn is_bidi(c: char) -> bool {
    matches!(c, '\u{200e}' | '\u{200f}' | '\u{061c}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

fn escape(c: char, out: &mut String) {
    let n = u32::from(c);
    let _ = if n < 0x80 {
        write!(out, "\\x{n:02x}")
    } else {
        write!(out, "\\u{{{n:x}}}")
    };
}

fn neutralize_with(s: &str, keep: impl Fn(char) -> bool) -> Cow<'_, str> {
    let bad = |c: char| (c.is_control() || is_bidi(c)) && !keep(c);
    if !s.chars().any(bad) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        if bad(c) {
            escape(c, &mut out);
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

/// A value from the host, made inert: every control character escaped, newlines included.
pub fn value(s: &str) -> Cow<'_, str> {
    neutralize_with(s, |_| false)
}

/// Our own rendered text: newlines and tabs are its structure and stay.
pub fn text(s: &str) -> Cow<'_, str> {
    neutralize_with(s, |c| c == '\n' || c == '\t')
}

/// Neutralises every string (not the keys' structure, but keys too) of a JSON tree.
pub fn json(v: &mut serde_json::Value) {
    match v {
        serde_json::Value::String(s) => {
            if let Cow::Owned(n) = value(s) {
                *s = n;
            }
        }
        serde_json::Value::Array(a) => a.iter_mut().for_each(json),
        serde_json::Value::Object(o) => {
            let dirty = o.keys().any(|k| matches!(value(k), Cow::Owned(_)));
            if dirty {
                let old = std::mem::take(o);
                for (k, mut x) in old {
                    json(&mut x);
                    o.insert(value(&k).into_owned(), x);
                }
            } else {
                o.values_mut().for_each(json);
            }
        }
        _ => {}
    }
}

/// A serialisable value with every string neutralised; the value itself if it does not
/// survive the JSON round trip (which our own types always do).
pub fn strings<T>(t: &T) -> Option<T>
where
    T: serde::Serialize + serde::de::DeserializeOwned,
{
    let mut v = serde_json::to_value(t).ok()?;
    json(&mut v);
    serde_json::from_value(v).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_are_visible_not_live() {
        let osc52 = "x\u{1b}]52;c;aGVsbG8=\u{7}y";
        assert_eq!(value(osc52), r"x\x1b]52;c;aGVsbG8=\x07y");
        assert_eq!(value("a\nb\tc\r"), r"a\x0ab\x09c\x0d");
        assert_eq!(
            value("csi \u{9b}2J rlo \u{202e}"),
            r"csi \u{9b}2J rlo \u{202e}"
        );
        assert_eq!(text("line\n\tnext\u{1b}[2J"), "line\n\tnext\\x1b[2J");
        assert!(matches!(
            value("/usr/bin/python3 --port 1 ünï"),
            Cow::Borrowed(_)
        ));
    }

    #[test]
    fn json_keys_and_values() {
        let mut v = serde_json::json!({"A\u{1b}": ["\u{7}"], "ok": "fine"});
        json(&mut v);
        assert_eq!(v, serde_json::json!({"A\\x1b": ["\\x07"], "ok": "fine"}));
    }
}
