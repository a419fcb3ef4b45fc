//! The [`Redactor`]: walks values, removes secrets by name, structure and shape, learns every
//! value it removed, and scrubs those values from everything else in the same output.

use super::mask::MaskKey;
use super::names::{is_secret_field, is_secret_name};
use super::{shapes, structure};
use crate::model::{ProcessFacts, REDACTED};
use serde_json::Value;
use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::ops::Range;

/// Shortest value we scrub from free text: shorter ones (`1`, `on`) would shred unrelated
/// text. (Structural hits are replaced whatever their length.)
const MIN_SCRUB_LEN: usize = 4;
/// Bound on remembered values, so a long-running recorder cannot grow without limit.
const MAX_SECRETS: usize = 4096;
/// Bound on the cache of strings known clean.
const MAX_CLEAN: usize = 1 << 14;
/// Sibling fields of an object whose `key` names a secret (our own `Change` records).
const KEYED_VALUE_FIELDS: &[&str] = &["value", "before", "after"];

/// Collects secret values while redacting, then scrubs them from any text. Starts out
/// knowing the values wedgewatch itself holds ([`super::held`]).
#[derive(Clone)]
pub struct Redactor {
    secrets: BTreeSet<String>,
    /// The held values it started out knowing ([`super::held`]): scrubbed like the others,
    /// not reported as learned by [`Redactor::secrets`].
    held: BTreeSet<String>,
    /// Replace with a keyed mask instead of `<redacted>` (baselines, to stay comparable).
    mask: Option<&'static MaskKey>,
    /// Strings seen and found clean (a recorder sees the same ones every second). Emptied
    /// whenever a new secret is learned.
    clean: HashSet<String>,
}

impl std::fmt::Debug for Redactor {
    /// Never prints what it learned.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Redactor")
            .field("secrets", &self.secrets.len())
            .finish()
    }
}

impl Default for Redactor {
    fn default() -> Self {
        let held = super::held::held();
        Redactor {
            secrets: held
                .iter()
                .filter(|v| v.len() >= MIN_SCRUB_LEN && !is_placeholder(v))
                .cloned()
                .collect(),
            held,
            mask: None,
            clean: HashSet::new(),
        }
    }
}

/// Whether `s` is already one of our placeholders (`<redacted>`, `<redacted:..>`).
fn is_placeholder(s: &str) -> bool {
    s.starts_with("<redacted")
}

impl Redactor {
    pub fn new() -> Self {
        Redactor::default()
    }

    /// A redactor that replaces values with keyed masks (see [`super::mask`]); plain
    /// `<redacted>` when there is no key.
    pub fn masking(key: Option<&'static MaskKey>) -> Self {
        Redactor {
            mask: key,
            ..Redactor::default()
        }
    }

    /// The secret values learned so far from what it redacted (the held ones it started
    /// with left out).
    pub fn secrets(&self) -> impl Iterator<Item = &str> {
        self.secrets.difference(&self.held).map(String::as_str)
    }

    fn remember(&mut self, v: &str) {
        if v.len() >= MIN_SCRUB_LEN
            && !is_placeholder(v)
            && self.secrets.len() < MAX_SECRETS
            && self.secrets.insert(v.to_string())
        {
            self.clean.clear();
        }
    }

    fn replacement(&self, v: &str) -> String {
        match self.mask {
            Some(k) => k.mask(v),
            None => REDACTED.to_string(),
        }
    }

    /// A value known to be secret (by its name): remembered, replaced whole.
    fn secret(&mut self, v: &str) -> String {
        if v.is_empty() || is_placeholder(v) {
            return v.to_string();
        }
        self.remember(v);
        self.replacement(v)
    }

    /// Redacts one free-text value by structure and shape, then scrubs known secrets.
    pub fn text(&mut self, value: &str) -> String {
        self.text_cow(value).into_owned()
    }

    /// [`Redactor::text`], borrowing `value` back when nothing in it changes (most values).
    pub fn text_cow<'a>(&mut self, value: &'a str) -> Cow<'a, str> {
        if super::plain::cannot_reveal(value) {
            return self.scrub_cow(value);
        }
        if self.clean.contains(value) {
            return Cow::Borrowed(value);
        }
        let mut spans = structure::find(value);
        spans.extend(shapes::find(value));
        if spans.is_empty() {
            let out = self.scrub_cow(value);
            if matches!(out, Cow::Borrowed(_)) {
                if self.clean.len() >= MAX_CLEAN {
                    self.clean.clear();
                }
                self.clean.insert(value.to_string());
            }
            return out;
        }
        let spans = merge(spans);
        let mut out = String::with_capacity(value.len());
        let mut at = 0;
        for r in spans {
            let s = &value[r.clone()];
            out.push_str(&value[at..r.start]);
            if is_placeholder(s) {
                out.push_str(s);
            } else {
                self.remember(s);
                out.push_str(&self.replacement(s));
            }
            at = r.end;
        }
        out.push_str(&value[at..]);
        Cow::Owned(self.scrub(&out))
    }

    /// `*s` redacted in place ([`Redactor::text`]); untouched (no copy) when clean.
    pub fn text_in_place(&mut self, s: &mut String) {
        if let Cow::Owned(new) = self.text_cow(s) {
            *s = new;
        }
    }

    /// Redacts an environment map in place.
    pub fn env(&mut self, env: &mut BTreeMap<String, String>) {
        for (k, v) in env.iter_mut() {
            *v = if is_secret_name(k) {
                self.secret(v)
            } else {
                self.text(v)
            };
        }
    }

    /// Redacts a command line: values of secret-named options (`--api-key X`,
    /// `--api-key=X`), the word after `Bearer`, and each argument as free text.
    pub fn args<S: AsRef<str>>(&mut self, args: &[S]) -> Vec<String> {
        let mut out = Vec::with_capacity(args.len());
        let mut redact_next = false;
        for a in args {
            let a = a.as_ref();
            if redact_next && !a.starts_with("--") {
                redact_next = false;
                out.push(self.secret(a));
                continue;
            }
            redact_next = false;
            if a.starts_with('-') {
                if let Some((name, v)) = a.split_once('=') {
                    if is_secret_name(name) {
                        let v = self.secret(v);
                        out.push(format!("{name}={v}"));
                        continue;
                    }
                } else if is_secret_name(a) {
                    redact_next = true;
                    out.push(a.to_string());
                    continue;
                }
            }
            // `Bearer` `TOKEN`, `Authorization: Basic` `B64` split over two arguments
            let last = a.split_whitespace().last().unwrap_or("");
            redact_next = last.eq_ignore_ascii_case("bearer") || last.eq_ignore_ascii_case("basic");
            out.push(self.text(a));
        }
        out
    }

    /// Redacts the env, cmdline, names and threads of process facts in place.
    pub fn facts(&mut self, f: &mut ProcessFacts) {
        if let Some(env) = f.env.as_mut() {
            self.env(env);
        }
        if let Some(c) = f.cmdline.as_ref() {
            f.cmdline = Some(self.args(c));
        }
        for s in [f.comm.as_mut(), f.exe.as_mut()].into_iter().flatten() {
            *s = self.text(s);
        }
        for t in f.threads.iter_mut().flatten() {
            t.name = self.text(&t.name);
        }
    }

    /// Learns the secrets of facts without changing them (to scrub other outputs).
    pub fn learn(&mut self, f: &ProcessFacts) {
        let mut copy = f.clone();
        self.facts(&mut copy);
    }

    /// Learns the secrets of a JSON tree without changing it: what [`Redactor::redact_json`]
    /// would remove, read in place (no copy of the tree).
    pub fn learn_json(&mut self, v: &Value) {
        match v {
            Value::String(s) => {
                self.text_cow(s);
            }
            Value::Array(a) => match strings_of(a) {
                Some(words) => {
                    self.args(&words);
                }
                None => a.iter().for_each(|x| self.learn_json(x)),
            },
            Value::Object(o) => {
                let keyed_secret = is_keyed_secret(o);
                for (k, x) in o {
                    match x {
                        Value::String(s) if by_key(k, keyed_secret) => {
                            self.secret(s);
                        }
                        _ => self.learn_json(x),
                    }
                }
            }
            _ => {}
        }
    }

    /// Redacts a JSON tree: by key name, structure and shape, then scrubs every value
    /// learned so far (from this tree or earlier ones) from all of it.
    pub fn redact_json(&mut self, v: &mut Value) {
        let known = self.secrets.len();
        self.walk(v);
        // Values learned during this walk still have to go from strings visited before.
        if self.secrets.len() != known {
            self.scrub_json(v);
        }
    }

    /// Redacts a serialisable value through its JSON form. `None` when the redacted form no
    /// longer deserialises (callers then drop the value rather than emit it unredacted).
    pub fn redact_typed<T>(&mut self, t: &T) -> Option<T>
    where
        T: serde::Serialize + serde::de::DeserializeOwned,
    {
        let mut v = serde_json::to_value(t).ok()?;
        self.redact_json(&mut v);
        serde_json::from_value(v).ok()
    }

    fn walk(&mut self, v: &mut Value) {
        match v {
            Value::String(s) => self.text_in_place(s),
            Value::Array(a) => self.walk_array(a),
            Value::Object(o) => {
                let keyed_secret = is_keyed_secret(o);
                for (k, x) in o.iter_mut() {
                    match x {
                        Value::String(s) if by_key(k, keyed_secret) => *s = self.secret(s),
                        _ => self.walk(x),
                    }
                }
            }
            _ => {}
        }
    }

    /// An array of strings may be a command line: flags give context to the next element.
    fn walk_array(&mut self, a: &mut [Value]) {
        let Some(words) = strings_of(a) else {
            a.iter_mut().for_each(|x| self.walk(x));
            return;
        };
        let redacted = self.args(&words);
        for (x, w) in a.iter_mut().zip(redacted) {
            if x.as_str() != Some(w.as_str()) {
                *x = Value::String(w);
            }
        }
    }

    /// Replaces every remembered secret value in `text`; longest first so a secret that
    /// contains another is removed whole.
    pub fn scrub(&self, text: &str) -> String {
        self.scrub_cow(text).into_owned()
    }

    /// [`Redactor::scrub`], borrowing `text` back when it holds no remembered value.
    fn scrub_cow<'a>(&self, text: &'a str) -> Cow<'a, str> {
        if !self.secrets.iter().any(|s| text.contains(s.as_str())) {
            return Cow::Borrowed(text);
        }
        let mut secrets: Vec<&String> = self.secrets.iter().collect();
        secrets.sort_by_key(|s| std::cmp::Reverse(s.len()));
        let mut out = text.to_string();
        for s in secrets {
            if out.contains(s.as_str()) {
                out = out.replace(s.as_str(), &self.replacement(s));
            }
        }
        Cow::Owned(out)
    }

    /// Scrubs every remembered value from every string inside a JSON value.
    pub fn scrub_json(&self, v: &mut Value) {
        if self.secrets.is_empty() {
            return;
        }
        match v {
            Value::String(s) => {
                if let Cow::Owned(new) = self.scrub_cow(s) {
                    *s = new;
                }
            }
            Value::Array(a) => a.iter_mut().for_each(|x| self.scrub_json(x)),
            Value::Object(o) => o.values_mut().for_each(|x| self.scrub_json(x)),
            _ => {}
        }
    }
}

/// The strings of an array made of strings only, and not empty (maybe a command line).
fn strings_of(a: &[Value]) -> Option<Vec<&str>> {
    let words: Option<Vec<&str>> = a.iter().map(Value::as_str).collect();
    words.filter(|w| !w.is_empty())
}

/// Whether an object's `key` names a secret (our own `Change` records): then its
/// [`KEYED_VALUE_FIELDS`] are secret too.
fn is_keyed_secret(o: &serde_json::Map<String, Value>) -> bool {
    o.get("key")
        .and_then(Value::as_str)
        .is_some_and(is_secret_name)
}

/// Whether the string under key `k` is secret by its key alone.
fn by_key(k: &str, keyed_secret: bool) -> bool {
    is_secret_field(k) || (keyed_secret && KEYED_VALUE_FIELDS.contains(&k))
}

/// Sorted, non-overlapping ranges covering all of `spans`.
fn merge(mut spans: Vec<Range<usize>>) -> Vec<Range<usize>> {
    spans.sort_by_key(|r| r.start);
    let mut out: Vec<Range<usize>> = Vec::with_capacity(spans.len());
    for r in spans {
        match out.last_mut() {
            Some(last) if r.start <= last.end => last.end = last.end.max(r.end),
            _ => out.push(r),
        }
    }
    out
}

#[cfg(test)]
mod tests;
