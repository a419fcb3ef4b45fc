//! Versions read from a live process's files through the real `/proc`: a Python process of
//! the lab's venv, discovered by a test profile naming its packages and relevant variables,
//! gets its package versions (from `*.dist-info/METADATA`), its Python version (the venv's
//! `pyvenv.cfg`) and the kernel's release in `wedgewatch snapshot --json`; nothing imported.
//! Needs the lab's venv (`tests/run-all.sh` installs it); skipped loudly without it.

use std::path::Path;
use std::process::{Command, Stdio};

/// Kills the process on every exit path.
struct Child(std::process::Child);

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

const PROFILE: &str = r#"
[[profile]]
name = "versions-test"
stack = "generic"
role = "engine"
match_cmdline = ['wedgewatch-versions-test']
packages = ["orjson", "sglang-router", "not-installed"]
relevant_env = ['^WW_TEST_']
"#;

#[test]
fn a_live_venv_process_gets_its_versions_from_disk() {
    let venv = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/lab/.venv");
    let python = venv.join("bin/python3");
    if !python.exists() {
        eprintln!(
            "SKIPPED: no lab venv at {}; run tests/run-all.sh once",
            venv.display()
        );
        return;
    }
    let metadata = |dist: &str| -> Option<String> {
        let site = std::fs::read_dir(venv.join("lib"))
            .ok()?
            .flatten()
            .next()?
            .path();
        let dir = std::fs::read_dir(site.join("site-packages"))
            .ok()?
            .flatten()
            .find(|e| {
                let n = e.file_name().to_string_lossy().to_string();
                n.starts_with(&format!("{dist}-")) && n.ends_with(".dist-info")
            })?;
        let text = std::fs::read_to_string(dir.path().join("METADATA")).ok()?;
        text.lines()
            .find_map(|l| l.strip_prefix("Version: ").map(str::to_string))
    };
    let tmp = tempfile::tempdir().expect("tmp");
    std::fs::write(tmp.path().join("test.toml"), PROFILE).expect("profile");
    // orjson is a C extension: mapped from site-packages once imported
    let child = Command::new(&python)
        .args([
            "-c",
            "import orjson, time, sys; print('ready', flush=True); time.sleep(120)",
            "wedgewatch-versions-test",
        ])
        .env("WW_TEST_KNOB", "1")
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn python");
    let mut child = Child(child);
    let mut line = String::new();
    use std::io::BufRead;
    let stdout = child.0.stdout.take().expect("stdout");
    std::io::BufReader::new(stdout)
        .read_line(&mut line)
        .expect("ready line");
    assert_eq!(line.trim(), "ready");

    let out = Command::new(env!("CARGO_BIN_EXE_wedgewatch"))
        .arg("--probes")
        .arg(tmp.path())
        .args(["snapshot", "--json", "--no-daemon", "--window", "0"])
        .output()
        .expect("run wedgewatch");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let snap: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let pid = child.0.id();
    let c = snap["components"]
        .as_array()
        .and_then(|a| a.iter().find(|c| c["main_pid"] == pid))
        .unwrap_or_else(|| panic!("pid {pid} not discovered: {}", snap["components"]));
    let v = &c["versions"];
    assert_eq!(v["orjson"].as_str(), metadata("orjson").as_deref(), "{v}");
    assert_eq!(
        v["sglang-router"].as_str(),
        metadata("sglang_router").as_deref(),
        "{v}"
    );
    assert!(v.get("not-installed").is_none(), "{v}");
    assert!(
        v["python"].as_str().is_some_and(|p| p.starts_with("3.")),
        "{v}"
    );
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").expect("osrelease");
    assert_eq!(snap["versions"]["kernel"].as_str(), Some(release.trim()));
    assert_eq!(
        snap["versions"]["wedgewatch"].as_str(),
        Some(env!("CARGO_PKG_VERSION"))
    );
    assert_eq!(c["relevant_env"], serde_json::json!(["WW_TEST_KNOB"]));
}
