//! The header's cause line (see `app::cause`), fitted to the width: the change's values, the
//! count of stuck requests and the other keys give way first; the times, the hop, `restarted`
//! and "never answered" stay.

use super::{cut, time_of, Theme};
use crate::app::{Cause, CauseChange, CauseEffect};
use crate::clock::{rfc3339, Millis};
use ratatui::style::Color;
use ratatui::text::{Line, Span};

/// `09:29:10` (UTC, as the header's snapshot time).
fn clock(ms: Millis) -> String {
    time_of(&rfc3339(ms)).to_string()
}

/// `SGLANG_…SPLIT_TOKENS`: cut in the middle, where variable names are alike least.
fn cut_middle(s: &str, w: usize) -> String {
    let n = s.chars().count();
    if n <= w || w < 5 {
        return cut(s, w);
    }
    let head = w / 3;
    let tail = w - head - 1;
    let chars: Vec<char> = s.chars().collect();
    let mut out: String = chars[..head].iter().collect();
    out.push('…');
    out.extend(&chars[n - tail..]);
    out
}

/// How much of the changed keys to show.
enum Keys {
    All,
    /// Without their values.
    Names,
    /// The first name in at most this many columns, and how many more.
    First(usize),
}

fn change_text(c: &CauseChange, keys: &Keys) -> String {
    let name = |k: &String| k.split('=').next().unwrap_or(k).to_string();
    let shown = match keys {
        _ if c.keys.is_empty() => String::new(),
        Keys::All => c.keys.join(", "),
        Keys::Names => c.keys.iter().map(name).collect::<Vec<_>>().join(", "),
        Keys::First(w) => {
            let first = cut_middle(&name(&c.keys[0]), *w);
            match c.keys.len() - 1 {
                0 => first,
                more => format!("{first} +{more}"),
            }
        }
    };
    let at = c.restarted_at.map_or(String::new(), |t| clock(t) + " ");
    let verb = if c.restarted { "restarted" } else { "changed" };
    if shown.is_empty() {
        format!("{at}{} {verb}", c.hop)
    } else {
        format!("{at}{} {verb} ({shown})", c.hop)
    }
}

fn effect_text(e: &CauseEffect, long: bool) -> String {
    let t = clock(e.at);
    let what = if e.stalled {
        "first request's stream stalled"
    } else {
        "first request never answered"
    };
    if long {
        format!("{t} {what} ({} stuck at {})", e.stuck, e.hop)
    } else {
        format!("{t} {what}")
    }
}

/// The change and the effect in time order: `->` when the change came first (or its time
/// is unknown), `, then` when the requests were stuck before it.
fn joined(c: &Cause, keys: &Keys, long: bool) -> (String, &'static str, String, bool) {
    let effect = effect_text(&c.effect, long);
    match &c.change {
        None => (String::new(), "", effect, true),
        Some(ch) => {
            let change = change_text(ch, keys);
            if ch.restarted_at.is_some_and(|t| t > c.effect.at) {
                (effect, ", then ", change, false)
            } else {
                (change, " -> ", effect, true)
            }
        }
    }
}

/// The line in `width` columns.
pub(super) fn cause_line(c: &Cause, theme: Theme, width: usize) -> Line<'static> {
    let len =
        |p: &(String, &str, String, bool)| p.0.chars().count() + p.1.len() + p.2.chars().count();
    let mut parts = [(Keys::All, true), (Keys::Names, true), (Keys::Names, false)]
        .iter()
        .map(|(k, long)| joined(c, k, *long))
        .find(|p| len(p) <= width);
    if parts.is_none() {
        // The first key gets what the rest leaves (measured with a one-column key, so
        // with its parentheses).
        let bare = joined(c, &Keys::First(1), false);
        let room = (width + 1).saturating_sub(len(&bare)).max(5);
        parts = Some(joined(c, &Keys::First(room), false));
    }
    let (a, sep, b, change_first) = parts.unwrap_or_default();
    let (change_style, effect_style) = (theme.fg(Color::Yellow), theme.fg(Color::Red));
    let (sa, sb) = if change_first {
        (change_style, effect_style)
    } else {
        (effect_style, change_style)
    };
    let a_w = a.chars().count().min(width);
    let sep_w = sep.len().min(width - a_w);
    Line::from(vec![
        Span::styled(cut(&a, width), sa),
        Span::raw(cut(sep, sep_w)),
        Span::styled(cut(&b, width - a_w - sep_w), sb),
    ])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(l: &Line<'_>) -> String {
        l.spans.iter().map(|s| s.content.as_ref()).collect()
    }

    fn demo() -> Cause {
        Cause {
            change: Some(CauseChange {
                hop: "decode".into(),
                restarted: true,
                restarted_at: crate::clock::parse_rfc3339("2026-12-05T09:29:10.120Z"),
                keys: vec!["+SGLANG_DECODE_PREALLOC_SPLIT_TOKENS=100".into()],
            }),
            effect: CauseEffect {
                at: crate::clock::parse_rfc3339("2026-12-05T09:29:14.134Z").unwrap_or(0),
                request: "r36".into(),
                stalled: false,
                stuck: 2,
                hop: "decode".into(),
            },
        }
    }

    #[test]
    fn the_line_keeps_times_hop_and_effect_at_every_width() {
        let theme = Theme { no_color: true };
        let wide = text(&cause_line(&demo(), theme, 200));
        assert_eq!(
            wide,
            "09:29:10 decode restarted (+SGLANG_DECODE_PREALLOC_SPLIT_TOKENS=100) -> \
             09:29:14 first request never answered (2 stuck at decode)"
        );
        let narrow = text(&cause_line(&demo(), theme, 80));
        assert!(narrow.chars().count() <= 80, "{narrow}");
        assert!(
            narrow.starts_with("09:29:10 decode restarted (+SG")
                && narrow.ends_with("-> 09:29:14 first request never answered"),
            "{narrow}"
        );
        assert!(narrow.contains("TOKENS)"), "the name's end stays: {narrow}");
        // Stuck before the restart: no arrow from the restart to the requests.
        let mut late = demo();
        if let Some(ch) = late.change.as_mut() {
            ch.restarted_at = Some(late.effect.at + 5_000);
        }
        let line = text(&cause_line(&late, theme, 200));
        assert!(
            line.starts_with("09:29:14 first request never answered") && !line.contains("->"),
            "{line}"
        );
        assert!(line.contains(", then 09:29:19 decode restarted"), "{line}");
    }
}
