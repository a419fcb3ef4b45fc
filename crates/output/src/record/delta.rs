//! Compact sample encoding: keyframes and deltas.
//!
//! A `delta` record carries only what changed against the previous sample of the same kind,
//! as a JSON patch; every `KEYFRAME_EVERY` samples, and at each segment's start, a keyframe
//! carries it whole. Each record holds the CRC of the full reconstructed sample, so a reader
//! that lost a record waits for the next keyframe rather than patch the wrong base. "ms since"
//! fields are stored as absolute times so an idle connection is byte-for-byte unchanged.

use super::{crc32_json, Record};
use crate::clock::Millis;
use crate::error::Result;
use crate::model::Sample;
use serde_json::{json, Map, Value};
use std::collections::{BTreeMap, BTreeSet};

/// Sets and maps of a delta's element keys, for membership only (never iterated): a socket
/// table's keys share a long prefix, which a tree compares byte by byte at every level.
type KeySet<'a> = std::collections::HashSet<&'a String, foldhash::fast::RandomState>;
type KeyIndex<'a, V> = std::collections::HashMap<&'a String, V, foldhash::fast::RandomState>;

/// A keyframe at least this often per source kind.
pub const KEYFRAME_EVERY: u32 = 120;
const RELATIVE_MS_FIELDS: [&str; 3] =
    ["last_data_sent_ms", "last_data_recv_ms", "last_ack_recv_ms"];

/// Rewrites "ms ago" fields to absolute times (`to_abs`) or back.
/// (`abs = t - ago` and `ago = t - abs`: the same map both ways; wrapping, so hostile
/// values in a recording cannot overflow, and still its own inverse.)
fn rebase_times(v: &mut serde_json::Value, t_ms: Millis) {
    match v {
        serde_json::Value::Object(o) => {
            for (k, x) in o.iter_mut() {
                if RELATIVE_MS_FIELDS.contains(&k.as_str()) {
                    if let Some(n) = x.as_i64() {
                        *x = serde_json::Value::from(t_ms.wrapping_sub(n));
                    }
                } else {
                    rebase_times(x, t_ms);
                }
            }
        }
        serde_json::Value::Array(a) => a.iter_mut().for_each(|x| rebase_times(x, t_ms)),
        _ => {}
    }
}

/// Identity of an array element, for keyed array diffs.
pub(super) fn elem_key(v: &serde_json::Value) -> Option<String> {
    let o = v.as_object()?;
    if let (Some(l), Some(r)) = (o.get("local"), o.get("remote")) {
        return Some(format!(
            "s|{l}|{r}|{}",
            o.get("netns").unwrap_or(&serde_json::Value::Null)
        ));
    }
    if let (Some(n), Some(l)) = (o.get("name"), o.get("labels")) {
        return Some(format!("m|{n}|{l}"));
    }
    for k in ["tid", "pid", "component", "index"] {
        if let Some(x) = o.get(k) {
            return Some(format!("{k}|{x}"));
        }
    }
    None
}

fn keyed(a: &[serde_json::Value]) -> Option<Vec<String>> {
    let keys: Option<Vec<String>> = a.iter().map(elem_key).collect();
    let keys = keys?;
    let uniq: KeySet = keys.iter().collect();
    (uniq.len() == keys.len()).then_some(keys)
}

/// The patch turning `old` into `new`, or None if equal.
pub fn diff_json(old: &Value, new: &Value) -> Option<Value> {
    if old == new {
        return None;
    }
    match (old, new) {
        (Value::Object(a), Value::Object(b)) => Some(diff_objects(a, b)),
        (Value::Array(a), Value::Array(b)) => match (keyed(a), keyed(b)) {
            (Some(ka), Some(kb)) => Some(diff_keyed(a, &ka, b, &kb)),
            // Unkeyed (or duplicate keys, e.g. three stack dumps of one pid per window).
            _ => Some(diff_unkeyed(a, b, new)),
        },
        _ => Some(json!({ "$v": new })),
    }
}

/// `{"$p": {key: patch}, "$d": [removed keys]}`; an added key's patch is `{"$v": value}`.
fn diff_objects(a: &Map<String, Value>, b: &Map<String, Value>) -> Value {
    let mut p = Map::new();
    for (k, vb) in b {
        match a.get(k) {
            Some(va) => {
                if let Some(n) = diff_json(va, vb) {
                    p.insert(k.clone(), n);
                }
            }
            None => {
                p.insert(k.clone(), json!({ "$v": vb }));
            }
        }
    }
    let d: Vec<&String> = a.keys().filter(|k| !b.contains_key(*k)).collect();
    let mut node = Map::new();
    node.insert("$p".into(), Value::Object(p));
    if !d.is_empty() {
        node.insert("$d".into(), json!(d));
    }
    Value::Object(node)
}

/// Element by element (`{"$i": [[index, patch], ...]}`) when the length is the same (the
/// common case), whole otherwise.
fn diff_unkeyed(a: &[Value], b: &[Value], new: &Value) -> Value {
    if a.len() == b.len() {
        let at: Vec<Value> = a
            .iter()
            .zip(b)
            .enumerate()
            .filter_map(|(i, (ea, eb))| diff_json(ea, eb).map(|n| json!([i, n])))
            .collect();
        let whole = serde_json::to_vec(new).map_or(0, |v| v.len());
        let patch = serde_json::to_vec(&at).map_or(usize::MAX, |v| v.len());
        if patch < whole {
            return json!({ "$i": at });
        }
    }
    json!({ "$v": new })
}

/// A list of keyed elements (`ka`, `kb` their keys): `{"$k":1}` with updated (`$u`), added
/// (`$n`) and removed (`$r`) elements, and where the order changed, `$a` or `$o`.
fn diff_keyed(a: &[Value], ka: &[String], b: &[Value], kb: &[String]) -> Value {
    let index: KeyIndex<&Value> = ka.iter().zip(a.iter()).collect();
    let mut upd = Vec::new();
    let mut added = Vec::new();
    for (k, eb) in kb.iter().zip(b.iter()) {
        match index.get(k) {
            Some(ea) => {
                if let Some(n) = diff_json(ea, eb) {
                    upd.push(json!({ "k": k, "n": n }));
                }
            }
            None => added.push(eb.clone()),
        }
    }
    let kb_set: KeySet = kb.iter().collect();
    let removed: Vec<&String> = ka.iter().filter(|k| !kb_set.contains(k)).collect();
    let mut node = Map::new();
    node.insert("$k".into(), json!(1));
    if !upd.is_empty() {
        node.insert("$u".into(), Value::Array(upd));
    }
    if !added.is_empty() {
        node.insert("$n".into(), Value::Array(added));
    }
    if !removed.is_empty() {
        node.insert("$r".into(), json!(removed));
    }
    if let Some((k, v)) = keyed_order(ka, kb) {
        node.insert(k.into(), v);
    }
    Value::Object(node)
}

/// How to restore `kb`'s order after applying, when the default (old order minus removed,
/// then the added ones) is not it: `$a` or `$o`.
fn keyed_order(ka: &[String], kb: &[String]) -> Option<(&'static str, Value)> {
    let kb_set: KeySet = kb.iter().collect();
    let ka_set: KeySet = ka.iter().collect();
    let mut order: Vec<&String> = ka.iter().filter(|k| kb_set.contains(k)).collect();
    order.extend(kb.iter().filter(|k| !ka_set.contains(k)));
    if order == kb.iter().collect::<Vec<_>>() {
        return None;
    }
    // The common case: the kept elements are in their old order and new ones landed in
    // between (a new connection in a socket table). Then the new elements' positions say
    // it all; a full key list ($o) only otherwise.
    let kept_new: Vec<&String> = kb.iter().filter(|k| ka_set.contains(k)).collect();
    let kept_old: Vec<&String> = ka.iter().filter(|k| kb_set.contains(k)).collect();
    if kept_new == kept_old {
        let at: Vec<usize> = kb
            .iter()
            .enumerate()
            .filter(|(_, k)| !ka_set.contains(k))
            .map(|(i, _)| i)
            .collect();
        Some(("$a", json!(at)))
    } else {
        Some(("$o", json!(kb)))
    }
}

/// The patch saying "no change", fitting the data's shape: `{"$p":{}}` alone does not apply to
/// a list.
fn unchanged(state: &Value) -> Value {
    match state {
        Value::Object(_) => json!({ "$p": {} }),
        Value::Array(_) => json!({ "$i": [] }),
        other => json!({ "$v": other }),
    }
}

/// Applies a patch from [`diff_json`]; None if it does not fit the base.
pub fn apply_json(base: &Value, node: &Value) -> Option<Value> {
    let n = node.as_object()?;
    if let Some(v) = n.get("$v") {
        return Some(v.clone());
    }
    if let Some(at) = n.get("$i").and_then(Value::as_array) {
        return apply_indexed(base, at);
    }
    if let Some(p) = n.get("$p").and_then(Value::as_object) {
        return apply_object(base, n, p);
    }
    if n.contains_key("$k") {
        return apply_keyed(base, n);
    }
    None
}

/// `$i`: `[index, patch]` pairs, indices going up.
fn apply_indexed(base: &Value, at: &[Value]) -> Option<Value> {
    let mut a = base.as_array()?.clone();
    let mut next = 0; // positions only go up: each element patched at most once
    for pair in at {
        let i = usize::try_from(pair.get(0)?.as_u64()?).ok()?;
        if i < next {
            return None;
        }
        next = i + 1;
        let slot = a.get_mut(i)?;
        *slot = apply_json(slot, pair.get(1)?)?;
    }
    Some(Value::Array(a))
}

/// `$p` (patches by key) and `$d` (removed keys) of an object.
fn apply_object(base: &Value, n: &Map<String, Value>, p: &Map<String, Value>) -> Option<Value> {
    if p.is_empty() && !n.contains_key("$d") {
        // "No change", as older writers wrote it for data of any shape.
        return Some(base.clone());
    }
    let mut o = base.as_object()?.clone();
    for (k, sub) in p {
        let cur = o.get(k).cloned().unwrap_or(Value::Null);
        o.insert(k.clone(), apply_json(&cur, sub)?);
    }
    for d in n.get("$d").and_then(Value::as_array).into_iter().flatten() {
        o.remove(d.as_str()?);
    }
    Some(Value::Object(o))
}

/// `$k`: a keyed list's removed, updated and added elements, then its order (`$a`, `$o`).
fn apply_keyed(base: &Value, n: &Map<String, Value>) -> Option<Value> {
    let a = base.as_array()?;
    let keys = keyed(a)?;
    let mut elems: Vec<(String, Value)> = keys.into_iter().zip(a.iter().cloned()).collect();
    let removed: BTreeSet<&str> = n
        .get("$r")
        .and_then(Value::as_array)
        .map(|r| r.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    elems.retain(|(k, _)| !removed.contains(k.as_str()));
    // Indexed, and each element updated at most once: a patch from a stranger may
    // name every element of a big table, or one big element many times.
    let mut index: BTreeMap<String, Option<usize>> = elems
        .iter()
        .enumerate()
        .map(|(i, (k, _))| (k.clone(), Some(i)))
        .collect();
    for u in n.get("$u").and_then(Value::as_array).into_iter().flatten() {
        let i = index.get_mut(u.get("k")?.as_str()?)?.take()?;
        let slot = elems.get_mut(i)?;
        slot.1 = apply_json(&slot.1, u.get("n")?)?;
    }
    for e in n.get("$n").and_then(Value::as_array).into_iter().flatten() {
        elems.push((elem_key(e)?, e.clone()));
    }
    if let Some(at) = n.get("$a").and_then(Value::as_array) {
        let added = n.get("$n").and_then(Value::as_array).map_or(0, Vec::len);
        return place_added(elems, added, at);
    }
    if let Some(order) = n.get("$o").and_then(Value::as_array) {
        let mut by: BTreeMap<String, Value> = elems.into_iter().collect();
        let mut out = Vec::new();
        for k in order {
            out.push(by.remove(k.as_str()?)?);
        }
        return Some(Value::Array(out));
    }
    Some(Value::Array(elems.into_iter().map(|(_, v)| v).collect()))
}

/// `$a`: `elems` is kept (old order) then the `added` ones; puts those at their places.
fn place_added(mut elems: Vec<(String, Value)>, added: usize, at: &[Value]) -> Option<Value> {
    let split = elems.len().checked_sub(added)?;
    let new_ones = elems.split_off(split);
    if at.len() != new_ones.len() {
        return None;
    }
    let mut out: Vec<Value> = Vec::with_capacity(elems.len() + new_ones.len());
    let mut kept = elems.into_iter().map(|(_, v)| v);
    for ((_, v), pos) in new_ones.into_iter().zip(at) {
        let pos = usize::try_from(pos.as_u64()?).ok()?;
        while out.len() < pos {
            out.push(kept.next()?);
        }
        out.push(v);
    }
    out.extend(kept);
    Some(Value::Array(out))
}

/// Per-kind state of the delta encoder / decoder.
#[derive(Debug, Default, Clone)]
pub struct DeltaState {
    bases: BTreeMap<crate::model::SourceKind, (serde_json::Value, u32)>,
}

impl DeltaState {
    pub fn reset(&mut self) {
        self.bases.clear();
    }

    /// Encodes a sample as a keyframe or a delta record (`every_ms`: the cadence in force,
    /// carried as is).
    pub fn encode(&mut self, s: &Sample, every_ms: Option<i64>) -> Result<Record> {
        let mut full = serde_json::to_value(&s.payload)?;
        let mut state = full
            .get_mut("data")
            .map(serde_json::Value::take)
            .unwrap_or_default();
        rebase_times(&mut state, s.t_ms);
        let kind = s.kind();
        if let Some((base, _)) = self.bases.get(&kind) {
            super::jitter::snap(&mut state, base, &RELATIVE_MS_FIELDS);
        }
        let crc = crc32_json(&state)?;
        let (key, data, count) = match self.bases.get(&kind) {
            Some((base, n)) if *n < KEYFRAME_EVERY => {
                let patch = diff_json(base, &state).unwrap_or_else(|| unchanged(&state));
                (false, patch, n + 1)
            }
            _ => (true, state.clone(), 0),
        };
        self.bases.insert(kind, (state, count));
        Ok(Record::Delta {
            t_ms: s.t_ms,
            kind,
            status: s.status.clone(),
            took_ms: s.took_ms,
            key,
            crc,
            data,
            every_ms,
        })
    }

    /// Decodes a delta record back into a sample; None if its base is missing or the
    /// result fails its CRC (a record was lost): wait for the next keyframe. Takes the
    /// record and never copies its data (a stranger's may be as big as the line cap).
    pub fn decode(&mut self, r: Record) -> Option<Sample> {
        let Record::Delta {
            t_ms,
            kind,
            status,
            took_ms,
            key,
            crc,
            data,
            ..
        } = r
        else {
            return None;
        };
        let state = if key {
            data
        } else {
            let (base, patch) = (&self.bases.get(&kind)?.0, data);
            apply_json(base, &patch)?
        };
        let ok = crc32_json(&state).is_ok_and(|c| c == crc);
        if !ok {
            self.bases.remove(&kind);
            return None;
        }
        let (payload, state) = payload_of(kind, state, t_ms);
        self.bases.insert(kind, (state, 0));
        Some(Sample {
            t_ms,
            status,
            took_ms,
            payload: payload?,
        })
    }
}

/// The payload a decoded state stands for, and the state back (unchanged, to be the next
/// base): times are rebased in place and back rather than on a copy.
fn payload_of(
    kind: crate::model::SourceKind,
    state: serde_json::Value,
    t_ms: Millis,
) -> (Option<crate::model::Payload>, serde_json::Value) {
    use serde::Deserialize;
    let mut tagged = serde_json::json!({ "source": kind, "data": state });
    if let Some(d) = tagged.get_mut("data") {
        rebase_times(d, t_ms);
    }
    let payload = crate::model::Payload::deserialize(&tagged).ok();
    let mut state = tagged
        .get_mut("data")
        .map(serde_json::Value::take)
        .unwrap_or_default();
    rebase_times(&mut state, t_ms);
    (payload, state)
}

#[cfg(test)]
mod delta_tests {
    use super::{apply_json, diff_json, DeltaState};
    use crate::model::{Payload, Sample, SourceStatus};
    use serde_json::json;

    fn sample(t_ms: i64, payload: Payload) -> Sample {
        Sample {
            t_ms,
            status: SourceStatus::ok(),
            took_ms: 1,
            payload,
        }
    }

    #[test]
    fn an_unchanged_sample_whose_data_is_a_list_replays() {
        // An idle host: no components, so processes and metrics are `[]` on every sample.
        let (mut enc, mut dec) = (DeltaState::default(), DeltaState::default());
        for payload in [Payload::Processes(vec![]), Payload::Metrics(vec![])] {
            for t in 0..3 {
                let s = sample(t * 1000, payload.clone());
                let rec = enc.encode(&s, None).expect("encode");
                if let (t @ 1.., super::Record::Delta { data, .. }) = (t, &rec) {
                    assert_eq!(data, &json!({"$i": []}), "sample {t}");
                }
                assert_eq!(dec.decode(rec.clone()), Some(s), "{rec:?}");
            }
        }
    }

    #[test]
    fn a_patch_touching_every_element_of_a_big_table_applies_in_linear_time() {
        let row = |i: usize, v: usize| json!({"pid": i, "v": v});
        let n = 50_000;
        let old = json!((0..n).map(|i| row(i, 0)).collect::<Vec<_>>());
        let new = json!((0..n).map(|i| row(i, 1)).collect::<Vec<_>>());
        let patch = diff_json(&old, &new).expect("differ");
        let start = std::time::Instant::now();
        assert_eq!(apply_json(&old, &patch), Some(new));
        assert!(start.elapsed() < std::time::Duration::from_secs(20));
        // One element named twice (never written so) is refused, not applied twice.
        let twice = json!({"$k": 1, "$u": [{"k": "pid|1", "n": {"$v": 1}}, {"k": "pid|1", "n": {"$v": 2}}]});
        assert_eq!(apply_json(&old, &twice), None);
        let twice = json!({"$i": [[1, {"$v": 1}], [1, {"$v": 2}]]});
        assert_eq!(apply_json(&json!([0, 0]), &twice), None);
    }

    #[test]
    fn recordings_written_before_the_list_fix_still_replay() {
        // Their "unchanged" patch was `{"$p":{}}` whatever the data was.
        assert_eq!(
            apply_json(&json!([1]), &json!({"$p": {}})),
            Some(json!([1]))
        );
        assert_eq!(
            apply_json(&json!(null), &json!({"$p": {}})),
            Some(json!(null))
        );
        assert_eq!(
            apply_json(&json!([1]), &json!({"$p": {"a": {"$v": 1}}})),
            None
        );
    }

    fn round_trip(old: serde_json::Value, new: serde_json::Value) -> serde_json::Value {
        let patch = diff_json(&old, &new).expect("they differ");
        assert_eq!(apply_json(&old, &patch), Some(new), "patch {patch}");
        patch
    }

    #[test]
    fn duplicate_keys_are_diffed_by_position() {
        // Three dumps of one pid per window: the same key three times.
        let dump = |t: i64, line: i64| json!({"pid": 7, "t_ms": t, "frames": [{"line": line}]});
        let old = json!([dump(1, 10), dump(2, 10), dump(3, 10)]);
        let new = json!([dump(4, 10), dump(5, 11), dump(6, 10)]);
        let patch = round_trip(old, new);
        assert!(patch.get("$i").is_some(), "{patch}");
        assert!(
            !patch.to_string().contains("frames\":[{"),
            "only what changed: {patch}"
        );
        // A different length is written whole.
        let patch = round_trip(json!([dump(1, 1)]), json!([dump(1, 1), dump(1, 1)]));
        assert!(patch.get("$v").is_some(), "{patch}");
    }

    #[test]
    fn new_elements_in_the_middle_carry_positions_not_the_whole_order() {
        let s = |l: &str| json!({"local": l, "remote": "r", "state": "ESTABLISHED"});
        let old = json!([s("a"), s("c"), s("e"), s("g")]);
        let new = json!([s("a"), s("b"), s("c"), s("g"), s("h"), s("d0")]);
        let patch = round_trip(old.clone(), new);
        assert_eq!(patch["$a"], json!([1, 4, 5]), "{patch}");
        assert!(patch.get("$o").is_none(), "{patch}");
        // Kept elements reordered: the full order is still written, and still right.
        let patch = round_trip(old, json!([s("c"), s("a"), s("x")]));
        assert!(patch.get("$o").is_some(), "{patch}");
    }
}
