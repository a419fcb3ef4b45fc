//! How much a snapshot may become once parsed: bytes alone do not bound it (a few bytes of
//! JSON become hundreds of bytes of tree). Before anything is built, one pass counts its
//! elements, objects and depth, allocating nothing, and refuses a text past a
//! [`ParseBudget`]. Readers of several snapshots share one budget. The limits, and the
//! largest real snapshot they leave room over: docs/security.md.

use serde::de::{DeserializeSeed, MapAccess, SeqAccess, Visitor};
use std::sync::atomic::{AtomicU64, Ordering};

/// Most elements (values and object keys) of everything parsed under one budget.
pub const MAX_ELEMENTS: u64 = 16_000_000;
/// Most objects: one holding a single key becomes hundreds of bytes once parsed (a map's
/// node is made for eleven), the largest growth a byte of JSON can have.
pub const MAX_OBJECTS: u64 = 500_000;
/// Deepest nesting of one snapshot (a real one is 7 deep; serde_json stops at 128).
pub const MAX_DEPTH: u32 = 32;

/// What snapshots read under it may still take; shared by the readers of one command.
#[derive(Debug, Default)]
pub struct ParseBudget {
    elements: AtomicU64,
    objects: AtomicU64,
}

/// Elements and objects counted in one text.
#[derive(Debug, Clone, Copy, Default)]
struct Tally {
    elements: u64,
    objects: u64,
}

impl ParseBudget {
    /// A fresh budget (one snapshot, or the inputs of one merge).
    pub fn new() -> ParseBudget {
        ParseBudget::default()
    }

    /// Counts `text` against the budget; the top-level `"schema"` string when there is
    /// one. Err: why it is refused (not JSON, or past a limit), in words.
    pub fn take(&self, text: &str) -> Result<Option<String>, Refused> {
        let room = Tally {
            elements: MAX_ELEMENTS.saturating_sub(self.elements.load(Ordering::Relaxed)),
            objects: MAX_OBJECTS.saturating_sub(self.objects.load(Ordering::Relaxed)),
        };
        let mut count = Counter {
            used: Tally::default(),
            room,
            schema: None,
        };
        let mut de = serde_json::Deserializer::from_str(text);
        Node {
            count: &mut count,
            depth: 0,
            schema: false,
        }
        .deserialize(&mut de)
        .and_then(|()| de.end())
        .map_err(Refused::from_json)?;
        self.charge(count.used)?;
        Ok(count.schema)
    }

    /// Adds what one text used; refused (and given back) when readers at the same time
    /// took the rest.
    fn charge(&self, used: Tally) -> Result<(), Refused> {
        let e = self.elements.fetch_add(used.elements, Ordering::Relaxed) + used.elements;
        let c = self.objects.fetch_add(used.objects, Ordering::Relaxed) + used.objects;
        if e <= MAX_ELEMENTS && c <= MAX_OBJECTS {
            return Ok(());
        }
        self.elements.fetch_sub(used.elements, Ordering::Relaxed);
        self.objects.fetch_sub(used.objects, Ordering::Relaxed);
        Err(Refused::TooBig(over_message(e > MAX_ELEMENTS)))
    }
}

/// Why a text is not parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refused {
    /// It ends early.
    Truncated(String),
    /// Not JSON.
    Invalid(String),
    /// Past a limit: more than a snapshot of wedgewatch's ever holds.
    TooBig(String),
}

impl Refused {
    fn from_json(e: serde_json::Error) -> Refused {
        let text = e.to_string();
        if let Some(why) = text.strip_prefix(LIMIT_MARK) {
            Refused::TooBig(why.to_string())
        } else if e.is_eof() {
            Refused::Truncated(text)
        } else {
            Refused::Invalid(text)
        }
    }
}

/// Starts the message of a limit reached inside the pass (told apart from a syntax error).
const LIMIT_MARK: &str = "limit: ";

fn over_message(elements: bool) -> String {
    if elements {
        format!("more than {MAX_ELEMENTS} JSON values and keys")
    } else {
        format!("more than {MAX_OBJECTS} JSON objects")
    }
}

struct Counter {
    used: Tally,
    room: Tally,
    schema: Option<String>,
}

impl Counter {
    fn element<E: serde::de::Error>(&mut self) -> Result<(), E> {
        self.used.elements += 1;
        if self.used.elements > self.room.elements {
            return Err(E::custom(format!("{LIMIT_MARK}{}", over_message(true))));
        }
        Ok(())
    }

    fn object<E: serde::de::Error>(&mut self, depth: u32) -> Result<(), E> {
        self.used.objects += 1;
        if self.used.objects > self.room.objects {
            return Err(E::custom(format!("{LIMIT_MARK}{}", over_message(false))));
        }
        self.container(depth)
    }

    fn container<E: serde::de::Error>(&mut self, depth: u32) -> Result<(), E> {
        self.element()?;
        if depth >= MAX_DEPTH {
            return Err(E::custom(format!(
                "{LIMIT_MARK}nested deeper than {MAX_DEPTH}"
            )));
        }
        Ok(())
    }
}

/// One value of the text, at `depth`: counted, its content visited, nothing kept but the
/// top-level schema (`schema`: this is its value).
struct Node<'c> {
    count: &'c mut Counter,
    depth: u32,
    schema: bool,
}

impl<'c> Node<'c> {
    fn child(&mut self, schema: bool) -> Node<'_> {
        Node {
            count: &mut *self.count,
            depth: self.depth + 1,
            schema,
        }
    }
}

impl<'de> DeserializeSeed<'de> for Node<'_> {
    type Value = ();
    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Node<'_> {
    type Value = ();

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E: serde::de::Error>(self, _: bool) -> Result<(), E> {
        self.count.element()
    }
    fn visit_i64<E: serde::de::Error>(self, _: i64) -> Result<(), E> {
        self.count.element()
    }
    fn visit_u64<E: serde::de::Error>(self, _: u64) -> Result<(), E> {
        self.count.element()
    }
    fn visit_f64<E: serde::de::Error>(self, _: f64) -> Result<(), E> {
        self.count.element()
    }
    fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<(), E> {
        if self.schema {
            self.count.schema = Some(v.to_string());
        }
        self.count.element()
    }
    fn visit_unit<E: serde::de::Error>(self) -> Result<(), E> {
        self.count.element()
    }

    fn visit_seq<A: SeqAccess<'de>>(mut self, mut seq: A) -> Result<(), A::Error> {
        self.count.container(self.depth)?;
        while seq.next_element_seed(self.child(false))?.is_some() {}
        Ok(())
    }

    fn visit_map<A: MapAccess<'de>>(mut self, mut map: A) -> Result<(), A::Error> {
        self.count.object(self.depth)?;
        while let Some(is_schema) = map.next_key_seed(Key)? {
            self.count.element()?;
            let top_schema = is_schema && self.depth == 0;
            map.next_value_seed(self.child(top_schema))?;
        }
        Ok(())
    }
}

/// An object's key, kept only as whether it is `schema`.
struct Key;

impl<'de> DeserializeSeed<'de> for Key {
    type Value = bool;
    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<bool, D::Error> {
        d.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for Key {
    type Value = bool;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a key")
    }

    fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<bool, E> {
        Ok(v == "schema")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_values_keys_and_objects_and_finds_the_schema() {
        let b = ParseBudget::new();
        let s = b
            .take(r#"{"schema": "x/1", "a": [1, {"b": null}], "c": "d"}"#)
            .unwrap();
        assert_eq!(s.as_deref(), Some("x/1"));
        // 2 objects, 1 array; values 1, null, "x/1", "d" and keys schema, a, b, c
        assert_eq!(b.objects.load(Ordering::Relaxed), 2);
        assert_eq!(b.elements.load(Ordering::Relaxed), 11);
        assert_eq!(b.take("[1, 2]").unwrap(), None);
        assert_eq!(b.elements.load(Ordering::Relaxed), 14);
    }

    #[test]
    fn refuses_past_the_limits_and_tells_truncated_from_invalid() {
        let deep = format!("{}{}", "[".repeat(40), "]".repeat(40));
        let b = ParseBudget::new();
        assert!(matches!(b.take(&deep), Err(Refused::TooBig(m)) if m.contains("deeper than 32")));
        assert!(matches!(b.take("[1, 2"), Err(Refused::Truncated(_))));
        assert!(matches!(b.take("[1, x]"), Err(Refused::Invalid(_))));
        assert!(matches!(b.take("[1] 2"), Err(Refused::Invalid(_))));
        // a budget already spent refuses the next text and keeps nothing of it
        b.elements.store(MAX_ELEMENTS - 2, Ordering::Relaxed);
        assert!(matches!(b.take("[1, 2, 3]"), Err(Refused::TooBig(m)) if m.contains("values")));
        assert_eq!(b.elements.load(Ordering::Relaxed), MAX_ELEMENTS - 2);
        assert!(b.take("[1]").is_ok());
    }
}
