//! report.md made for a GitHub issue, and the bug-report loop: the real binary re-renders the
//! report of committed snapshots and of bundles (`wedgewatch report FILE`), every report is
//! parsed as GitHub-flavoured Markdown (pulldown-cmark) and checked to render as meant, and
//! the size cap holds on a stack far larger than a TP8 PD one.

use pulldown_cmark::{Event, Options, Parser, Tag, TagEnd};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};
use wedgewatch::model::Snapshot;

fn fixture_path(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/snapshots")
        .join(format!("{name}.json"))
}

fn fixture(name: &str) -> Snapshot {
    wedgewatch::snapshot::read_snapshot(&fixture_path(name)).expect("fixture is a snapshot")
}

fn run(args: &[&std::ffi::OsStr]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_wedgewatch"))
        .args(args)
        .output()
        .expect("run wedgewatch");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Unescaped `|` in a table line (GFM splits cells on them, even inside code spans).
fn pipes(line: &str) -> usize {
    let b = line.as_bytes();
    (0..b.len())
        .filter(|&i| b[i] == b'|' && (i == 0 || b[i - 1] != b'\\'))
        .count()
}

/// Checks that `md` renders as meant on GitHub:
/// - raw HTML is only our details blocks, one tag line each, balanced (a list item or
///   table swallowed into an HTML block would show as raw HTML lines here);
/// - no text that should have been Markdown is left literal (`- `, `| `, `</details>`);
/// - every table is recognised as one, and each of its rows has the header's cells.
fn check_markdown(md: &str) {
    check_markdown_of(md, false)
}

/// `hostile`: host text carries Markdown on purpose, shown literally (escaped) as it should.
fn check_markdown_of(md: &str, hostile: bool) {
    let mut open = 0i32;
    let mut tables = 0;
    for ev in Parser::new_ext(md, Options::ENABLE_TABLES | Options::ENABLE_STRIKETHROUGH) {
        match ev {
            Event::Html(h) | Event::InlineHtml(h) => {
                let line = h.trim();
                if line == "</details>" {
                    open -= 1;
                    assert!(open >= 0, "</details> without <details>:\n{md}");
                } else if line.starts_with("<details><summary>") && line.ends_with("</summary>") {
                    open += 1;
                } else {
                    panic!("raw HTML that is not a details tag: {line:?}\n{md}");
                }
            }
            Event::Text(t) if !hostile => {
                let t = t.trim_start();
                assert!(
                    !t.starts_with("- ") && !t.starts_with("| ") && !t.contains("</details"),
                    "Markdown left as literal text: {t:?}"
                );
            }
            Event::Start(Tag::Table(_)) => tables += 1,
            Event::End(TagEnd::Table) => {}
            _ => {}
        }
    }
    assert_eq!(open, 0, "unbalanced details blocks");
    // tables: consecutive lines starting with `|`, the second one the separator
    let lines: Vec<&str> = md.lines().collect();
    let mut raw_tables = 0;
    let mut i = 0;
    while i < lines.len() {
        if lines[i].starts_with('|') {
            let start = i;
            while i < lines.len() && lines[i].starts_with('|') {
                i += 1;
            }
            let group = &lines[start..i];
            assert!(
                group.len() >= 2 && group[1].starts_with("| ---"),
                "a table without its separator: {group:?}"
            );
            let n = pipes(group[0]);
            for row in group {
                assert_eq!(
                    pipes(row),
                    n,
                    "row with another cell count: {row}\n{:?}",
                    group[0]
                );
            }
            raw_tables += 1;
        } else {
            i += 1;
        }
    }
    assert_eq!(tables, raw_tables, "every table is parsed as a table");
}

#[test]
fn committed_snapshots_render_as_valid_markdown() {
    for name in ["healthy", "wedged", "degraded"] {
        let md = wedgewatch::report::render(&fixture(name));
        check_markdown(&md);
        assert!(md.len() <= wedgewatch::report::MAX_REPORT);
    }
}

#[test]
fn the_binary_renders_the_report_of_a_snapshot_with_the_verdict_as_title() {
    let path = fixture_path("wedged");
    let (code, md, err) = run(&["report".as_ref(), path.as_os_str()]);
    assert_eq!(code, 0, "{err}");
    check_markdown(&md);
    let first = md.lines().next().unwrap_or_default();
    assert_eq!(
        first,
        "# wedged_request at decode: 2 requests accepted and forgotten since 12:12"
    );
    // the verdict as an alert block right under the title, then the four lines in order
    let alert: Vec<&str> = md
        .lines()
        .skip(2)
        .take_while(|l| l.starts_with('>'))
        .collect();
    assert_eq!(alert.first(), Some(&"> [!CAUTION]"), "{md}");
    assert!(
        alert[1].starts_with("> **critical: 2 requests"),
        "{alert:?}"
    );
    let head: Vec<&str> = md.lines().skip(3 + alert.len()).take(4).collect();
    for (line, label) in head
        .iter()
        .zip(["**Where:**", "**Since:**", "**Evidence:**"])
    {
        assert!(line.starts_with(&format!("- {label}")), "{line}");
    }
    let evidence: Vec<&str> = md
        .lines()
        .skip_while(|l| !l.starts_with("- **Evidence:**"))
        .skip(1)
        .take_while(|l| l.starts_with("  - "))
        .collect();
    let layers: Vec<&str> = evidence
        .iter()
        .filter_map(|l| l.trim_start_matches("  - ").split(':').next())
        .collect();
    assert_eq!(
        layers,
        ["sockets", "stacks", "gpu", "metrics"],
        "{evidence:?}"
    );
    let changed = md
        .lines()
        .find(|l| l.starts_with("- **Changed:**"))
        .unwrap_or_default();
    assert!(
        changed.contains("SGLANG_DECODE_PREALLOC_SPLIT_TOKENS"),
        "{changed}"
    );
}

/// `snapshot -o DIR` writes report.md; `report DIR` renders the same report from the
/// bundle, in text and JSON too; `report` of something else fails with one line, exit 2.
#[test]
fn the_binary_renders_a_bundle_again_and_refuses_other_files() {
    let tmp = tempfile::tempdir().expect("tmp");
    let dir = tmp.path().join("bundle");
    let snap = fixture("wedged");
    wedgewatch::snapshot::write_bundle(
        &snap,
        &Default::default(),
        &dir,
        wedgewatch::snapshot::Overwrite::Refuse,
    )
    .expect("bundle written");
    let written = std::fs::read_to_string(dir.join("report.md")).expect("report.md");
    let (code, md, err) = run(&["report".as_ref(), dir.as_os_str()]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(md, written, "the bundle's report, rendered again");

    let (code, text, err) = run(&[
        "report".as_ref(),
        dir.as_os_str(),
        "--format".as_ref(),
        "text".as_ref(),
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(
        text.starts_with("wedged_request at decode: 2 requests"),
        "{text}"
    );
    assert!(text.contains("  evidence: sockets:"), "{text}");
    let (code, json, err) = run(&["report".as_ref(), dir.as_os_str(), "--json".as_ref()]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&json).expect("JSON");
    assert_eq!(v["evidence"][0]["layer"], "sockets");

    let junk = tmp.path().join("junk.json");
    std::fs::write(&junk, "{\"hello\": 1}").expect("write");
    for bad in [
        junk.as_os_str(),
        "/etc/passwd".as_ref(),
        tmp.path().join("absent").as_os_str(),
    ] {
        let (code, out, err) = run(&["report".as_ref(), bad]);
        assert_eq!(code, 2, "{bad:?}: {out}{err}");
        assert!(out.is_empty(), "nothing on stdout: {out}");
        assert_eq!(err.trim().lines().count(), 1, "one line: {err}");
    }
}

/// The environment is shown as its changes and the variables the stack marks relevant,
/// never whole (the fixture's components carry PATH and HOME).
#[test]
fn environment_is_changes_and_relevant_variables_only() {
    let mut snap = fixture("wedged");
    for c in &mut snap.components {
        c.env
            .insert("PATH".into(), "/usr/local/bin:/usr/bin".into());
        c.env.insert("NCCL_DEBUG".into(), "INFO".into());
        c.relevant_env = vec!["NCCL_DEBUG".into()];
    }
    let md = wedgewatch::report::render(&snap);
    check_markdown(&md);
    assert!(!md.contains("/usr/local/bin:/usr/bin"), "PATH is not shown");
    assert!(md.contains("NCCL_DEBUG=INFO"), "relevant variables are");
    assert!(
        md.contains("SGLANG_DECODE_PREALLOC_SPLIT_TOKENS: (absent) -> 1"),
        "changes are"
    );
}

/// A stack far larger than a TP8 PD one (64 components with long command lines and
/// environments, 512 deep stacks): the report stays under the cap, stays valid Markdown,
/// keeps the verdict and the findings, and says what it left out.
#[test]
fn a_huge_stack_is_capped_saying_what_was_cut() {
    let mut snap = fixture("wedged");
    let proto = snap.components[2].clone();
    let thread = snap.threads.first().cloned();
    for i in 0..64 {
        let mut c = proto.clone();
        c.id = format!("prefill{i}@10.0.0.{i}:31001");
        c.cmdline = (0..200).map(|k| format!("--flag-{k}=value-{k}")).collect();
        c.relevant_env = c.env.keys().cloned().collect();
        for k in 0..100 {
            c.env.insert(format!("SGLANG_VAR_{k}"), "x".repeat(50));
            c.relevant_env.push(format!("SGLANG_VAR_{k}"));
        }
        snap.components.push(c);
        if let Some(t) = &thread {
            for k in 0..8 {
                let mut t = t.clone();
                t.tid = 1000 * i + k;
                t.component = Some(format!("prefill{i}@10.0.0.{i}:31001"));
                t.frames = (0..40)
                    .map(|d| format!("frame_{d} (/x/y/z.py:{d})"))
                    .collect();
                snap.threads.push(t);
            }
        }
    }
    let md = wedgewatch::report::render(&snap);
    assert!(
        md.chars().count() <= 60_000,
        "{} characters",
        md.chars().count()
    );
    check_markdown(&md);
    assert!(md.starts_with("# wedged_request at decode"));
    assert!(md.contains("## Findings"));
    assert!(md.contains("## Cut to fit"), "says it was cut");
    assert!(md.contains("Left out: "), "and what");
    assert!(md.contains("snapshot.json"), "and where the rest is");
}

/// Versions are part of the report, and go through redaction like everything else.
#[test]
fn versions_are_shown_and_redacted() {
    let mut snap = fixture("wedged");
    snap.versions.insert("kernel".into(), "6.8.0-test".into());
    snap.components[2]
        .versions
        .insert("sglang".into(), "0.5.4".into());
    // a version string is host text like any other
    snap.components[2].versions.insert(
        "torch".into(),
        "2.5.0 https://user:hunter2-secret@example.com/x".into(),
    );
    let md = wedgewatch::report::render(&snap);
    check_markdown(&md);
    assert!(md.contains("| kernel | 6.8.0-test |"), "{md}");
    assert!(md.contains("sglang 0.5.4"));
    assert!(!md.contains("hunter2-secret"), "redacted");
    assert!(md.contains("nvidia_driver | unknown (no NVML here)"));
}

/// Hostile strings cannot break the Markdown: pipes, backticks, `</details>`, a list
/// marker and HTML in a summary, a thread name, a command line and an environment value.
#[test]
fn hostile_host_text_cannot_break_the_markdown() {
    let mut snap = fixture("wedged");
    let evil = "a|b `c` </details>\n- item <script>x</script> ```\n| x | y |";
    for f in &mut snap.findings {
        f.summary = format!("{} {evil}", f.summary);
    }
    for c in &mut snap.components {
        c.id = format!("{}{evil}", c.id);
        c.cmdline.push(evil.into());
        c.env.insert("NCCL_EVIL".into(), evil.into());
        c.relevant_env = vec!["NCCL_EVIL".into()];
    }
    for t in &mut snap.threads {
        t.name = Some(evil.into());
        t.frames.push(evil.into());
    }
    let md = wedgewatch::report::render(&snap);
    // raw HTML: only our details tags (a `<script>` in a code span is text)
    check_markdown_of(&md, true);
    assert!(md.starts_with("# wedged_request at decode"), "{md}");
}

// ---- hostile markup (issue 34 item 5) ---------------------------------------------------

/// Markup planted in a host string: raw HTML (an image, a link, closing tags), Markdown
/// links, an image and an autolink, backticks to close a code span, a table bar, emphasis,
/// strikethrough, an entity, a backslash, a line break and a heading.
const MARKUP: &str = "<img src=x onerror=alert(1)><a href=\"https://evil.example/\">a</a></summary></details> \
     ` `` ``` [l](https://evil.example/l) ![i](https://evil.example/i.png) <https://evil.example/auto> \
     https://evil.example/bare www.evil.example | *e* _u_ ~~s~~ &lt; \\ \n# h";

/// `v` with the markup appended to every string and put in place of every number that the
/// snapshot still reads so (the untyped process facts), and the keys of its string maps.
fn hostile(v: &serde_json::Value) -> Snapshot {
    use serde_json::Value;
    let mut v = v.clone();
    let mut paths = Vec::new();
    leaves(&v, String::new(), &mut paths);
    for p in paths {
        let Some(old) = v.pointer(&p).cloned() else {
            continue;
        };
        let new = match &old {
            Value::String(s) => Value::from(format!("{s}{MARKUP}")),
            _ => Value::from(MARKUP),
        };
        if let Some(x) = v.pointer_mut(&p) {
            *x = new;
        }
        if serde_json::from_value::<Snapshot>(v.clone()).is_err() {
            if let Some(x) = v.pointer_mut(&p) {
                *x = old;
            }
        }
    }
    let mut s: Snapshot = serde_json::from_value(v).expect("still a snapshot");
    let key = |k: &String| format!("{k}{MARKUP}");
    s.versions = s
        .versions
        .iter()
        .map(|(k, v)| (key(k), v.clone()))
        .collect();
    s.sources = s.sources.iter().map(|(k, v)| (key(k), v.clone())).collect();
    for c in &mut s.components {
        c.env = c.env.iter().map(|(k, v)| (key(k), v.clone())).collect();
        c.relevant_env = c.env.keys().cloned().collect();
        c.versions = c
            .versions
            .iter()
            .map(|(k, v)| (key(k), v.clone()))
            .collect();
        c.sockets = c.sockets.iter().map(|(k, v)| (key(k), *v)).collect();
        c.metrics = c.metrics.iter().map(|(k, v)| (key(k), *v)).collect();
        c.labels = c.labels.iter().map(|(k, v)| (key(k), v.clone())).collect();
    }
    s
}

/// JSON pointers of every string and number in `v`.
fn leaves(v: &serde_json::Value, at: String, out: &mut Vec<String>) {
    use serde_json::Value;
    match v {
        Value::String(_) | Value::Number(_) => out.push(at),
        Value::Array(a) => {
            for (i, x) in a.iter().enumerate() {
                leaves(x, format!("{at}/{i}"), out);
            }
        }
        Value::Object(o) => {
            for (k, x) in o {
                let k = k.replace('~', "~0").replace('/', "~1");
                leaves(x, format!("{at}/{k}"), out);
            }
        }
        _ => {}
    }
}

/// The wedged fixture with every optional part a report shows filled in (node identity,
/// versions, process facts and errors), made hostile.
fn hostile_fixture() -> Snapshot {
    let mut v = serde_json::to_value(fixture("wedged")).expect("json");
    v["node"] =
        serde_json::json!({"name": "nodea", "hostname": "host-a", "addresses": ["10.0.0.1"]});
    v["versions"] = serde_json::json!({"kernel": "6.8", "cuda": "12.4"});
    for c in v["components"].as_array_mut().expect("components") {
        c["versions"] = serde_json::json!({"sglang": "0.5.4"});
        c["container"] = serde_json::json!("ctr");
        for p in c["processes"].as_array_mut().into_iter().flatten() {
            p["nspid"] = serde_json::json!([4101, 7]);
            p["cpu_time_ms"] = serde_json::json!(1200);
            p["errors"] = serde_json::json!([{"field": "environ", "reason": "denied"}]);
        }
    }
    hostile(&v)
}

/// Checks that no markup from a host string is live in `md` as GitHub renders it (parsed
/// by pulldown-cmark with GFM tables): no raw HTML but our details tags (whose summary
/// holds no markup), no link, no image; no text GitHub would link as a bare URL (which
/// pulldown-cmark does not: a text event, split at character references, holding `://` or
/// `www.`); and that the markup is there, as text.
fn assert_inert(md: &str) {
    let mut shown = 0;
    let mut in_code_block = false;
    let parser = Parser::new_ext(md, Options::ENABLE_TABLES | Options::ENABLE_STRIKETHROUGH);
    for (ev, at) in parser.into_offset_iter() {
        let around = md
            .get(at.start.saturating_sub(300)..at.end)
            .unwrap_or_default();
        match ev {
            Event::Html(h) | Event::InlineHtml(h) => {
                let line = h.trim();
                let summary = line
                    .strip_prefix("<details><summary>")
                    .and_then(|l| l.strip_suffix("</summary>"));
                match summary {
                    Some(text) => assert!(
                        !text.contains(['<', '>', '"']),
                        "markup in a summary: {line:?}"
                    ),
                    None => assert_eq!(
                        line, "</details>",
                        "raw HTML from a host string in {around}"
                    ),
                }
            }
            Event::Start(Tag::Link { dest_url, .. }) => panic!("a live link to {dest_url}"),
            Event::Start(Tag::Image { dest_url, .. }) => panic!("a live image of {dest_url}"),
            Event::Start(Tag::CodeBlock(_)) => in_code_block = true,
            Event::End(TagEnd::CodeBlock) => in_code_block = false,
            Event::Text(t) if !in_code_block => {
                let lower = t.to_lowercase();
                assert!(
                    !lower.contains("://") && !lower.contains("www."),
                    "a bare URL GitHub would link: {t:?} in {around}"
                );
                shown += usize::from(t.contains("<img src=x onerror"));
            }
            Event::Code(t) if t.contains("<img src=x onerror") => shown += 1,
            _ => {}
        }
    }
    assert!(shown >= 20, "the markup is shown as text ({shown} times)");
}

/// Markup in every string field of a snapshot (ids, process facts, the stuck table's
/// client and server, node, versions, environment, stacks...) stays text in report.md.
#[test]
fn markup_in_any_host_string_stays_text_in_the_report() {
    let md = wedgewatch::report::render_capped(&hostile_fixture(), usize::MAX);
    assert!(md.contains("## Stuck requests"), "{md}");
    check_markdown_of(&md, true);
    assert_inert(&md);
}

/// The same after `merge`: the node names, the nodes left out and why, the namespaced ids.
#[test]
fn markup_in_any_host_string_stays_text_after_merge() {
    use wedgewatch::merge::{self, NodeInput};
    let node = |s: Snapshot, source: &str| NodeInput {
        source: source.into(),
        snapshot: s,
        name: None,
        collected: None,
    };
    let mut b = hostile(&serde_json::to_value(fixture("degraded")).expect("json"));
    b.node = None;
    let failed = wedgewatch::model::FailedNode {
        name: format!("nodec{MARKUP}"),
        reason: MARKUP.into(),
    };
    let merged = merge::merge(
        vec![node(hostile_fixture(), "a.json"), node(b, "b.json")],
        vec![failed],
    )
    .expect("merges");
    let md = wedgewatch::report::render_capped(&merged, usize::MAX);
    assert!(md.contains("## Nodes (2)"), "{md}");
    check_markdown_of(&md, true);
    assert_inert(&md);
}

// ---- scale (issue 34 item 14) -----------------------------------------------------------

/// The wedged fixture with `n` stuck requests at decode, each with its leg among `n`
/// exchanges (listed in the other order, as a busy node's table may be).
fn many_stuck(n: usize) -> Snapshot {
    use wedgewatch::model::{LogicalRequest, Verdict};
    let mut s = fixture("wedged");
    let proto = s.requests[0].clone();
    let lproto = s
        .logical_requests
        .iter()
        .find(|l| l.verdict == Verdict::Stuck)
        .cloned()
        .expect("a stuck request in the fixture");
    s.requests = (0..n)
        .rev()
        .map(|i| {
            let mut r = proto.clone();
            r.id = format!("x{i}");
            r.leg = Some(format!("r{i}@decode"));
            r.request = Some(format!("r{i}"));
            r.client = format!("10.1.{}.{}:{}", i / 60_000, i % 250, 20_000 + i % 40_000);
            r
        })
        .collect();
    s.logical_requests = (0..n)
        .map(|i| LogicalRequest {
            id: format!("r{i}"),
            legs: vec![format!("x{i}")],
            stuck_leg: Some(format!("r{i}@decode")),
            ..lproto.clone()
        })
        .collect();
    s
}

/// Rendering is linear in the requests (issue 34 item 14: 40k stuck requests x 40k
/// exchanges took 10.6 s, each stuck row searching every exchange for its leg). Measured
/// against the pass every output does first over the same snapshot (taken `--no-redact`,
/// so that pass is its linear round trip and control-character scan, and the search is
/// not hidden behind redaction): the larger of a run before and one after, so a busy
/// machine slows the bound too. The whole render stays within 4 times it (1.2 measured in
/// a debug build; 7.3 with the search).
#[test]
fn rendering_many_stuck_requests_is_linear() {
    let mut s = many_stuck(24_000);
    s.redacted = false;
    let redact = || {
        let t = Instant::now();
        let out = wedgewatch::redact::for_output(&[&s], false);
        assert!(out.is_some_and(|v| v[0].requests.len() == 24_000));
        t.elapsed()
    };
    let before = redact();
    let t = Instant::now();
    let md = wedgewatch::report::render(&s);
    let render = t.elapsed();
    let floor = before.max(redact());
    eprintln!("24k stuck requests: render {render:?}, the output pass {floor:?}");
    assert!(
        md.contains("stuck requests"),
        "the table, or that it was cut: {md}"
    );
    assert!(
        render < floor * 4,
        "render {render:?} against the output pass {floor:?}: more than linear"
    );
}

/// The wedged fixture with `n` more engines, each the child of the last one, with a
/// changed environment variable each.
fn many_components(n: usize) -> Snapshot {
    let mut s = fixture("wedged");
    let proto = s.components[2].clone();
    let change = s.config_changed[0].clone();
    let id = |i: usize| format!("decode{i}@10.2.{}.{}:30000", i / 250, i % 250);
    for i in 0..n {
        let mut c = proto.clone();
        c.id = id(i);
        c.parent = Some(id(n - 1));
        c.env.insert(format!("KNOB_{i}"), "1".into());
        s.components.push(c);
        let mut x = change.clone();
        x.component = id(i);
        x.key = Some(format!("KNOB_{i}"));
        s.config_changed.push(x);
    }
    s
}

/// This thread's CPU time: unlike the wall clock, it does not grow while a loaded machine
/// gives the core to others.
fn thread_cpu() -> Duration {
    use nix::time::{clock_gettime, ClockId};
    let t = clock_gettime(ClockId::CLOCK_THREAD_CPUTIME_ID).expect("thread CPU clock");
    Duration::from(t)
}

/// The same for many components: each block looks its parent and its changes up in an
/// index built once (a scan per component was quadratic): within 5 times the output pass,
/// in this thread's CPU time (1.8 measured in a debug build; 9.9 with the scans).
#[test]
fn rendering_many_components_is_linear() {
    let mut s = many_components(16_000);
    s.redacted = false;
    let pass = || {
        let t = thread_cpu();
        let out = wedgewatch::redact::for_output(&[&s], false);
        assert!(out.is_some_and(|v| v[0].components.len() > 16_000));
        thread_cpu() - t
    };
    let before = pass();
    let t = thread_cpu();
    let md = wedgewatch::report::render(&s);
    let render = thread_cpu() - t;
    let floor = before.max(pass());
    eprintln!("16k components: render {render:?}, the output pass {floor:?}");
    assert!(md.contains("## Cut to fit"), "{md}");
    assert!(
        render < floor * 5,
        "render {render:?} against the output pass {floor:?}: more than linear"
    );
}

/// The diagram sources of every ```mermaid block of `md`.
fn mermaid_blocks(md: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = md;
    while let Some(i) = rest.find("```mermaid\n") {
        let body = &rest[i + 11..];
        let end = body.find("\n```").expect("a closed mermaid block");
        out.push(body[..end].to_string());
        rest = &body[end..];
    }
    out
}

/// What the real Mermaid library (tests/mermaid/setup.sh installs it) reads in each diagram:
/// `{ok, error, vertices: [{id, text, classes}], edges: [{start, end, text}], classes}`.
fn mermaid_read(diagrams: &[String]) -> Vec<serde_json::Value> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/mermaid");
    let js = dir.join(".mermaid/mermaid.min.js");
    assert!(
        js.is_file(),
        "the Mermaid library is not installed: run tests/mermaid/setup.sh ({} missing)",
        js.display()
    );
    let mut child = Command::new("node")
        .arg(dir.join("check.js"))
        .arg(&js)
        .env("NODE_PATH", "/usr/share/nodejs")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("node (tests/mermaid/setup.sh installs it)");
    let input = serde_json::to_vec(diagrams).expect("json");
    std::io::Write::write_all(&mut child.stdin.take().expect("stdin"), &input).expect("write");
    let out = child.wait_with_output().expect("node ran");
    assert!(out.status.success(), "check.js failed: {:?}", out.status);
    serde_json::from_slice(&out.stdout).expect("check.js prints JSON")
}

/// The stuck requests' path is one Mermaid flowchart that the real Mermaid parser reads:
/// a node per hop, an edge per hop link, the hop where they are stuck marked (class
/// `blamed`) and saying for how long; the table names requests and their path readably.
#[test]
fn the_stuck_path_is_a_flowchart_the_real_mermaid_parser_reads() {
    let md = wedgewatch::report::render(&fixture("demo-wedge"));
    check_markdown(&md);
    let blocks = mermaid_blocks(&md);
    assert_eq!(blocks.len(), 1, "{md}");
    let read = mermaid_read(&blocks);
    let g = &read[0];
    assert_eq!(g["ok"], true, "{g}");
    assert_eq!(g["type"], "flowchart-v2", "{g}");
    let text_of = |id: &str| -> String {
        g["vertices"]
            .as_array()
            .expect("vertices")
            .iter()
            .find(|v| v["id"] == id)
            .and_then(|v| v["text"].as_str())
            .unwrap_or_default()
            .to_string()
    };
    let vertices = g["vertices"].as_array().expect("vertices");
    let names: Vec<String> = vertices
        .iter()
        .map(|v| text_of(v["id"].as_str().unwrap_or("")))
        .map(|t| t.split("<br>").next().unwrap_or("").to_string())
        .collect();
    assert_eq!(names, ["proxy", "router", "prefill", "decode"], "{g}");
    let blamed: Vec<&serde_json::Value> = vertices
        .iter()
        .filter(|v| {
            v["classes"]
                .as_array()
                .is_some_and(|c| c.iter().any(|x| x == "blamed"))
        })
        .collect();
    assert_eq!(blamed.len(), 1, "{g}");
    let decode = text_of(blamed[0]["id"].as_str().unwrap_or(""));
    assert!(
        decode.starts_with("decode<br>STUCK HERE: 3 requests, no response byte for 31 s"),
        "{decode}"
    );
    let edge = |a: &str, b: &str| {
        let id = |n: &str| vertices[names.iter().position(|x| x == n).expect(n)]["id"].clone();
        g["edges"]
            .as_array()
            .expect("edges")
            .iter()
            .any(|e| e["start"] == id(a) && e["end"] == id(b) && e["text"] == "3 requests")
    };
    assert!(
        edge("proxy", "router") && edge("router", "decode") && edge("router", "prefill"),
        "{g}"
    );
    assert_eq!(g["edges"].as_array().map(Vec::len), Some(3), "{g}");
    assert!(
        md.contains(
            "| `r21` | proxy -&gt; router -&gt; prefill + decode | decode | no response byte |"
        ) && md.contains("| `r36` | proxy -&gt; router -&gt; prefill + decode |"),
        "{md}"
    );
}

/// `s` with a second component of each role, so the lines name hops by their ids.
fn named_by_id(mut s: Snapshot) -> Snapshot {
    let twins: Vec<_> = s
        .components
        .iter()
        .map(|c| {
            let mut t = c.clone();
            t.id = format!("twin-{}", c.id);
            t
        })
        .collect();
    s.components.extend(twins);
    s
}

/// Markup in every host string (hop names are ids here) never adds a node, an edge or a
/// block to the diagram: the real parser reads the same graph as without it.
#[test]
fn markup_in_host_strings_stays_label_text_in_the_diagram() {
    let md = wedgewatch::report::render_capped(&named_by_id(hostile_fixture()), usize::MAX);
    let plain = wedgewatch::report::render_capped(&named_by_id(fixture("wedged")), usize::MAX);
    let (blocks, plain_blocks) = (mermaid_blocks(&md), mermaid_blocks(&plain));
    assert_eq!(blocks.len(), 1, "{md}");
    let read = mermaid_read(&[blocks[0].clone(), plain_blocks[0].clone()]);
    assert_eq!(read[0]["ok"], true, "{}", read[0]);
    let shape = |g: &serde_json::Value| {
        (
            g["vertices"].as_array().map(Vec::len),
            g["edges"].as_array().map(Vec::len),
            g["classes"].clone(),
        )
    };
    assert_eq!(shape(&read[0]), shape(&read[1]), "{}", read[0]);
    assert!(
        blocks[0].contains("#60;img src#61;x onerror#61;alert(1)#62;"),
        "{}",
        blocks[0]
    );
}

/// The demo's incident: decode restarted with an added variable, and 4 s later the first
/// request was never answered. The time line joins them, names the variable as the suspect,
/// stands in the verdict's alert block, and fits the contract.
#[test]
fn the_cause_time_line_joins_the_change_to_the_first_stuck_request() {
    let s = fixture("demo-wedge");
    let cause = wedgewatch::model::cause::of(&s).expect("a time line");
    let lines: Vec<String> = cause.events.iter().map(|e| e.line()).collect();
    assert_eq!(
        lines,
        [
            "09:29:48 proxy appeared",
            "09:29:52 decode restarted with +SGLANG_DECODE_PREALLOC_SPLIT_TOKENS=100",
            "09:29:56 first request never answered at decode (r21; 3 stuck)",
        ]
    );
    let suspect = cause.suspect.as_ref().expect("a suspect");
    assert_eq!(suspect.name, "decode");
    assert_eq!(
        suspect.changes,
        ["+SGLANG_DECODE_PREALLOC_SPLIT_TOKENS=100"]
    );
    assert!(
        suspect.why.contains("4 s before the first stuck request"),
        "{suspect:?}"
    );

    let md = wedgewatch::report::render(&s);
    let alert: Vec<&str> = md
        .lines()
        .skip(2)
        .take_while(|l| l.starts_with('>'))
        .collect();
    assert_eq!(alert[0], "> [!CAUTION]");
    assert!(
        alert.iter().any(|l| l.starts_with("> **Timeline:** ")
            && l.contains("09:29:52 decode restarted with +SGLANG_DECODE_PREALLOC_SPLIT_TOKENS=100 -&gt; 09:29:56 first request never answered")),
        "{alert:?}"
    );
    assert!(
        alert
            .iter()
            .any(|l| l
                .starts_with("> **Suspect:** decode: +SGLANG_DECODE_PREALLOC_SPLIT_TOKENS=100")),
        "{alert:?}"
    );

    let mut with = s.clone();
    with.cause = Some(cause);
    let v = serde_json::to_value(&with).expect("json");
    let schema: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/schema/snapshot-1.schema.json"),
        )
        .expect("schema"),
    )
    .expect("schema json");
    let validator = jsonschema::validator_for(&schema).expect("compiles");
    assert!(
        validator.is_valid(&v),
        "{:?}",
        validator
            .iter_errors(&v)
            .map(|e| e.to_string())
            .collect::<Vec<_>>()
    );
    let mut bad = v;
    bad["cause"]["events"][0]["kind"] = serde_json::json!("exploded");
    assert!(
        !validator.is_valid(&bad),
        "an event kind is one of the contract's"
    );
}

/// The change table fits a GitHub issue: two columns, one row per fact (child processes
/// that repeat their engine's change are not repeated), long values clipped in the table
/// and given whole in a folded block.
#[test]
fn the_change_table_is_one_row_per_fact_and_fits_an_issue() {
    let md = wedgewatch::report::render(&fixture("demo-wedge"));
    let start = md
        .find("## Changed since the baseline")
        .expect("the section");
    let rows: Vec<&str> = md[start..]
        .lines()
        .skip_while(|l| !l.starts_with('|'))
        .take_while(|l| l.starts_with('|'))
        .collect();
    assert_eq!(
        rows,
        [
            "| hop | change |",
            "| --- | --- |",
            "| decode | env SGLANG_DECODE_PREALLOC_SPLIT_TOKENS: (absent) -&gt; 100 |",
            "| decode | restarted: pid 15151 (09:29:46) -&gt; pid 15436 (09:29:52) |",
            "| proxy | appeared |",
        ],
        "{md}"
    );
    let mut s = fixture("demo-wedge");
    s.config_changed[0].after = Some("x".repeat(500));
    let md = wedgewatch::report::render(&s);
    let start = md
        .find("## Changed since the baseline")
        .expect("the section");
    let section = &md[start..md[start..].find("## Stuck").map_or(md.len(), |e| start + e)];
    for row in section.lines().filter(|l| l.starts_with('|')) {
        let shown = row.replace("&gt;", ">");
        assert!(shown.chars().count() <= 100, "wider than an issue: {row}");
    }
    assert!(
        section.contains("<details><summary>Whole values</summary>"),
        "{section}"
    );
    assert!(
        section.contains(&"x".repeat(500)),
        "the whole value is kept"
    );
    check_markdown(&md);
}

/// The decisive stack comes first: the blamed hop's scheduler opens the folded sections.
#[test]
fn the_blamed_hops_scheduler_stack_is_the_first_folded_section() {
    let md = wedgewatch::report::render(&fixture("demo-wedge"));
    let summaries: Vec<&str> = md
        .lines()
        .filter_map(|l| l.strip_prefix("<details><summary>"))
        .collect();
    assert!(
        summaries[0].starts_with("thread stacks of scheduler@decode@127.0.0.1:22338"),
        "{summaries:?}"
    );
    let ix = |p: &str| summaries.iter().position(|s| s.starts_with(p)).expect(p);
    assert!(ix("thread stacks of decode@") < ix("Evidence of every finding"));
    assert!(ix("thread stacks of prefill@") > ix("Evidence of every finding"));
}

/// The README shows a user what they get and how to start on their own stack (issue 37):
/// a capture of the UI, the top of report.md exactly as `report` renders the demo's
/// snapshot, a section for one's own stack (with the healthy baseline `config_changed`
/// needs), how to copy the binary to a node without Rust, and every file of `deploy/`.
#[test]
fn the_readme_shows_the_output_and_the_way_onto_ones_own_stack() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let readme = std::fs::read_to_string(root.join("README.md")).expect("README");
    let section = |h: &str| -> &str {
        let start = readme
            .find(&format!("\n## {h}\n"))
            .unwrap_or_else(|| panic!("no {h}"));
        let rest = &readme[start + 4 + h.len()..];
        &rest[..rest.find("\n## ").unwrap_or(rest.len())]
    };
    let looks = section("What it looks like");
    assert!(
        looks.contains("```text\nwedgewatch REPLAY"),
        "a capture of the UI"
    );
    let quoted = looks
        .split("```markdown\n")
        .nth(1)
        .and_then(|b| b.split("\n```").next())
        .expect("the top of a report");
    let md = wedgewatch::report::render(&fixture("demo-wedge"));
    assert!(
        md.starts_with(quoted),
        "the README quotes the report as it is rendered:\n{quoted}\n---\n{md}"
    );
    let own = section("On your own stack");
    assert!(
        own.contains("healthy")
            && own.contains("config_changed")
            && own.contains("known-good.json"),
        "{own}"
    );
    let copy = section("Getting the binary onto a GPU node without Rust");
    assert!(
        copy.contains("cargo build --release") && copy.contains("scp "),
        "{copy}"
    );
    let mut files = Vec::new();
    let mut dirs = vec![root.join("deploy")];
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(&d).expect("deploy").flatten() {
            let p = e.path();
            if p.is_dir() {
                dirs.push(p);
            } else {
                files.push(
                    p.strip_prefix(root)
                        .expect("under root")
                        .display()
                        .to_string(),
                );
            }
        }
    }
    assert!(files.len() >= 4, "{files:?}");
    for f in files {
        let name = f.rsplit('/').next().unwrap_or(&f).to_string();
        assert!(
            own.contains(&f) || own.contains(&name),
            "README's deploy table lacks {f}"
        );
    }
}
