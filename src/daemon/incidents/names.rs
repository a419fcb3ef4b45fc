//! An incident directory's name: `<UTC time>-<kind>-<component>`, e.g.
//! `20260312T031502Z-wedged_request-decode_127.0.0.1_30001`.
//!
//! The kind and the component come from the stack (a component's name can come from a
//! process title any local user chooses), so each is reduced to `[A-Za-z0-9._]` and a bounded
//! length: no `/`, no leading `.` or `-` (the name starts with the time), nothing a shell
//! or a terminal reads specially. The listing takes only names of this shape as incidents.

use crate::clock::Millis;
use crate::model::FindingKind;

/// Longest kind or component part of a name.
const MAX_PART: usize = 64;
/// `20260312T031502Z`.
const STAMP_LEN: usize = 16;

fn allowed(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '.' || c == '_'
}

/// `s` with every character outside `[A-Za-z0-9._]` made `_`, at most [`MAX_PART`] long.
fn part(s: &str) -> String {
    let p: String = s
        .chars()
        .map(|c| if allowed(c) { c } else { '_' })
        .take(MAX_PART)
        .collect();
    if p.is_empty() {
        "_".into()
    } else {
        p
    }
}

/// `20260312T031502Z` for a Unix-epoch millisecond time.
fn stamp(ms: Millis) -> String {
    let fmt = time::macros::format_description!("[year][month][day]T[hour][minute][second]Z");
    time::OffsetDateTime::from_unix_timestamp_nanos(i128::from(ms) * 1_000_000)
        .ok()
        .and_then(|t| t.format(&fmt).ok())
        .filter(|s| s.len() == STAMP_LEN)
        .unwrap_or_else(|| "19700101T000000Z".into())
}

/// The directory name of an incident opened at `ms`; `n` > 1 tells apart incidents of one
/// second, kind and component.
pub fn dir_name(ms: Millis, kind: &FindingKind, component: Option<&str>, n: u32) -> String {
    let base = format!(
        "{}-{}-{}",
        stamp(ms),
        part(kind.as_str()),
        part(component.unwrap_or("-"))
    );
    match n {
        0 | 1 => base,
        n => format!("{base}-{n}"),
    }
}

/// Whether `name` has the shape [`dir_name`] gives (anything else in the directory was not
/// written as an incident).
pub fn is_incident_name(name: &str) -> bool {
    let b = name.as_bytes();
    let digits =
        |r: std::ops::Range<usize>| b.get(r).is_some_and(|d| d.iter().all(u8::is_ascii_digit));
    name.len() <= STAMP_LEN + 2 * MAX_PART + 16
        && digits(0..8)
        && b.get(8) == Some(&b'T')
        && digits(9..15)
        && b.get(15..17) == Some(b"Z-")
        && name[17..].chars().all(|c| allowed(c) || c == '-')
        && name.len() > 17
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: Millis = 1_773_285_302_000; // 2026-03-12T03:15:02Z

    #[test]
    fn names_carry_the_time_kind_and_component() {
        let n = dir_name(
            T,
            &FindingKind::WedgedRequest,
            Some("decode@127.0.0.1:30001"),
            1,
        );
        assert_eq!(n, "20260312T031502Z-wedged_request-decode_127.0.0.1_30001");
        assert!(is_incident_name(&n));
        let two = dir_name(
            T,
            &FindingKind::WedgedRequest,
            Some("decode@127.0.0.1:30001"),
            2,
        );
        assert_eq!(two, format!("{n}-2"));
        assert!(is_incident_name(&two));
        assert_eq!(
            dir_name(T, &FindingKind::QueueNotDraining, None, 1),
            "20260312T031502Z-queue_not_draining-_"
        );
    }

    #[test]
    fn a_hostile_component_name_stays_one_inert_path_component() {
        for hostile in [
            "../../../etc/cron.d/x",
            "/etc/passwd",
            "..",
            "decode@$(rm -rf ~)`id`;'\"",
            "sched\u{1b}[2J\n\r\0",
            "-rf",
            "é漢字🙂",
            &"x".repeat(5_000),
        ] {
            let kind = FindingKind::from(hostile);
            let n = dir_name(T, &kind, Some(hostile), 1);
            assert!(is_incident_name(&n), "{n:?}");
            assert!(!n.contains('/') && !n.starts_with(['.', '-']), "{n:?}");
            assert!(
                n.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "._-".contains(c)),
                "{n:?}"
            );
            assert!(n.len() <= 17 + 2 * MAX_PART + 1, "{}", n.len());
            let p = std::path::Path::new("/state/incidents").join(&n);
            assert_eq!(p.parent(), Some(std::path::Path::new("/state/incidents")));
        }
    }

    #[test]
    fn only_names_of_that_shape_are_incidents() {
        for not in [
            "",
            ".tmp-x",
            "notes",
            "20260312T031502Z",
            "20260312T031502Z-",
            "20260312X031502Z-a-b",
            "2026031xT031502Z-a-b",
            ".20260312T031502Z-a-b",
            "20260312T031502Z-a/b",
            "20260312T031502Z-a b",
        ] {
            assert!(!is_incident_name(not), "{not:?}");
        }
    }
}
