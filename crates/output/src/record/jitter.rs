//! Time fields that moved by a clock tick, put back. A socket's "ms since last data" is stored
//! as an absolute time (`delta.rs`) so an idle connection stays the same, but the sample's
//! clock and the kernel's tick are not in step, so it moves by up to a tick with nothing
//! happening. A time within [`TICK_MS`] of the same field of the same element in the previous
//! sample is written as that sample's: only real moves are written, and the correlator's
//! reading differs by at most a tick.

use serde_json::Value;
use std::collections::BTreeMap;

/// Largest move of an absolute time that is taken for the kernel's tick (HZ=100), not an
/// event.
pub(super) const TICK_MS: i64 = 10;

/// Moves each of `fields` in `new` back to its value in `base` where they differ by at most
/// [`TICK_MS`]; elements of keyed arrays (sockets by address) are matched by key.
pub(super) fn snap(new: &mut Value, base: &Value, fields: &[&str]) {
    match (new, base) {
        (Value::Object(n), Value::Object(b)) => {
            for (k, v) in n.iter_mut() {
                let Some(old) = b.get(k) else { continue };
                if fields.contains(&k.as_str()) {
                    snap_number(v, old);
                } else {
                    snap(v, old, fields);
                }
            }
        }
        (Value::Array(n), Value::Array(b)) => snap_keyed(n, b, fields),
        _ => {}
    }
}

fn snap_number(v: &mut Value, old: &Value) {
    if let (Some(x), Some(o)) = (v.as_i64(), old.as_i64()) {
        if x != o && x.abs_diff(o) <= TICK_MS.unsigned_abs() {
            *v = old.clone();
        }
    }
}

/// Elements with the same key in both arrays (arrays without keys are left alone).
fn snap_keyed(n: &mut [Value], b: &[Value], fields: &[&str]) {
    let Some(first) = n.first() else { return };
    if super::delta::elem_key(first).is_none() {
        return;
    }
    let base: BTreeMap<String, &Value> = b
        .iter()
        .filter_map(|e| Some((super::delta::elem_key(e)?, e)))
        .collect();
    for e in n.iter_mut() {
        if let Some(old) = super::delta::elem_key(e).and_then(|k| base.get(&k)) {
            snap(e, old, fields);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const F: [&str; 1] = ["last_data_recv_ms"];

    fn sock(remote: &str, t: i64, bytes: u64) -> Value {
        json!({"local": "127.0.0.1:30000", "remote": remote, "netns": null,
               "tcp_info": {"last_data_recv_ms": t, "bytes_received": bytes}})
    }

    #[test]
    fn a_tick_of_jitter_is_put_back_a_real_move_is_kept() {
        let base = json!([sock("127.0.0.1:1", 1000, 5), sock("127.0.0.1:2", 1000, 5)]);
        // the second socket received data 500 ms later; the first only jittered
        let mut new = json!([sock("127.0.0.1:2", 1500, 9), sock("127.0.0.1:1", 1004, 5)]);
        snap(&mut new, &base, &F);
        assert_eq!(
            new,
            json!([sock("127.0.0.1:2", 1500, 9), sock("127.0.0.1:1", 1000, 5)])
        );
        // other fields and unknown elements are left alone
        let mut fresh = json!([sock("127.0.0.1:3", 1003, 1)]);
        snap(&mut fresh, &base, &F);
        assert_eq!(fresh, json!([sock("127.0.0.1:3", 1003, 1)]));
        let mut bytes = json!([sock("127.0.0.1:1", 1000, 6)]);
        snap(&mut bytes, &base, &F);
        assert_eq!(
            bytes,
            json!([sock("127.0.0.1:1", 1000, 6)]),
            "only the named fields"
        );
    }
}
