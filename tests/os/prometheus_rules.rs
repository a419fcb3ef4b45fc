//! The shipped alert rules (`deploy/prometheus/`): `promtool check rules` accepts them and
//! `promtool test rules` passes their unit tests, which would catch a changed rule (a copy
//! with `WedgewatchRequestsStuck`'s `for:` dropped fails them). promtool comes with Debian's
//! `prometheus` package, which `tests/run-all.sh` installs.

use std::path::{Path, PathBuf};
use std::process::Command;

const PROMTOOL: &str = "/usr/bin/promtool";

fn deploy() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/prometheus")
}

/// `promtool ARGS` in `dir`: (success, stdout + stderr).
fn promtool(dir: &Path, args: &[&str]) -> (bool, String) {
    assert!(
        Path::new(PROMTOOL).is_file(),
        "{PROMTOOL} missing: tests/run-all.sh installs it (apt-get install -y prometheus)"
    );
    let out = Command::new(PROMTOOL)
        .args(args)
        .current_dir(dir)
        .output()
        .expect("run promtool");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

#[test]
fn promtool_checks_the_shipped_rules() {
    let (ok, out) = promtool(&deploy(), &["check", "rules", "wedgewatch-rules.yml"]);
    assert!(ok, "{out}");
    assert!(out.contains("SUCCESS: 6 rules found"), "{out}");
}

#[test]
fn promtool_passes_the_rules_unit_tests() {
    let (ok, out) = promtool(&deploy(), &["test", "rules", "wedgewatch-rules.test.yml"]);
    assert!(ok, "{out}");
    assert!(out.contains("SUCCESS"), "{out}");
}

#[test]
fn the_unit_tests_catch_a_stuck_alert_without_its_minute() {
    let tmp = tempfile::tempdir().expect("tmp");
    let rules = std::fs::read_to_string(deploy().join("wedgewatch-rules.yml")).expect("rules");
    let stuck = rules
        .find("alert: WedgewatchRequestsStuck")
        .expect("the stuck alert");
    let (head, tail) = rules.split_at(stuck);
    let broken = format!("{head}{}", tail.replacen("for: 1m", "for: 0s", 1));
    assert_ne!(broken, rules);
    std::fs::write(tmp.path().join("wedgewatch-rules.yml"), broken).expect("write");
    std::fs::copy(
        deploy().join("wedgewatch-rules.test.yml"),
        tmp.path().join("wedgewatch-rules.test.yml"),
    )
    .expect("copy tests");
    let (ok, out) = promtool(tmp.path(), &["test", "rules", "wedgewatch-rules.test.yml"]);
    assert!(
        !ok,
        "the rules tests pass a rule that fires at once:\n{out}"
    );
    assert!(out.contains("WedgewatchRequestsStuck"), "{out}");
}
