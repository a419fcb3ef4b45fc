//! The cheap pre-filter: from a process's `comm` alone (in the `stat` line read for every pid
//! anyway), whether its command line is worth reading. A command line takes the target's mmap
//! lock and is the costly read of a pass; `stat` never waits for it.
//!
//! Which comms are candidates, and why a `match_cmdline` regex must name its program:
//! docs/probes.md. Non-candidates stay in the table (pid, parent, comm) and are read on demand.

use super::profiles::Compiled;
use regex::Regex;
use std::collections::BTreeSet;

/// Linux's comm length (TASK_COMM_LEN - 1): longer names are cut there.
const COMM_MAX: usize = 15;
/// Shorter regex words (`m` of `-m`, `S` of `\S`) say nothing about a program's name.
const MIN_WORD: usize = 3;

/// The candidate test of one discovery, built from its compiled profiles.
pub(super) struct Prefilter {
    names: Vec<Regex>,
    words: BTreeSet<String>,
}

impl Prefilter {
    pub fn new(compiled: &[Compiled]) -> Prefilter {
        let mut names = Vec::new();
        let mut words = BTreeSet::new();
        for c in compiled {
            names.extend(c.comm.iter().cloned());
            names.extend(c.title.iter().cloned());
            for r in c.p.match_cmdline.iter().chain(&c.p.match_title) {
                words.extend(regex_words(r));
            }
        }
        Prefilter { names, words }
    }

    /// Whether a process named `comm` can match a profile (false: its cmdline is not read).
    pub fn candidate(&self, comm: &str) -> bool {
        if comm.contains("::") || comm.starts_with("python") || comm.starts_with("pypy") {
            return true;
        }
        if self.names.iter().any(|r| r.is_match(comm)) {
            return true;
        }
        let cut = comm.len() >= COMM_MAX;
        self.words
            .iter()
            .any(|w| comm == w || comm.starts_with(w.as_str()) || (cut && w.starts_with(comm)))
    }
}

/// The literal words of a regex's source (escapes such as `\s` and `\.` separate words).
fn regex_words(source: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut chars = source.chars();
    while let Some(ch) = chars.next() {
        if ch == '\\' {
            chars.next();
            flush(&mut cur, &mut out);
        } else if ch.is_ascii_alphanumeric() || ch == '_' || ch == '-' {
            cur.push(ch);
        } else {
            flush(&mut cur, &mut out);
        }
    }
    flush(&mut cur, &mut out);
    out
}

fn flush(cur: &mut String, out: &mut Vec<String>) {
    let word = cur.trim_start_matches('-');
    if word.len() >= MIN_WORD {
        out.push(word.to_string());
    }
    cur.clear();
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::discover::profiles::CompiledSet;
    use crate::probes::ProbeSet;

    fn builtin() -> Prefilter {
        let probes = ProbeSet::builtin().expect("probes");
        Prefilter::new(&CompiledSet::new(&probes.profiles).compiled)
    }

    #[test]
    fn words_of_a_regex() {
        assert_eq!(
            regex_words(r"(^|\s)-m (sglang_router|smg)\.launch_router(\s|$)"),
            vec!["sglang_router", "smg", "launch_router"]
        );
        assert_eq!(
            regex_words(r"^(\S*/)?(sglang-router|sgl-router|smg)(\s|$)"),
            vec!["sglang-router", "sgl-router", "smg"]
        );
    }

    #[test]
    fn builtin_candidates_and_the_rest() {
        let f = builtin();
        for comm in [
            "python3",
            "python3.11",
            "python",
            "pypy3",
            "sglang",
            "vllm",
            "sglang-router",
            "sgl-router",
            "smg",
            "vllm-router",
            "sglang::schedul",
            "sglang::detoken",
            "sglang::router",
            "VLLM::EngineCor",
            "VLLM::APIServer",
            "VLLM::Worker_TP",
        ] {
            assert!(f.candidate(comm), "{comm} must be a candidate");
        }
        for comm in [
            "sleep", "bash", "sshd", "systemd", "cargo", "rustc", "timeout",
        ] {
            assert!(!f.candidate(comm), "{comm} is not a candidate");
        }
    }
}
