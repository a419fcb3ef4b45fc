//! Versions: of wedgewatch and the host (kernel, NVIDIA driver, CUDA), and of what each
//! engine and router runs (its packages and Python), as discovery read them from disk.

use super::md::{details, esc, id_cell, table};
use crate::model::Snapshot;

/// The host's versions in a fixed order, then any others.
const HOST: [&str; 4] = ["wedgewatch", "kernel", "nvidia_driver", "cuda"];

fn host(s: &Snapshot) -> Vec<Vec<String>> {
    let mut keys: Vec<&str> = HOST.to_vec();
    keys.extend(
        s.versions
            .keys()
            .map(String::as_str)
            .filter(|k| !HOST.contains(k)),
    );
    keys.into_iter()
        .map(|k| {
            let v = s.versions.get(k).map(|v| esc(v));
            vec![
                esc(k),
                v.unwrap_or_else(|| match k {
                    "nvidia_driver" | "cuda" => "unknown (no NVML here)".into(),
                    _ => "unknown".into(),
                }),
            ]
        })
        .collect()
}

fn components(s: &Snapshot) -> Vec<Vec<String>> {
    s.components
        .iter()
        .filter(|c| !c.versions.is_empty())
        .map(|c| {
            let v: Vec<String> = c
                .versions
                .iter()
                .map(|(k, v)| format!("{} {}", esc(k), esc(v)))
                .collect();
            vec![id_cell(&c.id), c.role.to_string(), v.join(", ")]
        })
        .collect()
}

pub fn section(s: &Snapshot) -> String {
    let mut body = table(&["what", "version"], &host(s));
    let comps = components(s);
    if comps.is_empty() {
        body.push_str("\nNo package versions were read for the components (snapshot of an older version, or no readable package metadata).\n");
    } else {
        body.push('\n');
        body.push_str(&table(&["component", "role", "versions"], &comps));
    }
    details("Versions", &body)
}
