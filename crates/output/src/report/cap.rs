//! The size cap: GitHub refuses an issue body over 65,536 characters. The head is always
//! kept; every other block is kept whole or cut whole (cutting inside a table or a code
//! block would break the Markdown after it), in order, and the end says what was cut.
//! Everything stays in `snapshot.json`.

use super::md::{clip, esc};

/// The largest report, in bytes (at least as many as characters): room under GitHub's
/// limit for the reporter's own words.
pub const MAX_REPORT: usize = 60_000;
/// Kept free for the note saying what was cut.
const NOTE_ROOM: usize = 3_000;
/// Cut blocks named in the note; more are counted.
const NAMED: usize = 20;

/// One part of the report that is kept or cut whole.
pub struct Block {
    /// What the note calls it when cut (`thread stacks of decode@...`).
    pub name: String,
    pub text: String,
}

impl Block {
    pub fn new(name: impl Into<String>, text: String) -> Self {
        Block {
            name: name.into(),
            text,
        }
    }
}

/// The head, then as many blocks as fit under `max` bytes, then what was cut.
pub fn fit(head: String, blocks: Vec<Block>, max: usize) -> String {
    let budget = max.saturating_sub(NOTE_ROOM);
    let mut o = head;
    let mut cut: Vec<String> = Vec::new();
    for b in blocks.into_iter().filter(|b| !b.text.is_empty()) {
        // each block after a blank line: a line right after a table is read as its row
        let sep = if o.ends_with("\n\n") || b.text.starts_with('\n') {
            ""
        } else {
            "\n"
        };
        if o.len() + sep.len() + b.text.len() <= budget {
            o.push_str(sep);
            o.push_str(&b.text);
        } else {
            cut.push(b.name);
        }
    }
    if !cut.is_empty() {
        o.push_str(&note(&cut, max));
    }
    o
}

fn note(cut: &[String], max: usize) -> String {
    let named: Vec<String> = cut.iter().take(NAMED).map(|n| esc(&clip(n, 80))).collect();
    let more = cut.len().saturating_sub(named.len());
    let tail = if more > 0 {
        format!(" and {more} more")
    } else {
        String::new()
    };
    format!(
        "\n## Cut to fit\n\nThis report is capped at {max} characters (GitHub's limit for an issue is 65,536). \
         Left out: {}{tail}. Everything is in `snapshot.json` (`wedgewatch report snapshot.json` renders it again; \
         `wedgewatch tui --replay snapshot.json` shows it).\n",
        named.join(", ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_are_kept_or_cut_whole_and_named() {
        let head = "# t\n\n".to_string();
        let blocks = vec![
            Block::new("a", "a".repeat(10)),
            Block::new("big", "b".repeat(6_000)),
            Block::new("c", "c".repeat(10)),
        ];
        let out = fit(head, blocks, 5_000);
        assert!(out.len() <= 5_000, "{}", out.len());
        assert!(out.contains(&"a".repeat(10)) && out.contains(&"c".repeat(10)));
        assert!(!out.contains("bbb"));
        assert!(out.contains("Left out: big."), "{out}");
    }
}
