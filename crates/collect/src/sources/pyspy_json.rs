//! `py-spy dump --json` output -> unclassified [`ThreadStack`]s.
//!
//! The bytes come from a child reading a possibly hostile target, so the parser is pure, never
//! panics, and keeps at most [`MAX_THREADS`] threads of [`MAX_FRAMES`] frames each.

use crate::error::Result;
use crate::model::ThreadState;
use crate::model::{Frame, ThreadStack};
use serde::de::{Deserializer, IgnoredAny, SeqAccess, Visitor};
use serde::Deserialize;
use std::marker::PhantomData;

/// Most threads kept from one dump (a scheduler has a few dozen).
pub const MAX_THREADS: usize = 4096;
/// Most frames kept per thread, innermost first (real stacks are under 200 deep).
pub const MAX_FRAMES: usize = 1024;

/// A JSON array of which only the first `N` elements are kept.
#[derive(Debug)]
struct Bounded<T, const N: usize>(Vec<T>);

impl<T, const N: usize> Default for Bounded<T, N> {
    fn default() -> Self {
        Bounded(Vec::new())
    }
}

impl<'de, T: Deserialize<'de>, const N: usize> Deserialize<'de> for Bounded<T, N> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct V<T, const N: usize>(PhantomData<T>);
        impl<'de, T: Deserialize<'de>, const N: usize> Visitor<'de> for V<T, N> {
            type Value = Bounded<T, N>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                write!(f, "an array")
            }
            fn visit_seq<A: SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> std::result::Result<Self::Value, A::Error> {
                let mut v = Vec::new();
                while v.len() < N {
                    match seq.next_element()? {
                        Some(x) => v.push(x),
                        None => return Ok(Bounded(v)),
                    }
                }
                while seq.next_element::<IgnoredAny>()?.is_some() {}
                Ok(Bounded(v))
            }
        }
        d.deserialize_seq(V::<T, N>(PhantomData))
    }
}

#[derive(Debug, Deserialize)]
struct PySpyThread {
    thread_name: Option<String>,
    os_thread_id: Option<i64>,
    #[serde(default)]
    active: bool,
    #[serde(default)]
    owns_gil: bool,
    #[serde(default)]
    frames: Bounded<PySpyFrame, MAX_FRAMES>,
}

#[derive(Debug, Deserialize)]
struct PySpyFrame {
    name: String,
    filename: String,
    #[serde(default)]
    line: i64,
}

/// Parses `py-spy dump --json` output into unclassified threads (state `unknown`).
pub fn parse_pyspy_json(text: &str) -> Result<Vec<ThreadStack>> {
    parse_dump(text.as_bytes())
}

/// Parses the bytes `py-spy dump --json` printed into unclassified threads (state
/// `unknown`), keeping at most [`MAX_THREADS`] x [`MAX_FRAMES`]. Pure and total over any
/// input (a fuzz target calls it): malformed JSON is an error, never a panic.
pub fn parse_dump(bytes: &[u8]) -> Result<Vec<ThreadStack>> {
    let threads: Bounded<PySpyThread, MAX_THREADS> = serde_json::from_slice(bytes)?;
    Ok(threads.0.into_iter().map(thread).collect())
}

fn thread(t: PySpyThread) -> ThreadStack {
    ThreadStack {
        tid: t
            .os_thread_id
            .and_then(|v| i32::try_from(v).ok())
            .unwrap_or(0),
        name: t.thread_name,
        active: t.active,
        owns_gil: t.owns_gil,
        frames: t
            .frames
            .0
            .into_iter()
            .map(|f| Frame {
                name: f.name,
                file: f.filename,
                line: u32::try_from(f.line).unwrap_or(0),
            })
            .collect(),
        state: ThreadState::Unknown,
        rule: None,
        decided_by: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn threads_and_frames_beyond_the_caps_are_dropped_not_kept() {
        let many = format!("[{}{{}}]", "{},".repeat(MAX_THREADS + 10));
        assert_eq!(parse_dump(many.as_bytes()).unwrap().len(), MAX_THREADS);
        let frame = r#"{"name":"f","filename":"a.py","line":1}"#;
        let frames = vec![frame; MAX_FRAMES + 5].join(",");
        let deep = format!(r#"[{{"os_thread_id":3,"frames":[{frames}]}}]"#);
        let t = parse_dump(deep.as_bytes()).unwrap();
        assert_eq!(t[0].frames.len(), MAX_FRAMES);
        // Still an error when the dropped part is malformed.
        let bad = format!("[{}{{]", "{},".repeat(MAX_THREADS));
        assert!(parse_dump(bad.as_bytes()).is_err());
    }
}
