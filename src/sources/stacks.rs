//! Python stacks through py-spy, one subprocess per pid, classified by probe rules.

use serde::Deserialize;

/// Maps a thread's frames to a state (owned by the stacks source; placeholder shape).
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct StackRule {
    pub state: String,
}
