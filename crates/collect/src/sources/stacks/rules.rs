//! Stack rules: `[[stack_rule]]` tables from `probes/stacks-*.toml`, compiled once, that map
//! a thread's frames to a [`ThreadState`], the rule that decided it and the frame it matched.
//!
//! Rules see the whole stack (native frames from `py-spy --native` included), not only the
//! innermost few frames: a thread blocked in an `all_reduce` under the scheduler's idle loop
//! is inside a collective, and only the whole stack says so. The highest priority wins; no
//! rule is `unknown`, never a guess.

use crate::error::{Error, Result};
use crate::model::{Frame, ThreadStack, ThreadState};
use regex::Regex;
use serde::Deserialize;

/// Maps a thread's frames to a state (`[[stack_rule]]` in `probes/*.toml`): a rule matches
/// when a frame anywhere matches `any_frame` (if given), one of the `innermost_depth`
/// innermost frames matches `innermost` (if given), and no frame matches `not_frame`; the
/// highest `priority` wins. Patterns (`NAME@FILE`): docs/probes.md "Stack rules".
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct StackRule {
    /// Rule id, shown as the reason of a classification (`sglang.running_batch`).
    pub name: String,
    /// One of [`ThreadState::KNOWN`] (`unknown` included, though no rule needs it).
    pub state: String,
    /// Only for components of this stack (`sglang`, `vllm`); absent: any stack.
    #[serde(default)]
    pub stack: Option<String>,
    #[serde(default)]
    pub priority: i32,
    #[serde(default)]
    pub any_frame: Vec<String>,
    #[serde(default)]
    pub innermost: Vec<String>,
    #[serde(default = "default_innermost_depth")]
    pub innermost_depth: usize,
    #[serde(default)]
    pub not_frame: Vec<String>,
    /// The state instead of `state` when the thread is a helper started through
    /// `threading.Thread` (its frames show `Thread.run` / `_bootstrap_inner`): a helper
    /// blocked on a queue waits for work, a main thread blocked on it may be the hang.
    #[serde(default)]
    pub helper_state: Option<String>,
    /// What the state means for the on-call engineer.
    #[serde(default)]
    pub explain: Option<String>,
}

fn default_innermost_depth() -> usize {
    1
}

/// One thread's classification: its state, the rule that decided it and the frame that
/// rule matched (None for both: no rule matched, `unknown`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Classification {
    pub state: ThreadState,
    /// The deciding rule's name (`collective.all_reduce`: names the collective).
    pub rule: Option<String>,
    /// The frame the rule matched, rendered: the `innermost` match if the rule has one, else
    /// the innermost `any_frame` match.
    pub decided_by: Option<String>,
}

impl Classification {
    /// Writes the classification into the thread it was computed from.
    pub fn apply(self, thread: &mut ThreadStack) {
        thread.state = self.state;
        thread.rule = self.rule;
        thread.decided_by = self.decided_by;
    }
}

#[derive(Debug, Clone)]
struct FramePattern {
    name: Regex,
    file: Option<Regex>,
}

impl FramePattern {
    fn parse(rule: &str, text: &str) -> Result<FramePattern> {
        let (name, file) = match text.split_once('@') {
            Some((n, f)) => (n, Some(f)),
            None => (text, None),
        };
        let bad = |e: regex::Error| {
            Error::Other(format!(
                "stack_rule {rule}: bad frame pattern {text:?}: {e}"
            ))
        };
        Ok(FramePattern {
            name: Regex::new(&format!("^(?:{name})$")).map_err(bad)?,
            file: file.map(Regex::new).transpose().map_err(bad)?,
        })
    }

    fn matches(&self, frame: &Frame) -> bool {
        let short = frame.name.rsplit('.').next().unwrap_or(&frame.name);
        (self.name.is_match(&frame.name) || self.name.is_match(short))
            && self.file.as_ref().is_none_or(|f| f.is_match(&frame.file))
    }
}

/// The index of the innermost frame of `frames` that matches one of `pats`.
fn first_match(pats: &[FramePattern], frames: &[Frame]) -> Option<usize> {
    frames
        .iter()
        .position(|f| pats.iter().any(|p| p.matches(f)))
}

#[derive(Debug, Clone)]
struct CompiledRule {
    rule: StackRule,
    state: ThreadState,
    helper_state: Option<ThreadState>,
    any_frame: Vec<FramePattern>,
    innermost: Vec<FramePattern>,
    not_frame: Vec<FramePattern>,
}

impl CompiledRule {
    /// The index of the deciding frame when the rule matches `frames`, None when it does not.
    fn matches(&self, frames: &[Frame]) -> Option<usize> {
        let anchor = if self.any_frame.is_empty() {
            None
        } else {
            Some(first_match(&self.any_frame, frames)?)
        };
        let blocking = if self.innermost.is_empty() {
            None
        } else {
            let window = innermost_window(frames, self.rule.innermost_depth);
            Some(first_match(&self.innermost, &frames[..window])?)
        };
        if first_match(&self.not_frame, frames).is_some() {
            return None;
        }
        // The blocking frame (where the thread waits) says more than the anchor that put
        // it in context; a rule has at least one of the two (checked in `RuleSet::new`).
        blocking.or(anchor)
    }
}

/// A native frame: `py-spy --native` prints a library without a line (`libc.so.6`) or, with
/// debug info, a C/C++ source with one (`selectmodule.c:678`); gdb frames look the same.
fn is_native(f: &Frame) -> bool {
    const C_SOURCES: [&str; 8] = [".c", ".h", ".cc", ".cpp", ".cxx", ".hpp", ".cu", ".cuh"];
    (f.line == 0 && !f.file.ends_with(".py")) || C_SOURCES.iter().any(|e| f.file.ends_with(e))
}

/// A thread started through `threading.Thread`: its outer frames are the thread's `run`
/// and bootstrap in threading.py (a process's main thread has none of them).
fn is_helper_thread(frames: &[Frame]) -> bool {
    frames.iter().any(|f| {
        let short = f.name.rsplit('.').next().unwrap_or(&f.name);
        matches!(short, "run" | "_bootstrap_inner" | "_bootstrap")
            && (f.file == "threading.py" || f.file.ends_with("/threading.py"))
    })
}

/// How many innermost frames `innermost` looks at: the `depth` innermost Python frames and
/// every native frame among or inside them (so `--native` dumps match like Python-only ones).
pub(crate) fn innermost_window(frames: &[Frame], depth: usize) -> usize {
    let depth = depth.max(1);
    let mut python = 0;
    for (i, f) in frames.iter().enumerate() {
        if !is_native(f) {
            python += 1;
            if python == depth {
                return i + 1;
            }
        }
    }
    frames.len()
}

/// Stack rules compiled once (regexes checked, sorted by priority).
#[derive(Debug, Clone, Default)]
pub struct RuleSet {
    rules: Vec<CompiledRule>,
}

impl RuleSet {
    /// Compiles rules; a bad regex, an unknown state or a rule without any frame condition is
    /// an error naming the rule.
    pub fn new(rules: &[StackRule]) -> Result<RuleSet> {
        let mut compiled = Vec::with_capacity(rules.len());
        for r in rules {
            compiled.push(compile(r)?);
        }
        // Stable: equal priorities keep file order.
        compiled.sort_by_key(|c| std::cmp::Reverse(c.rule.priority));
        Ok(RuleSet { rules: compiled })
    }

    /// The state of one thread, the rule that decided it and the frame it matched.
    /// `stack` restricts to rules for that stack (plus stack-less rules); None: all rules.
    pub fn classify(&self, stack: Option<&str>, thread: &ThreadStack) -> Classification {
        for c in &self.rules {
            if let (Some(want), Some(have)) = (c.rule.stack.as_deref(), stack) {
                if want != have {
                    continue;
                }
            }
            if let Some(i) = c.matches(&thread.frames) {
                let state = match &c.helper_state {
                    Some(h) if is_helper_thread(&thread.frames) => h.clone(),
                    _ => c.state.clone(),
                };
                return Classification {
                    state,
                    rule: Some(c.rule.name.clone()),
                    decided_by: thread.frames.get(i).map(Frame::render),
                };
            }
        }
        Classification::default()
    }

    /// The rule's explanation, for reports.
    pub fn explain(&self, rule_name: &str) -> Option<&str> {
        self.rules
            .iter()
            .find(|c| c.rule.name == rule_name)
            .and_then(|c| c.rule.explain.as_deref())
    }

    pub fn len(&self) -> usize {
        self.rules.len()
    }

    pub fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }
}

/// A state a rule may assign, or an error naming the rule and the known states.
fn known_state(rule: &str, name: &str) -> Result<ThreadState> {
    let state = ThreadState::from(name);
    if state.is_known() {
        return Ok(state);
    }
    let known: Vec<&str> = ThreadState::KNOWN.iter().map(ThreadState::as_str).collect();
    Err(Error::Other(format!(
        "stack_rule {rule}: unknown state {name:?} (known: {})",
        known.join(", ")
    )))
}

fn compile(r: &StackRule) -> Result<CompiledRule> {
    let state = known_state(&r.name, &r.state)?;
    let helper_state = r
        .helper_state
        .as_deref()
        .map(|h| known_state(&r.name, h))
        .transpose()?;
    if r.any_frame.is_empty() && r.innermost.is_empty() {
        return Err(Error::Other(format!(
            "stack_rule {}: needs any_frame or innermost",
            r.name
        )));
    }
    let pats = |v: &[String]| -> Result<Vec<FramePattern>> {
        v.iter().map(|p| FramePattern::parse(&r.name, p)).collect()
    };
    Ok(CompiledRule {
        state,
        helper_state,
        any_frame: pats(&r.any_frame)?,
        innermost: pats(&r.innermost)?,
        not_frame: pats(&r.not_frame)?,
        rule: r.clone(),
    })
}

/// Classifies one thread with every rule (any stack). Compiles the rules on each call: use
/// [`RuleSet`] in loops. Bad rules classify nothing (`unknown`).
pub fn classify(rules: &[StackRule], thread: &ThreadStack) -> Classification {
    match RuleSet::new(rules) {
        Ok(set) => set.classify(None, thread),
        Err(_) => Classification::default(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn thread(frames: &[(&str, &str)]) -> ThreadStack {
        ThreadStack {
            tid: 1,
            name: Some("MainThread".into()),
            active: true,
            owns_gil: true,
            frames: frames
                .iter()
                .map(|(n, f)| Frame {
                    name: n.to_string(),
                    file: f.to_string(),
                    line: 1,
                })
                .collect(),
            state: ThreadState::Unknown,
            rule: None,
            decided_by: None,
        }
    }

    fn rule(name: &str, state: ThreadState, prio: i32, any: &[&str]) -> StackRule {
        StackRule {
            name: name.into(),
            state: state.as_str().into(),
            stack: None,
            priority: prio,
            any_frame: any.iter().map(|s| s.to_string()).collect(),
            innermost: vec![],
            innermost_depth: 1,
            not_frame: vec![],
            helper_state: None,
            explain: None,
        }
    }

    fn state_rule(c: Classification) -> (ThreadState, Option<String>) {
        (c.state, c.rule)
    }

    #[test]
    fn qualified_and_bare_names_match_and_priority_wins() {
        let rules = vec![
            rule("a", ThreadState::RunningBatch, 10, &["run_batch"]),
            rule(
                "b",
                ThreadState::NcclCollective,
                50,
                &["all_reduce@parallel_state\\.py$"],
            ),
        ];
        let t = thread(&[
            ("GroupCoordinator.all_reduce", "/x/parallel_state.py"),
            ("Scheduler.run_batch", "/x/scheduler.py"),
        ]);
        let c = classify(&rules, &t);
        assert_eq!(
            c.decided_by.as_deref(),
            Some("GroupCoordinator.all_reduce (/x/parallel_state.py:1)")
        );
        assert_eq!(
            state_rule(c),
            (ThreadState::NcclCollective, Some("b".into()))
        );
        let t = thread(&[
            ("all_reduce", "/x/other.py"),
            ("Scheduler.run_batch", "/x/scheduler.py"),
        ]);
        assert_eq!(
            state_rule(classify(&rules, &t)),
            (ThreadState::RunningBatch, Some("a".into()))
        );
        // Anchored: a longer name does not match.
        let t = thread(&[("run_batch_prebuilt_x", "/x/s.py")]);
        assert_eq!(classify(&rules, &t), Classification::default());
    }

    #[test]
    fn innermost_and_not_frame() {
        let mut r = rule("g", ThreadState::GlooCollective, 10, &["broadcast_pyobj"]);
        r.innermost = vec![".*@distributed_c10d\\.py$".into()];
        r.innermost_depth = 2;
        let mut stuck = rule(
            "s",
            ThreadState::StuckOutsideLoop,
            1,
            &["run_scheduler_process"],
        );
        stuck.not_frame = vec!["event_loop_.*".into()];
        let set = RuleSet::new(&[r, stuck]).unwrap();
        let t = thread(&[
            ("wrapper", "/t/c10d_logger.py"),
            ("broadcast", "/t/distributed_c10d.py"),
            ("broadcast_pyobj", "/s/utils.py"),
        ]);
        let c = set.classify(None, &t);
        assert_eq!(c.state, ThreadState::GlooCollective);
        // The blocking frame the innermost condition found, not the anchor.
        assert_eq!(
            c.decided_by.as_deref(),
            Some("broadcast (/t/distributed_c10d.py:1)")
        );
        let t = thread(&[
            ("x", "/a.py"),
            ("y", "/b.py"),
            ("broadcast", "/t/distributed_c10d.py"),
            ("broadcast_pyobj", "/s/utils.py"),
        ]);
        assert_eq!(set.classify(None, &t).state, ThreadState::Unknown);
        let t = thread(&[("load_model", "/m.py"), ("run_scheduler_process", "/s.py")]);
        assert_eq!(set.classify(None, &t).state, ThreadState::StuckOutsideLoop);
        let t = thread(&[
            ("evict", "/m.py"),
            ("event_loop_overlap", "/s.py"),
            ("run_scheduler_process", "/s.py"),
        ]);
        assert_eq!(set.classify(None, &t).state, ThreadState::Unknown);
    }

    #[test]
    fn innermost_depth_counts_python_frames_and_sees_native_ones() {
        let mut r = rule("w", ThreadState::Idle, 1, &[]);
        r.innermost = vec!["wait@threading\\.py$".into()];
        r.innermost_depth = 1;
        let set = RuleSet::new(&[r]).unwrap();
        // py-spy --native: libc and the lock call sit inside the Python frame.
        let mut t = thread(&[
            ("0x7f00", "libc.so.6"),
            ("PyThread_acquire_lock_timed", "python3.12"),
            ("wait", "threading.py"),
            ("run", "tqdm/_monitor.py"),
        ]);
        for f in &mut t.frames[..2] {
            f.line = 0;
        }
        assert_eq!(set.classify(None, &t).state, ThreadState::Idle);
        assert_eq!(innermost_window(&t.frames, 1), 3);
        assert_eq!(innermost_window(&t.frames, 99), 4);
    }

    #[test]
    fn helper_state_applies_to_threads_started_through_threading() {
        let mut r = rule("wait.queue", ThreadState::Waiting, 0, &[]);
        r.innermost = vec!["get@(.*/)?queue\\.py$".into()];
        r.helper_state = Some("helper_idle".into());
        let set = RuleSet::new(&[r]).unwrap();
        let main = thread(&[("get", "queue.py"), ("main", "/app.py")]);
        assert_eq!(set.classify(None, &main).state, ThreadState::Waiting);
        let helper = thread(&[("get", "queue.py"), ("Thread.run", "/usr/lib/threading.py")]);
        assert_eq!(set.classify(None, &helper).state, ThreadState::HelperIdle);
        let mut bad = rule("b", ThreadState::Waiting, 0, &["x"]);
        bad.helper_state = Some("napping".into());
        let e = RuleSet::new(&[bad]).unwrap_err();
        assert!(e.to_string().contains("stack_rule b: unknown state"), "{e}");
    }

    #[test]
    fn c_sources_with_lines_are_native_frames() {
        let f = |file: &str, line| Frame {
            name: "f".into(),
            file: file.into(),
            line,
        };
        assert!(is_native(&f("selectmodule.c", 678)));
        assert!(is_native(&f("process_set.cc", 187)));
        assert!(is_native(&f("libc.so.6", 0)));
        assert!(!is_native(&f("selectors.py", 415)));
        assert!(!is_native(&f("<string>", 1)));
    }

    #[test]
    fn bad_rules_are_named() {
        let mut napping = rule("x", ThreadState::Idle, 0, &["a"]);
        napping.state = "napping".into();
        let e = RuleSet::new(&[napping]).unwrap_err();
        assert!(e.to_string().contains("stack_rule x: unknown state"), "{e}");
        let e = RuleSet::new(&[rule("y", ThreadState::Idle, 0, &["(unclosed"])]).unwrap_err();
        assert!(
            e.to_string().contains("stack_rule y: bad frame pattern"),
            "{e}"
        );
        let e = RuleSet::new(&[rule("z", ThreadState::Idle, 0, &[])]).unwrap_err();
        assert!(e.to_string().contains("needs any_frame"), "{e}");
    }

    #[test]
    fn stack_filter() {
        let mut r = rule("v", ThreadState::Idle, 0, &["run_busy_loop"]);
        r.stack = Some("vllm".into());
        let set = RuleSet::new(&[r]).unwrap();
        let t = thread(&[("EngineCoreProc.run_busy_loop", "/v/core.py")]);
        assert_eq!(set.classify(Some("vllm"), &t).state, ThreadState::Idle);
        assert_eq!(set.classify(Some("sglang"), &t).state, ThreadState::Unknown);
        assert_eq!(set.classify(None, &t).state, ThreadState::Idle);
    }

    #[test]
    fn apply_writes_all_three_fields() {
        let set = RuleSet::new(&[rule("i", ThreadState::Idle, 0, &["on_idle"])]).unwrap();
        let mut t = thread(&[("on_idle", "/s.py")]);
        set.classify(None, &t).apply(&mut t);
        assert_eq!(t.state, ThreadState::Idle);
        assert_eq!(t.rule.as_deref(), Some("i"));
        assert_eq!(t.decided_by.as_deref(), Some("on_idle (/s.py:1)"));
    }
}
