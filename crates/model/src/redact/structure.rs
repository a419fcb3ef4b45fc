//! Detection by structure: where a text says "this is a secret" by its syntax.
//!
//! - URL userinfo: the password of `scheme://user:pass@host`, and a user-only userinfo
//!   long enough to be a key (`https://KEY@host/1`, Sentry-style DSNs);
//! - `key=value`, `key: value`, `"key": "value"` (query strings, `k=v` arguments, YAML,
//!   JSON inside a value, HTTP headers) whose key is a secret name;
//! - `--secret-option value` inside a joined command line;
//! - `Bearer <token>` anywhere;
//! - `Basic <base64>` anywhere, when the base64 decodes to `user:password` (RFC 7617):
//!   the decoding tells a credential from the word "basic" in prose.
//!
//! Each finder returns byte ranges of the secret part only, so names stay visible.

use super::names::is_secret_name;
use std::ops::Range;
use std::sync::LazyLock;

/// A user-only userinfo at least this long is taken for a key, not a user name.
const MIN_USERINFO_KEY: usize = 12;

fn compile(re: &str) -> Option<regex::Regex> {
    regex::Regex::new(re).ok()
}

static USERINFO: LazyLock<Option<regex::Regex>> =
    LazyLock::new(|| compile(r#"\b[A-Za-z][A-Za-z0-9+.\-]*://(?P<ui>[^/?#\s@"'<>]+)@"#));

/// A key (quoted with `:`, or bare with `=` or `: `), an optional auth scheme, a value
/// (quoted or bare). Values starting with `<` are our own placeholders.
static KEY_VALUE: LazyLock<Option<regex::Regex>> = LazyLock::new(|| {
    compile(concat!(
        r#"(?:"(?P<qk>[^"\s]{1,64})"\s*:\s*|'(?P<sk>[^'\s]{1,64})'\s*:\s*"#,
        r#"|(?P<k>[A-Za-z_][A-Za-z0-9_.\-]{0,63})(?:\s*=\s*|:[ \t]+))"#,
        r#"(?:(?i:bearer|basic|token|digest)[ \t]+)?"#,
        r#"(?:"(?P<dq>(?:[^"\\<]|\\.)(?:[^"\\]|\\.)*)"|'(?P<sq>[^'<][^']*)'"#,
        r#"|(?P<bare>[^\s,;&#"'<>{}\[\]()][^\s,;&#"'<>{}\[\]()]*))"#,
    ))
});

static FLAG_VALUE: LazyLock<Option<regex::Regex>> = LazyLock::new(|| {
    compile(r"(?:^|\s)--?(?P<k>[A-Za-z][A-Za-z0-9_.\-]*)[ \t]+(?P<v>[^\s\-<][^\s]*)")
});

static BEARER: LazyLock<Option<regex::Regex>> =
    LazyLock::new(|| compile(r"(?i)\bbearer[ \t]+(?P<v>[A-Za-z0-9\-._~+/]{8,}=*)"));

static BASIC: LazyLock<Option<regex::Regex>> =
    LazyLock::new(|| compile(r"(?i)\bbasic[ \t]+(?P<v>[A-Za-z0-9+/]{4,}={0,2})"));

/// Byte ranges of every secret `text` reveals by its structure.
pub fn find(text: &str) -> Vec<Range<usize>> {
    let mut out = userinfo(text);
    out.extend(key_values(text));
    out.extend(flag_values(text));
    if let Some(re) = BEARER.as_ref() {
        out.extend(
            re.captures_iter(text)
                .filter_map(|c| c.name("v"))
                .map(|m| m.range()),
        );
    }
    out.extend(basic(text));
    out
}

/// `Basic <base64>` whose base64 decodes to `user:password` in printable text.
fn basic(text: &str) -> Vec<Range<usize>> {
    let Some(re) = BASIC.as_ref() else {
        return Vec::new();
    };
    re.captures_iter(text)
        .filter_map(|c| c.name("v"))
        .filter(|m| base64_text(m.as_str()).is_some_and(|t| t.contains(':')))
        .map(|m| m.range())
        .collect()
}

/// Standard base64 (padding optional) decoded, if it is printable UTF-8 text.
fn base64_text(s: &str) -> Option<String> {
    let digit = |c: u8| match c {
        b'A'..=b'Z' => Some(c - b'A'),
        b'a'..=b'z' => Some(c - b'a' + 26),
        b'0'..=b'9' => Some(c - b'0' + 52),
        b'+' => Some(62),
        b'/' => Some(63),
        _ => None,
    };
    let body = s.trim_end_matches('=');
    if body.len() % 4 == 1 {
        return None;
    }
    let mut bytes = Vec::with_capacity(body.len() * 3 / 4);
    let (mut acc, mut bits) = (0u32, 0u32);
    for c in body.bytes() {
        acc = (acc << 6) | u32::from(digit(c)?);
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            bytes.push((acc >> bits) as u8);
            acc &= (1 << bits) - 1;
        }
    }
    let t = String::from_utf8(bytes).ok()?;
    (!t.chars().any(char::is_control)).then_some(t)
}

fn userinfo(text: &str) -> Vec<Range<usize>> {
    let Some(re) = USERINFO.as_ref() else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for c in re.captures_iter(text) {
        let Some(ui) = c.name("ui") else { continue };
        match ui.as_str().find(':') {
            Some(i) if i + 1 < ui.len() => out.push(ui.start() + i + 1..ui.end()),
            Some(_) => {}
            None if ui.len() >= MIN_USERINFO_KEY => out.push(ui.range()),
            None => {}
        }
    }
    out
}

/// Scans with overlapping restarts: a non-secret match (`url=http://h/?token=X`) must not
/// swallow the secret pair inside its value.
fn key_values(text: &str) -> Vec<Range<usize>> {
    let Some(re) = KEY_VALUE.as_ref() else {
        return Vec::new();
    };
    let mut out = Vec::new();
    let mut pos = 0;
    while let Some(c) = re.captures_at(text, pos) {
        let key = c.name("qk").or(c.name("sk")).or(c.name("k"));
        let value = c.name("dq").or(c.name("sq")).or(c.name("bare"));
        let (Some(key), Some(value)) = (key, value) else {
            break;
        };
        // `/etc/passwd: not a recording` names a file, not a key: a bare key that ends a
        // path is not one.
        let ends_a_path = c.name("k").is_some() && text[..key.start()].ends_with('/');
        if is_secret_name(key.as_str()) && !ends_a_path {
            out.push(value.range());
            pos = value.end();
        } else {
            pos = key.end();
        }
    }
    out
}

fn flag_values(text: &str) -> Vec<Range<usize>> {
    let Some(re) = FLAG_VALUE.as_ref() else {
        return Vec::new();
    };
    let mut out = Vec::new();
    let mut pos = 0;
    while let Some(c) = re.captures_at(text, pos) {
        let (Some(k), Some(v)) = (c.name("k"), c.name("v")) else {
            break;
        };
        if is_secret_name(k.as_str()) {
            out.push(v.range());
        }
        // the value may itself be the next flag's whitespace: restart after the name
        pos = k.end();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hits(t: &str) -> Vec<&str> {
        let mut r = find(t);
        r.sort_by_key(|r| (r.start, r.end));
        r.dedup();
        r.into_iter().map(|r| &t[r]).collect()
    }

    #[test]
    fn patterns_compile() {
        assert!(USERINFO.is_some() && KEY_VALUE.is_some());
        assert!(FLAG_VALUE.is_some() && BEARER.is_some() && BASIC.is_some());
    }

    #[test]
    fn secrets_by_structure() {
        let cases: &[(&str, &[&str])] = &[
            ("http://h:1/v1?api_key=K1abc&x=2", &["K1abc"]),
            ("https://h/x?a=1&token=T0ken#f", &["T0ken"]),
            ("Authorization: Bearer abc.def-ghi", &["abc.def-ghi"]),
            ("-H 'Authorization: Basic dXNlcjpwYXNz'", &["dXNlcjpwYXNz"]),
            ("model.api_key=mk-secret", &["mk-secret"]),
            (r#"{"api_key": "J1", "model": "m"}"#, &["J1"]),
            (r#"{"auth":{"password":"p w"}}"#, &["p w"]),
            ("token: y4ml-value\nport: 1", &["y4ml-value"]),
            ("DB_PASS=hunter22 PORT=1", &["hunter22"]),
            (
                "https://abcdef0123456789@o1.ingest.example/1",
                &["abcdef0123456789"],
            ),
            ("postgres://u:pw@db/x", &["pw"]),
            ("python -m x --api-key sk1 --port 1", &["sk1"]),
            ("url=http://h/?token=inner", &["inner"]),
            ("curl -H x bearer 0123456789abcdef", &["0123456789abcdef"]),
            ("HDR=Basic dXNlcjpwYXNz", &["dXNlcjpwYXNz"]),
            ("x basic YTpi and Basic dTpw", &["YTpi", "dTpw"]),
            (r#"{"X-Up": "Basic c3ZjOnB3MTg="}"#, &["c3ZjOnB3MTg="]),
        ];
        for (text, want) in cases {
            assert_eq!(&hits(text), want, "{text}");
        }
    }

    #[test]
    fn ordinary_text_has_no_structure_secrets() {
        for plain in [
            "ftp://user@h",
            "ssh://git@github.com/org/repo",
            "http://h:1/x?a=b&max_tokens=5",
            "File \"auth.py\", line 42, in check",
            "/usr/lib/python3/auth.py:42",
            "--max-tokens 5 --port 30000 --model-path /m",
            "api_key=<redacted>",
            "postgres://u:<redacted>@db",
            "KeyError: 'x'",
            "/etc/passwd: not a wedgewatch recording",
            "open /run/secrets/token: permission denied",
            "MAX_TOKENS=128 TOKENIZERS_PARALLELISM=false",
            "basic settings apply",
            "Basic authentication required",
            "the basic functionality works",
            "basic dXNlcnBhc3M=",
        ] {
            assert!(hits(plain).is_empty(), "{plain}: {:?}", hits(plain));
        }
    }
}
