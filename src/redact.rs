//! Redaction of secrets in env and cmdlines.
//!
//! Names stay visible, values that look like secrets become `<redacted>`:
//! - environment variables whose name contains SECRET, PASSWORD, PASSWD, CREDENTIAL,
//!   COOKIE or PRIVATE, or has a word (between `_`, `-`, `.`) that is or ends in KEY, KEYS,
//!   TOKEN or AUTH, or starts with AUTH (any case). Word-wise, because counts are not
//!   secrets: `SGLANG_DECODE_PREALLOC_SPLIT_TOKENS` and `MAX_TOKENS` stay visible, so the
//!   very variable an incident turns on is never hidden, while `HF_TOKEN`, `OPENAI_API_KEY`,
//!   `APIKEY`, `AUTHORIZATION` are redacted;
//! - command-line options with such a word in their name (`--api-key X`, `--api-key=X`,
//!   `--hf-token X`, `--password=X`, ...);
//! - the password of `scheme://user:pass@host` anywhere in a value.
//!
//! Besides the structural pass, a [`Redactor`] remembers every secret value it removed and
//! scrubs them from any other text (raw files, Markdown), so a secret echoed somewhere
//! unexpected (a metrics label, a log line) does not leak either.

use crate::model::{ProcessFacts, REDACTED};
use std::collections::{BTreeMap, BTreeSet};

/// Substrings that make a name secret wherever they appear.
const SECRET_ANYWHERE: &[&str] = &[
    "SECRET",
    "PASSWORD",
    "PASSWD",
    "CREDENTIAL",
    "COOKIE",
    "PRIVATE",
];
/// Words that make a name secret when a word of the name is or ends with one of them.
const SECRET_WORD_ENDS: &[&str] = &["KEY", "KEYS", "TOKEN", "AUTH"];

/// Shortest value we scrub from free text: shorter ones (`1`, `on`) would shred unrelated
/// text and are not plausible secrets.
const MIN_SCRUB_LEN: usize = 4;

/// Whether a variable/option name looks like it holds a secret.
pub fn is_secret_name(name: &str) -> bool {
    let up = name.to_ascii_uppercase();
    if SECRET_ANYWHERE.iter().any(|w| up.contains(w)) {
        return true;
    }
    up.split(|c: char| !c.is_ascii_alphanumeric())
        .any(|word| word.starts_with("AUTH") || SECRET_WORD_ENDS.iter().any(|w| word.ends_with(w)))
}

/// Replaces the password of every `scheme://user:pass@host` in `value`. Returns the new
/// text and the passwords found.
pub fn redact_url_credentials(value: &str) -> (String, Vec<String>) {
    let mut out = String::with_capacity(value.len());
    let mut found = Vec::new();
    let mut rest = value;
    while let Some(i) = rest.find("://") {
        let (head, tail) = rest.split_at(i + 3);
        out.push_str(head);
        // authority ends at the first '/', '?', '#' or whitespace
        let end = tail
            .find(|c: char| c == '/' || c == '?' || c == '#' || c.is_whitespace())
            .unwrap_or(tail.len());
        let authority = &tail[..end];
        match authority.rfind('@') {
            Some(at) => {
                let userinfo = &authority[..at];
                match userinfo.split_once(':') {
                    Some((user, pass)) if !pass.is_empty() && pass != REDACTED => {
                        found.push(pass.to_string());
                        out.push_str(user);
                        out.push(':');
                        out.push_str(REDACTED);
                        out.push_str(&authority[at..]);
                    }
                    _ => out.push_str(authority),
                }
            }
            None => out.push_str(authority),
        }
        rest = &tail[end..];
    }
    out.push_str(rest);
    (out, found)
}

/// Collects secret values while redacting, then scrubs them from any text.
#[derive(Debug, Clone, Default)]
pub struct Redactor {
    secrets: BTreeSet<String>,
}

impl Redactor {
    pub fn new() -> Self {
        Redactor::default()
    }

    /// The secret values seen so far (for tests and `scrub`).
    pub fn secrets(&self) -> impl Iterator<Item = &str> {
        self.secrets.iter().map(String::as_str)
    }

    fn remember(&mut self, v: &str) {
        if v.len() >= MIN_SCRUB_LEN && v != REDACTED {
            self.secrets.insert(v.to_string());
        }
    }

    /// Redacts one value that is not itself secret (URL credentials only).
    pub fn value(&mut self, value: &str) -> String {
        let (out, found) = redact_url_credentials(value);
        for f in found {
            self.remember(&f);
        }
        out
    }

    /// Redacts an environment map in place.
    pub fn env(&mut self, env: &mut BTreeMap<String, String>) {
        for (k, v) in env.iter_mut() {
            if is_secret_name(k) {
                if !v.is_empty() {
                    self.remember(v);
                    *v = REDACTED.to_string();
                }
            } else {
                *v = self.value(v);
            }
        }
    }

    /// Redacts a command line: values of secret-named options and URL credentials.
    pub fn args(&mut self, args: &[String]) -> Vec<String> {
        let mut out = Vec::with_capacity(args.len());
        let mut redact_next = false;
        for a in args {
            if redact_next && !a.starts_with("--") {
                self.remember(a);
                out.push(REDACTED.to_string());
                redact_next = false;
                continue;
            }
            redact_next = false;
            if a.starts_with('-') {
                if let Some((name, v)) = a.split_once('=') {
                    if is_secret_name(name) {
                        self.remember(v);
                        out.push(format!("{name}={REDACTED}"));
                        continue;
                    }
                } else if is_secret_name(a) {
                    redact_next = true;
                    out.push(a.clone());
                    continue;
                }
            }
            out.push(self.value(a));
        }
        out
    }

    /// Redacts the env and cmdline of process facts in place.
    pub fn facts(&mut self, f: &mut ProcessFacts) {
        if let Some(env) = f.env.as_mut() {
            self.env(env);
        }
        if let Some(c) = f.cmdline.as_ref() {
            f.cmdline = Some(self.args(c));
        }
    }

    /// Learns the secrets of facts without changing them (to scrub other outputs).
    pub fn learn(&mut self, f: &ProcessFacts) {
        let mut copy = f.clone();
        self.facts(&mut copy);
    }

    /// Replaces every remembered secret value in `text`; longest first so a secret that
    /// contains another is removed whole.
    pub fn scrub(&self, text: &str) -> String {
        let mut secrets: Vec<&String> = self.secrets.iter().collect();
        secrets.sort_by_key(|s| std::cmp::Reverse(s.len()));
        let mut out = self.scrub_urls(text);
        for s in secrets {
            if out.contains(s.as_str()) {
                out = out.replace(s.as_str(), REDACTED);
            }
        }
        out
    }

    fn scrub_urls(&self, text: &str) -> String {
        redact_url_credentials(text).0
    }

    /// Scrubs every string inside a JSON value.
    pub fn scrub_json(&self, v: &mut serde_json::Value) {
        match v {
            serde_json::Value::String(s) => {
                let new = self.scrub(s);
                if new != *s {
                    *s = new;
                }
            }
            serde_json::Value::Array(a) => a.iter_mut().for_each(|x| self.scrub_json(x)),
            serde_json::Value::Object(o) => o.values_mut().for_each(|x| self.scrub_json(x)),
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(s: &str) -> Vec<String> {
        s.split_whitespace().map(str::to_string).collect()
    }

    #[test]
    fn env_names_decide() {
        let mut r = Redactor::new();
        let mut env: BTreeMap<String, String> = [
            ("HF_TOKEN", "hf_abcdef"),
            ("OPENAI_API_KEY", "sk-123456"),
            ("db_password", "hunter22"),
            ("SGLANG_PORT", "30000"),
            ("PROXY", "http://bob:s3cr3t@proxy:8080/"),
            ("EMPTY_SECRET", ""),
        ]
        .iter()
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect();
        r.env(&mut env);
        assert_eq!(env["HF_TOKEN"], REDACTED);
        assert_eq!(env["OPENAI_API_KEY"], REDACTED);
        assert_eq!(env["db_password"], REDACTED);
        assert_eq!(env["SGLANG_PORT"], "30000");
        assert_eq!(env["PROXY"], "http://bob:<redacted>@proxy:8080/");
        assert_eq!(env["EMPTY_SECRET"], "");
        let text = "token hf_abcdef and s3cr3t in a log";
        let s = r.scrub(text);
        assert!(!s.contains("hf_abcdef") && !s.contains("s3cr3t"), "{s}");
    }

    #[test]
    fn args_flags_decide() {
        let mut r = Redactor::new();
        let out = r.args(&v("python -m x --api-key sk-1 --api-key=sk-2 --token t0k3n --port 30000 --model-path /m --url http://u:pw12@h:1 --password"));
        assert_eq!(
            out,
            v("python -m x --api-key <redacted> --api-key=<redacted> --token <redacted> --port 30000 --model-path /m --url http://u:<redacted>@h:1 --password")
        );
        assert!(r.secrets().any(|s| s == "t0k3n"));
    }

    #[test]
    fn urls_without_password_untouched() {
        assert_eq!(
            redact_url_credentials("http://h:1/x?a=b").0,
            "http://h:1/x?a=b"
        );
        assert_eq!(redact_url_credentials("ftp://user@h").0, "ftp://user@h");
        assert_eq!(
            redact_url_credentials("a postgres://u:p@db/x b redis://:pw@r:6379").0,
            "a postgres://u:<redacted>@db/x b redis://:<redacted>@r:6379"
        );
    }
}

#[cfg(test)]
mod secret_name_tests {
    use super::is_secret_name;

    #[test]
    fn secrets_by_word_not_counts() {
        for secret in [
            "HF_TOKEN",
            "OPENAI_API_KEY",
            "api-key",
            "APIKEY",
            "AWS_SECRET_ACCESS_KEY",
            "DB_PASSWORD",
            "GOOGLE_APPLICATION_CREDENTIALS",
            "AUTHORIZATION",
            "PROXY_AUTH",
            "SSH_PRIVATE",
            "API_KEYS",
        ] {
            assert!(is_secret_name(secret), "{secret} must be redacted");
        }
        for plain in [
            "SGLANG_DECODE_PREALLOC_SPLIT_TOKENS",
            "MAX_TOKENS",
            "CUDA_VISIBLE_DEVICES",
            "TOKENIZERS_PARALLELISM",
            "SGLANG_TOKENIZER_PATH",
            "PWD",
            "KEYBOARD_LAYOUT",
        ] {
            assert!(!is_secret_name(plain), "{plain} must stay visible");
        }
    }
}
