//! Redaction: planted secrets (env, cmdline flags, URL credentials) never appear in stdout or
//! any file of the bundle; names stay visible; `--no-redact` shows them and says so.

use wedgewatch_testkit::shapes;

use shapes::{fixture_proc, free_port, wedgewatch, Shape};
use std::path::Path;

const PLANTED: &[&str] = &[
    "sk-planted-env-4242",
    "hf_planted_token_77",
    "planted-db-pass",
    "planted-cli-key-9",
    "planted-eq-token-3",
    "planted-url-pw",
    "planted-db-pass-5",
    "planted-gh-pat-6",
    "planted-json-env-7",
    "plantedsentrykey0123",
    "planted-query-13",
    "planted-bearer-14",
    "planted-positional-15",
    "planted-json-arg-16",
];

fn all_files(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    for e in std::fs::read_dir(dir).expect("ls").flatten() {
        let p = e.path();
        if p.is_dir() {
            all_files(&p, out);
        } else {
            out.push(p);
        }
    }
}

fn start_stack(d: u16, r: u16) -> (Shape, Shape) {
    let engine = Shape::engine(
        "decode",
        d,
        1,
        &[
            "--api-key",
            "planted-cli-key-9",
            "--hf-token=planted-eq-token-3",
            "--url",
            "http://h/v1?api_key=planted-query-13",
            "-H",
            "Authorization: Bearer planted-bearer-14",
            "model.api_key=planted-positional-15",
            "--cfg",
            r#"{"token": "planted-json-arg-16"}"#,
        ],
        &[
            ("OPENAI_API_KEY", "sk-planted-env-4242"),
            ("HF_TOKEN", "hf_planted_token_77"),
            (
                "DATABASE_URL",
                "postgres://app:planted-db-pass@db.internal:5432/x",
            ),
            ("DB_PASS", "planted-db-pass-5"),
            ("GH_PAT", "planted-gh-pat-6"),
            ("MODEL_CFG", r#"{"api_key": "planted-json-env-7"}"#),
            (
                "ERROR_REPORTING",
                "https://plantedsentrykey0123@o1.ingest.example/1",
            ),
        ],
    );
    let (rs, durl) = (
        r.to_string(),
        format!("http://svc:planted-url-pw@127.0.0.1:{d}"),
    );
    let router = Shape::start(
        &[
            "timeout",
            "60",
            "python3",
            "-m",
            "sglang_router.launch_router",
            "--host",
            "127.0.0.1",
            "--port",
            &rs,
            "--worker-urls",
            &durl,
            "--prometheus-port",
            "0",
        ],
        &[],
    );
    (engine, router)
}

#[test]
fn secrets_never_leave_redacted() {
    let (d, r) = (free_port(), free_port());
    let (engine, router) = start_stack(d, r);
    let tmp = tempfile::tempdir().expect("tmp");
    let dir = tmp.path().join("b");
    let out = wedgewatch()
        .args(["snapshot", "--json", "-o"])
        .arg(&dir)
        .output()
        .expect("run");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let mut files = Vec::new();
    all_files(&dir, &mut files);
    assert!(files.len() >= 4, "{files:?}");
    let mut texts = vec![
        ("stdout".to_string(), stdout.clone()),
        ("stderr".to_string(), stderr),
    ];
    for f in &files {
        texts.push((
            f.display().to_string(),
            std::fs::read_to_string(f).expect("read"),
        ));
    }
    for (name, text) in &texts {
        for s in PLANTED {
            assert!(!text.contains(s), "{s} leaked into {name}");
        }
    }
    // the snapshot really contains our processes, names visible, values redacted
    let v: serde_json::Value = serde_json::from_str(&stdout).expect("json");
    assert_eq!(v["redacted"], true);
    let id = format!("decode@127.0.0.1:{d}");
    let c = v["components"]
        .as_array()
        .and_then(|a| a.iter().find(|c| c["id"] == id.as_str()))
        .expect("engine component");
    assert_eq!(c["env"]["OPENAI_API_KEY"], "<redacted>");
    assert_eq!(c["env"]["HF_TOKEN"], "<redacted>");
    assert_eq!(c["env"]["DB_PASS"], "<redacted>");
    assert_eq!(c["env"]["GH_PAT"], "<redacted>");
    assert_eq!(c["env"]["MODEL_CFG"], r#"{"api_key": "<redacted>"}"#);
    assert_eq!(
        c["env"]["DATABASE_URL"],
        "postgres://app:<redacted>@db.internal:5432/x"
    );
    let cmd: Vec<&str> = c["cmdline"]
        .as_array()
        .expect("cmdline")
        .iter()
        .filter_map(|x| x.as_str())
        .collect();
    assert!(
        cmd.windows(2).any(|w| w == ["--api-key", "<redacted>"]),
        "{cmd:?}"
    );
    assert!(cmd.contains(&"--hf-token=<redacted>"), "{cmd:?}");
    let rid = format!("router@127.0.0.1:{r}");
    let rc = v["components"]
        .as_array()
        .and_then(|a| a.iter().find(|c| c["id"] == rid.as_str()))
        .expect("router component");
    assert!(
        rc["cmdline"]
            .as_array()
            .expect("cmdline")
            .iter()
            .any(|x| x.as_str().is_some_and(|s| s.contains("svc:<redacted>@"))),
        "{}",
        rc
    );
    drop((engine, router));
}

#[test]
fn no_redact_shows_and_says_so() {
    let (d, r) = (free_port(), free_port());
    let (engine, router) = start_stack(d, r);
    let tmp = tempfile::tempdir().expect("tmp");
    let dir = tmp.path().join("b");
    let out = wedgewatch()
        .args(["snapshot", "--no-redact", "--json", "-o"])
        .arg(&dir)
        .output()
        .expect("run");
    assert!(out.status.success());
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("sk-planted-env-4242"));
    let v: serde_json::Value = serde_json::from_str(&stdout).expect("json");
    assert_eq!(v["redacted"], false);
    let report = std::fs::read_to_string(dir.join("report.md")).expect("report");
    assert!(report.contains("--no-redact"), "the report states it");
    drop((engine, router));
}

/// Planted in the `leaky` fake /proc tree (tests/fixtures/proc/make_fixtures.py).
const LEAKY_PLANTED: &[&str] = &[
    "planted-pass-5",
    "planted-gh-pat-6",
    "planted-json-env-7",
    "plantedsentrykey0123",
    "planted-query-13",
    "planted-bearer-14",
    "planted-positional-15",
    "planted-json-arg-16",
];

fn snapshot_of_tree(tree: &str, dir: &Path) -> String {
    let out = wedgewatch()
        .args([
            "snapshot",
            "--json",
            "--no-daemon",
            "--window",
            "0",
            "--proc-root",
        ])
        .arg(fixture_proc(tree))
        .arg("-o")
        .arg(dir)
        .output()
        .expect("run");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn assert_clean(name: &str, text: &str) {
    for s in LEAKY_PLANTED {
        assert!(!text.contains(s), "{s} leaked into {name}");
    }
    assert!(
        !text.contains('\u{1b}') && !text.contains('\u{7}'),
        "raw control characters in {name}"
    );
}

#[test]
fn a_leaky_proc_tree_leaks_nothing_through_the_cli() {
    let tmp = tempfile::tempdir().expect("tmp");
    let (a, b) = (tmp.path().join("a"), tmp.path().join("b"));
    let leaky = snapshot_of_tree("leaky", &b);
    assert_clean("stdout", &leaky);
    for n in [
        "DB_PASS",
        "GH_PAT",
        "MODEL_CFG",
        "model.api_key",
        "EVIL_TITLE",
    ] {
        assert!(leaky.contains(n), "name {n} stays visible");
    }
    let mut files = Vec::new();
    all_files(&b, &mut files);
    assert!(files.iter().any(|f| f.ends_with("report.md")), "{files:?}");
    for f in &files {
        assert_clean(
            &f.display().to_string(),
            &std::fs::read_to_string(f).expect("read"),
        );
    }
    // diff against the same engine without the leaks: text and JSON
    snapshot_of_tree("container", &a);
    for json in [false, true] {
        let mut cmd = wedgewatch();
        cmd.arg("diff")
            .arg(a.join("snapshot.json"))
            .arg(b.join("snapshot.json"));
        if json {
            cmd.arg("--json");
        }
        let out = cmd.output().expect("diff");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            text.contains("EVIL_TITLE"),
            "the diff shows the change: {text}"
        );
        assert_clean(if json { "diff --json" } else { "diff" }, &text);
    }
}

/// `Basic <base64 of user:password>` is a credential by its shape, under any name (issue 34
/// item 12): in an environment value, a header-like command-line argument and a header
/// inside a JSON value, none of them under a secret name. The scheme and the names stay.
#[test]
fn basic_credentials_are_redacted_wherever_they_appear() {
    // base64 of `planted-user:planted-basic-17` and of `svc:planted-basic-18`
    const ENV: &str = "cGxhbnRlZC11c2VyOnBsYW50ZWQtYmFzaWMtMTc=";
    const ARG: &str = "c3ZjOnBsYW50ZWQtYmFzaWMtMTg=";
    let engine = Shape::engine(
        "decode",
        free_port(),
        1,
        &["--upstream-header", &format!("X-Upstream: Basic {ARG}")],
        &[
            ("UPSTREAM_HDR", &format!("Basic {ENV}")),
            (
                "PROXY_CFG",
                &format!(r#"{{"headers": {{"X-Up": "basic {ARG}"}}}}"#),
            ),
        ],
    );
    let snap = shapes::snapshot_of(&[engine.pid], true);
    let text = serde_json::to_string(&snap).expect("json");
    assert!(text.contains("UPSTREAM_HDR"), "the engine was seen: {text}");
    for planted in [ENV, ARG] {
        assert!(!text.contains(planted), "{planted} leaked: {text}");
    }
    assert!(text.contains("Basic <redacted>"), "{text}");
    let md = wedgewatch::report::render(&snap);
    assert!(!md.contains(ENV) && !md.contains(ARG), "{md}");
    drop(engine);
}
