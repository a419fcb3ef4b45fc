//! Markdown building blocks. Host text is untrusted: every string that is not ours goes
//! through [`esc`] (inline text), [`cell`] (table cells), [`code`] (code spans), [`html`]
//! (inside the `<summary>` of a details block, which Markdown does not parse) or
//! [`fenced`] (code blocks), so it can neither end a construct early nor add one.

/// Inline text: Markdown punctuation that could start emphasis, a link, raw HTML, a table
/// cell boundary or an autolink is backslash-escaped; newlines become spaces.
pub fn esc(s: &str) -> String {
    let chars: Vec<char> = s.chars().collect();
    let mut o = String::with_capacity(s.len() + 8);
    for (i, &ch) in chars.iter().enumerate() {
        match ch {
            // an underscore inside a word (`SGLANG_X`) never starts emphasis: left as is
            '_' if intraword(&chars, i) => o.push(ch),
            '\\' | '`' | '*' | '_' | '[' | ']' | '<' | '|' | '~' | '&' => {
                o.push('\\');
                o.push(ch);
            }
            '\n' | '\r' => o.push(' '),
            _ => o.push(ch),
        }
    }
    o
}

fn intraword(chars: &[char], i: usize) -> bool {
    let word = |c: Option<&char>| c.is_some_and(|c| c.is_alphanumeric());
    i > 0 && word(chars.get(i - 1)) && word(chars.get(i + 1))
}

/// A table cell: inline text on one line.
pub fn cell(s: &str) -> String {
    esc(s)
}

/// A table cell as the stuck-requests table writes it (inside its own backticks): only
/// what would break the row is escaped.
pub fn plain_cell(s: &str) -> String {
    s.replace('|', "\\|").replace(['\n', '\r'], " ")
}

/// A code span that cannot be closed early by backticks in `s`. In a table a `|` must be
/// escaped even inside code (GFM splits cells first), so it always is.
pub fn code(s: &str) -> String {
    let s = s.replace(['\n', '\r'], " ").replace('|', "\\|");
    let longest = s.split(|c| c != '`').map(str::len).max().unwrap_or(0);
    let fence = "`".repeat(longest + 1);
    // a span starting or ending with a backtick needs a space to be read as one
    let pad = if s.starts_with('`') || s.ends_with('`') || s.is_empty() {
        " "
    } else {
        ""
    };
    format!("{fence}{pad}{s}{pad}{fence}")
}

/// Text inside raw HTML (`<summary>`): Markdown is not parsed there, entities are.
pub fn html(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace(['\n', '\r'], " ")
}

/// A fenced code block that cannot be closed early by its content.
pub fn fenced(body: &str) -> String {
    let mut fence = "```".to_string();
    while body.contains(&fence) {
        fence.push('`');
    }
    format!("{fence}text\n{body}\n{fence}\n")
}

/// A folded block. The blank lines matter: an HTML block ends at a blank line, and without
/// one after `</details>` the next list item or table would be swallowed as raw HTML
/// (rendered as literal text on GitHub).
pub fn details(summary: &str, body: &str) -> String {
    format!(
        "<details><summary>{}</summary>\n\n{}\n\n</details>\n\n",
        html(summary),
        body.trim_end()
    )
}

/// A table: header cells and rows of already-escaped cells.
pub fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut o = format!("| {} |\n", header.join(" | "));
    o.push_str(&format!("|{}\n", " --- |".repeat(header.len())));
    for r in rows {
        o.push_str(&format!("| {} |\n", r.join(" | ")));
    }
    o
}

pub fn join<T: ToString>(v: &[T]) -> String {
    v.iter()
        .map(|x| x.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

/// At most `max` characters of `s`, cut at a character boundary, saying so with `…`.
pub fn clip(s: &str, max: usize) -> String {
    match s.char_indices().nth(max) {
        Some((i, _)) => format!("{}…", &s[..i]),
        None => s.to_string(),
    }
}

pub fn human_bytes(b: u64) -> String {
    const U: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut x = b as f64;
    let mut i = 0;
    while x >= 1024.0 && i + 1 < U.len() {
        x /= 1024.0;
        i += 1;
    }
    if i == 0 {
        format!("{b} B")
    } else {
        format!("{x:.1} {}", U[i])
    }
}

/// A duration in words: `94 s`, `4 min 10 s`, `2 h 5 min`.
pub fn ago(ms: f64) -> String {
    let s = (ms / 1000.0).max(0.0).round() as u64;
    match s {
        0..=119 => format!("{s} s"),
        120..=7199 => format!("{} min {} s", s / 60, s % 60),
        _ => format!("{} h {} min", s / 3600, (s % 3600) / 60),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn code_spans_survive_backticks_and_pipes() {
        assert_eq!(code("a"), "`a`");
        assert_eq!(code("a`b"), "``a`b``");
        assert_eq!(code("`x"), "`` `x ``");
        assert_eq!(code("a|b"), "`a\\|b`");
    }

    #[test]
    fn escapes_and_clips() {
        assert_eq!(
            esc("<redacted> *x* a|b _y_ A_B"),
            "\\<redacted> \\*x\\* a\\|b \\_y\\_ A_B"
        );
        assert_eq!(html("<b>&"), "&lt;b&gt;&amp;");
        assert_eq!(clip("héllo", 2), "hé…");
        assert_eq!(clip("hi", 2), "hi");
        assert_eq!(ago(94_000.0), "94 s");
        assert_eq!(ago(250_000.0), "4 min 10 s");
    }
}
