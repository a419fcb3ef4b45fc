//! Markdown building blocks. Host text (anything read from a snapshot) is untrusted: it
//! reaches report.md only through [`esc`], the one escaping of host text, used for inline
//! text, table cells and the `<summary>` of a details block alike; or inside a construct it
//! cannot close early: [`code`] (a code span; in a table only through [`id_cell`]) or
//! [`fenced`] (a code block).
//! So it can neither end a construct early nor add one, Markdown or HTML.

use std::fmt::Write;

/// Host text as inline Markdown that is also inert as HTML: every character that could
/// start a Markdown construct (emphasis, a link or image, a code span, strikethrough, a
/// table cell boundary, a backslash escape) or an HTML tag, attribute or entity becomes a
/// character reference, which Markdown and HTML both show as the character and neither
/// parses (a backslash escape would show in raw HTML, and GFM splits table cells before
/// escapes are read); line breaks become spaces. The `:` of `://` and the `.` of `www.`
/// too: GitHub links a bare URL in text, and a reference splits it. (A bare e-mail address
/// is still linked as `mailto:`: no escape stops that.)
pub fn esc(s: &str) -> String {
    let chars: Vec<char> = s.chars().collect();
    let mut o = String::with_capacity(s.len() + 8);
    for (i, &ch) in chars.iter().enumerate() {
        match ch {
            // an underscore inside a word (`SGLANG_X`) never starts emphasis: left as is
            '_' if intraword(&chars, i) => o.push(ch),
            ':' if chars.get(i + 1..i + 3) == Some(&['/', '/']) => o.push_str("&#58;"),
            '.' if i >= 3 && chars[i - 3..i].iter().all(|c| c.eq_ignore_ascii_case(&'w')) => {
                o.push_str("&#46;")
            }
            '&' => o.push_str("&amp;"),
            '<' => o.push_str("&lt;"),
            '>' => o.push_str("&gt;"),
            '"' => o.push_str("&quot;"),
            '\\' | '`' | '*' | '_' | '[' | ']' | '|' | '~' => {
                let _ = write!(o, "&#{};", u32::from(ch));
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

/// A code span that cannot be closed early by backticks in `s`. Not for table cells: GFM
/// splits a row at a `|` even inside a code span, so cells take [`esc`] or [`id_cell`].
pub fn code(s: &str) -> String {
    let s = s.replace(['\n', '\r'], " ");
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

/// An id (of a component, a node) as a table cell: a code span when it holds nothing a
/// table row or a span could not hold (`|`, a backtick, a backslash), else [`esc`] text.
pub fn id_cell(s: &str) -> String {
    if s.contains(['|', '`', '\\', '\n', '\r']) {
        esc(s)
    } else {
        code(s)
    }
}

/// A fenced code block that cannot be closed early by its content.
pub fn fenced(body: &str) -> String {
    let mut fence = "```".to_string();
    while body.contains(&fence) {
        fence.push('`');
    }
    format!("{fence}text\n{body}\n{fence}\n")
}

/// A folded block (`summary` may hold host text: escaped here). The blank lines matter: an
/// HTML block ends at a blank line, and without one after `</details>` the next list item
/// or table would be swallowed as raw HTML (rendered as literal text on GitHub).
pub fn details(summary: &str, body: &str) -> String {
    format!(
        "<details><summary>{}</summary>\n\n{}\n\n</details>\n\n",
        esc(summary),
        body.trim_end()
    )
}

/// A table: our header cells and rows of cells already through [`esc`].
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
    fn code_spans_survive_backticks_and_line_breaks() {
        assert_eq!(code("a"), "`a`");
        assert_eq!(code("a`b"), "``a`b``");
        assert_eq!(code("`x"), "`` `x ``");
        assert_eq!(code("<b>\n`"), "`` <b> ` ``");
        assert_eq!(id_cell("decode@[::1]:2"), "`decode@[::1]:2`");
        assert_eq!(id_cell("a|b"), "a&#124;b");
    }

    #[test]
    fn escapes_and_clips() {
        assert_eq!(
            esc("<redacted> *x* a|b _y_ A_B"),
            "&lt;redacted&gt; &#42;x&#42; a&#124;b &#95;y&#95; A_B"
        );
        assert_eq!(esc("`a\\\"&\n"), "&#96;a&#92;&quot;&amp; ");
        assert_eq!(
            esc("see https://x.io or WWW.x.io, 10.0.0.1:80"),
            "see https&#58;//x.io or WWW&#46;x.io, 10.0.0.1:80"
        );
        assert_eq!(clip("héllo", 2), "hé…");
        assert_eq!(clip("hi", 2), "hi");
        assert_eq!(ago(94_000.0), "94 s");
        assert_eq!(ago(250_000.0), "4 min 10 s");
    }
}
