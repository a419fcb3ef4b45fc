//! What changed since the baseline (`config_changed`), as a table.

use super::md::{esc, id_cell, table};
use crate::model::Snapshot;

pub fn section(s: &Snapshot) -> String {
    if s.config_changed.is_empty() {
        return String::new();
    }
    let rows: Vec<Vec<String>> = s
        .config_changed
        .iter()
        .map(|c| {
            vec![
                id_cell(&c.component),
                c.role.to_string(),
                esc(&c.field),
                esc(c.key.as_deref().unwrap_or("")),
                esc(c.before.as_deref().unwrap_or("(absent)")),
                esc(c.after.as_deref().unwrap_or("(absent)")),
            ]
        })
        .collect();
    format!(
        "## Changed since the baseline (`config_changed`)\n\n{}\n",
        table(
            &["component", "role", "field", "key", "before", "after"],
            &rows
        )
    )
}
