//! Versions and the relevant environment, copied into the snapshot from what discovery and
//! the GPU source read (nothing here reads the host: a replayed snapshot shows the
//! incident's host, not this one).

use crate::model::{Snapshot, SnapshotParts};
use regex::Regex;

/// The key of a component's versions that is a fact of the host, not of the component:
/// lifted to the snapshot's `versions`.
const KERNEL: &str = "kernel";

/// Fills `versions` (host and per component) and each component's `relevant_env` names.
pub(super) fn fill(s: &mut Snapshot, parts: &SnapshotParts) {
    if let Some(v) = s.tool.get("version") {
        s.versions.insert("wedgewatch".into(), v.clone());
    }
    for c in &parts.topology.components {
        let Some(sc) = s.components.iter_mut().find(|x| x.id == c.id) else {
            continue;
        };
        let mut versions = c.versions.clone();
        if let Some(k) = versions.remove(KERNEL) {
            s.versions.entry(KERNEL.into()).or_insert(k);
        }
        sc.versions = versions;
        sc.relevant_env = relevant(&c.relevant_env, sc.env.keys());
    }
    let gpu = parts.raw.get("gpu");
    let field = |k: &str| gpu.and_then(|g| g.get(k)).and_then(|v| v.as_str());
    if let Some(d) = field("driver_version") {
        s.versions.insert("nvidia_driver".into(), d.to_string());
    }
    if let Some(c) = field("cuda_version") {
        s.versions.insert("cuda".into(), c.to_string());
    }
}

/// The names matching any of the patterns (regexes, checked when the probes were loaded;
/// one that does not compile here matches nothing).
fn relevant<'a>(patterns: &[String], names: impl Iterator<Item = &'a String>) -> Vec<String> {
    let res: Vec<Regex> = patterns.iter().filter_map(|p| Regex::new(p).ok()).collect();
    if res.is_empty() {
        return Vec::new();
    }
    names
        .filter(|n| res.iter().any(|r| r.is_match(n)))
        .cloned()
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relevant_names_match_any_pattern() {
        let env: Vec<String> = ["PATH", "SGLANG_X", "NCCL_DEBUG", "HOME"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let pats = vec!["^SGLANG_".to_string(), "^NCCL_".to_string()];
        assert_eq!(relevant(&pats, env.iter()), vec!["SGLANG_X", "NCCL_DEBUG"]);
        assert!(relevant(&[], env.iter()).is_empty());
    }
}
