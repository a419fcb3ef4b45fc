//! The real-SGLang tier's set-up edits the installed sglang in three places (docs/lab.md
//! "Real SGLang tier"); each edit must match exactly once, so that a new release fails the
//! set-up loudly, naming the edit, instead of being patched blindly. Checked on made-up trees
//! (`sglang_lab.py selftest-edits`, stdlib python3 only): no tier needed, runs everywhere.

use std::path::PathBuf;
use std::process::Command;

use serde_json::Value;

#[test]
fn every_edit_applies_once_and_a_release_that_moved_it_fails_naming_it() {
    let repo = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let dir = std::env::temp_dir().join(format!("ww-sglang-edits-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let out = Command::new("python3")
        .arg(repo.join("tests/lab/sglang/sglang_lab.py"))
        .arg("selftest-edits")
        .arg("--dir")
        .arg(&dir)
        .output()
        .expect("run python3");
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r: Value = serde_json::from_slice(&out.stdout).expect("JSON report");
    let broken = r["broken"].as_array().expect("broken");
    assert_eq!(broken.len(), 3, "{r}");
    assert_eq!(r["first_pass"].as_array().map(Vec::len), Some(3), "{r}");
    assert_eq!(
        r["second_pass"],
        serde_json::json!([]),
        "a second pass is a no-op"
    );
    for b in broken {
        let name = b["edit"].as_str().expect("edit name");
        for case in ["twice", "missing"] {
            let err = b[case]
                .as_str()
                .unwrap_or_else(|| panic!("{name}: {case} did not fail"));
            assert!(
                err.contains(name) && err.contains("does not match exactly once"),
                "{case}: {err}"
            );
        }
    }
}
