//! The facts of one component that "what changed" compares ([`super::changes::changes`]):
//! process identity, executable, command line, environment, role and listen addresses.
//!
//! One type for both sides of every comparison: the daemon's baselines store it as is (its
//! serialized form is the baseline component of recordings, so its field names and order
//! are a file format), and a snapshot's components are read into it
//! (`From<&SnapComponent>`) for `diff` and `snapshot --baseline`. Same facts, same rules.

use super::{Role, SnapComponent};
use crate::clock::Millis;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The facts of one component at one time.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ComponentFacts {
    pub id: String,
    pub role: Role,
    pub stack: String,
    pub main_pid: Option<i32>,
    /// `pid:start_ticks` of the main process.
    pub identity: Option<String>,
    pub started_at_ms: Option<Millis>,
    pub exe: Option<String>,
    pub cmdline: Vec<String>,
    /// In baselines, secret values are keyed masks `<redacted:KEYID:MAC>` (comparable within
    /// one run, see `model::masked`); in redacted snapshots, plain `<redacted>`.
    pub env: BTreeMap<String, String>,
    pub listen: Vec<String>,
    /// A `version` label, when a source provides one; absent from the file when unknown.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
}

impl From<&SnapComponent> for ComponentFacts {
    fn from(c: &SnapComponent) -> Self {
        ComponentFacts {
            id: c.id.clone(),
            role: c.role,
            stack: c.stack.clone(),
            main_pid: c.main_pid,
            identity: c.identity.clone(),
            // Snapshots write it with `clock::rfc3339`, which reads back to the same instant.
            started_at_ms: c
                .started_at
                .as_deref()
                .and_then(crate::clock::parse_rfc3339),
            exe: c.exe.clone(),
            cmdline: c.cmdline.clone(),
            env: c.env.clone(),
            listen: c.listen.clone(),
            version: c.labels.get("version").cloned(),
        }
    }
}
