//! Every real dump in tests/fixtures/realdumps/ (frames copied from public SGLang/vLLM issue
//! threads, each with its source and true state) classified with the built-in rules.

use std::path::Path;
use wedgewatch::model::{Frame, ThreadStack};
use wedgewatch::probes::ProbeSet;
use wedgewatch::sources::stacks::{RuleSet, STATES};

struct Dump {
    file: String,
    source: String,
    stack: Option<String>,
    expect: String,
    expect_rule: Option<String>,
    thread: ThreadStack,
}

/// `function (file:line)` or `function (lib)` (a native frame: no line).
fn parse_frame(line: &str) -> Frame {
    let (name, rest) = line
        .rsplit_once(" (")
        .unwrap_or_else(|| panic!("frame without ' (': {line:?}"));
    let loc = rest.strip_suffix(')').expect("frame ends with ')'");
    let (file, line_no) = match loc.rsplit_once(':') {
        Some((f, n)) if n.chars().all(|c| c.is_ascii_digit()) && !n.is_empty() => {
            (f, n.parse().unwrap())
        }
        _ => (loc, 0),
    };
    Frame {
        name: name.to_string(),
        file: file.to_string(),
        line: line_no,
    }
}

fn load() -> Vec<Dump> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/realdumps");
    let mut paths: Vec<_> = std::fs::read_dir(&dir)
        .expect("realdumps dir")
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "txt"))
        .collect();
    paths.sort();
    paths
        .iter()
        .map(|p| {
            let text = std::fs::read_to_string(p).unwrap();
            let mut head = std::collections::BTreeMap::new();
            let mut frames = vec![];
            for line in text.lines().filter(|l| !l.trim().is_empty()) {
                if let Some(h) = line.strip_prefix("# ") {
                    let (k, v) = h.split_once(": ").expect("header is '# key: value'");
                    head.insert(k.to_string(), v.to_string());
                } else {
                    frames.push(parse_frame(line));
                }
            }
            let file = p.file_name().unwrap().to_string_lossy().into_owned();
            let need = |k: &str| {
                head.get(k)
                    .cloned()
                    .unwrap_or_else(|| panic!("{file}: no '# {k}:' header"))
            };
            Dump {
                source: need("source"),
                expect: need("expect"),
                stack: head.get("stack").cloned(),
                expect_rule: head.get("expect_rule").cloned(),
                thread: ThreadStack {
                    tid: 1,
                    name: head.get("thread").cloned(),
                    active: false,
                    owns_gil: false,
                    frames,
                    state: String::new(),
                    rule: None,
                },
                file,
            }
        })
        .collect()
}

fn rules() -> RuleSet {
    RuleSet::new(&ProbeSet::builtin().expect("built-in probes").stack_rules).expect("rules")
}

#[test]
fn corpus_is_well_formed() {
    let dumps = load();
    assert!(dumps.len() >= 8, "only {} real dumps", dumps.len());
    for d in &dumps {
        assert!(
            d.source.starts_with("https://github.com/"),
            "{}: source",
            d.file
        );
        assert!(
            STATES.contains(&d.expect.as_str()),
            "{}: unknown state {}",
            d.file,
            d.expect
        );
        assert!(!d.thread.frames.is_empty(), "{}: no frames", d.file);
    }
}

#[test]
fn every_real_dump_gets_its_true_state() {
    let set = rules();
    let mut wrong = vec![];
    for d in load() {
        let (state, rule) = set.classify(d.stack.as_deref(), &d.thread);
        let rule_ok = d.expect_rule.is_none() || d.expect_rule == rule;
        if state != d.expect || !rule_ok {
            wrong.push(format!(
                "{}: got {state} ({rule:?}), want {} ({:?})  [{}]",
                d.file, d.expect, d.expect_rule, d.source
            ));
        }
    }
    assert!(wrong.is_empty(), "misclassified:\n{}", wrong.join("\n"));
}
