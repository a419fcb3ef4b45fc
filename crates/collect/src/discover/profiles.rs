//! Profile matching: a probe [`Profile`]'s regexes compiled once per set of profiles (kept
//! by the [`DiscoveryCache`](super::DiscoveryCache) across passes, see [`CompiledSet`]),
//! matched against a process's cmdline, title (argv[0]) and comm; and the argparse-like
//! reading of flags from a command line.

use super::prefilter::Prefilter;
use super::table::Proc;
use crate::probes::Profile;
use regex::Regex;
use std::sync::Arc;

/// A profile with its regexes compiled (bad ones were refused when the probes loaded).
pub(super) struct Compiled {
    pub p: Arc<Profile>,
    pub order: usize,
    pub cmdline: Vec<Regex>,
    pub comm: Vec<Regex>,
    pub title: Vec<Regex>,
    pub exclude: Vec<Regex>,
    pub child_name: Option<Regex>,
    pub gpu_index: Option<Regex>,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct Match {
    /// Matched by title or comm: its cmdline/environ were rewritten by setproctitle.
    pub titled: bool,
    /// Its own cmdline matches `match_cmdline` (its arguments are visible).
    pub own_args: bool,
}

fn compile_list(list: &[String]) -> Vec<Regex> {
    // validated at load time; a regex that fails here is skipped, not fatal
    list.iter().filter_map(|r| Regex::new(r).ok()).collect()
}

/// Every profile of a probe set compiled, with the pre-filter built from them, reused while the
/// profiles stay the same.
pub(super) struct CompiledSet {
    /// The profiles compiled, to tell whether a later pass's are the same.
    source: Vec<Profile>,
    pub compiled: Arc<Vec<Compiled>>,
    pub prefilter: Arc<Prefilter>,
}

impl std::fmt::Debug for CompiledSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CompiledSet({} profiles)", self.source.len())
    }
}

impl CompiledSet {
    pub fn new(profiles: &[Profile]) -> CompiledSet {
        let compiled: Vec<Compiled> = profiles
            .iter()
            .enumerate()
            .map(|(i, p)| Compiled::new(p, i))
            .collect();
        let prefilter = Prefilter::new(&compiled);
        CompiledSet {
            source: profiles.to_vec(),
            compiled: Arc::new(compiled),
            prefilter: Arc::new(prefilter),
        }
    }

    /// Whether this was compiled from `profiles` (equal field by field).
    pub fn is_of(&self, profiles: &[Profile]) -> bool {
        self.source == profiles
    }
}

impl Compiled {
    pub fn new(p: &Profile, order: usize) -> Self {
        Compiled {
            p: Arc::new(p.clone()),
            order,
            cmdline: compile_list(&p.match_cmdline),
            comm: compile_list(&p.match_comm),
            title: compile_list(&p.match_title),
            exclude: compile_list(&p.exclude_cmdline),
            child_name: p.child_name.as_deref().and_then(|r| Regex::new(r).ok()),
            gpu_index: p
                .gpu_index_from_title
                .as_deref()
                .and_then(|r| Regex::new(r).ok()),
        }
    }

    pub fn matches(&self, proc: &Proc) -> Option<Match> {
        let joined = proc.joined();
        if self.exclude.iter().any(|r| r.is_match(&joined)) {
            return None;
        }
        let by_title =
            !proc.argv0().is_empty() && self.title.iter().any(|r| r.is_match(proc.argv0()));
        let by_comm = self.comm.iter().any(|r| r.is_match(proc.comm.as_str()));
        let own_args = !joined.is_empty() && self.cmdline.iter().any(|r| r.is_match(&joined));
        if by_title || by_comm || own_args {
            Some(Match {
                titled: (by_title || by_comm) && !own_args,
                own_args,
            })
        } else {
            None
        }
    }

    pub fn is_top_level(&self) -> bool {
        self.p.parent.is_none() && !self.p.connects_to_known
    }

    /// The title shown for a process: argv[0] when a title regex matches it, else comm.
    pub fn title_of(&self, proc: &Proc) -> Option<String> {
        if self.title.iter().any(|r| r.is_match(proc.argv0())) {
            Some(proc.argv0().to_string())
        } else if self.comm.iter().any(|r| r.is_match(proc.comm.as_str())) {
            Some(proc.comm.to_string())
        } else {
            None
        }
    }
}

fn norm_flag(s: &str) -> String {
    s.replace('_', "-")
}

/// Values of each occurrence of `flag`: `--flag=v` gives `[v]`, `--flag a b` gives every
/// following token up to the next `--option`.
pub fn flag_values(args: &[String], flag: &str) -> Vec<Vec<String>> {
    let want = norm_flag(flag);
    let mut out = Vec::new();
    let mut i = 0;
    while i < args.len() {
        let a = &args[i];
        if let Some((name, v)) = a.split_once('=') {
            if name.starts_with('-') && norm_flag(name) == want {
                out.push(vec![v.to_string()]);
                i += 1;
                continue;
            }
        }
        if a.starts_with('-') && norm_flag(a) == want {
            let mut vals = Vec::new();
            let mut j = i + 1;
            while j < args.len() && !args[j].starts_with("--") {
                vals.push(args[j].clone());
                j += 1;
            }
            out.push(vals);
            i = j;
            continue;
        }
        i += 1;
    }
    out
}

/// The first value of the last occurrence of `flag` (argparse semantics: last one wins).
pub fn flag_value(args: &[String], flag: &str) -> Option<String> {
    flag_values(args, flag)
        .into_iter()
        .last()
        .and_then(|v| v.into_iter().next())
}
