//! `wedgewatch check`: a monitoring-plugin check (Nagios, Icinga, Consul, Sensu). One status
//! line, then one line per finding; exit 0 OK, 1 WARNING, 2 CRITICAL, 3 UNKNOWN (could not
//! sample, bad input, or a usage error: a check that cannot run must not page as CRITICAL).

use super::exit::code;
use super::options::Sampling;
use super::source::{self, SourceArgs};
use clap::{Args, ValueEnum};
use serde::Serialize;
use std::path::PathBuf;
use wedgewatch::model::{Finding, Severity, Snapshot};
use wedgewatch::snapshot;

/// The least severity that counts as found (`--fail-on`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum FailOn {
    /// Exit 0 whatever was found.
    Never,
    /// Any finding.
    Info,
    /// A warning or critical finding.
    Warning,
    /// A critical finding only.
    Critical,
}

impl FailOn {
    fn least(self) -> Option<Severity> {
        match self {
            FailOn::Never => None,
            FailOn::Info => Some(Severity::Info),
            FailOn::Warning => Some(Severity::Warning),
            FailOn::Critical => Some(Severity::Critical),
        }
    }

    /// The most severe finding that counts, if any.
    pub fn worst(self, findings: &[Finding]) -> Option<Severity> {
        let least = self.least()?;
        findings
            .iter()
            .map(|f| f.severity)
            .filter(|s| *s >= least)
            .max()
    }
}

pub const EXAMPLES: &str = "\
Examples:
  wedgewatch check                        # live: the daemon's view, else a 3 s sample
  wedgewatch check --fail-on critical     # warnings are listed but the check stays OK
  wedgewatch check --json                 # the same as JSON (schema wedgewatch.check/1)
  wedgewatch check --from rec.wwrec --at -10s
  wedgewatch check --baseline noon.json     # a change since noon is a WARNING

Exit status (monitoring-plugin convention):
  0 OK        nothing at or above --fail-on
  1 WARNING   a warning finding (and none critical)
  2 CRITICAL  a critical finding
  3 UNKNOWN   could not sample, bad input, or a usage error";

#[derive(Debug, Args)]
#[command(after_help = EXAMPLES)]
pub struct CheckArgs {
    /// The least severity that makes the check fail. Info findings never raise the
    /// status above WARNING.
    #[arg(long, value_enum, default_value = "warning", value_name = "SEVERITY")]
    pub fail_on: FailOn,
    /// Print the result as JSON (schema wedgewatch.check/1) instead of plugin lines.
    #[arg(long)]
    pub json: bool,
    /// Compare with this earlier snapshot: what changed since is a config_changed finding.
    #[arg(long, value_name = "FILE")]
    pub baseline: Option<PathBuf>,
    #[command(flatten)]
    pub source: SourceArgs,
    #[command(flatten)]
    pub sampling: Sampling,
}

/// The plugin status of a check.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum Status {
    Ok,
    Warning,
    Critical,
    Unknown,
}

impl Status {
    fn of(worst: Option<Severity>) -> Status {
        match worst {
            None => Status::Ok,
            Some(Severity::Critical) => Status::Critical,
            Some(_) => Status::Warning,
        }
    }

    pub fn code(self) -> i32 {
        match self {
            Status::Ok => code::OK,
            Status::Warning => 1,
            Status::Critical => 2,
            Status::Unknown => code::UNSAMPLED,
        }
    }

    fn word(self) -> &'static str {
        match self {
            Status::Ok => "OK",
            Status::Warning => "WARNING",
            Status::Critical => "CRITICAL",
            Status::Unknown => "UNKNOWN",
        }
    }
}

/// `wedgewatch.check/1`.
#[derive(Debug, Serialize)]
struct CheckJson<'a> {
    schema: &'static str,
    status: Status,
    exit_code: i32,
    #[serde(skip_serializing_if = "Option::is_none")]
    taken_at: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<&'a str>,
    findings: &'a [Finding],
}

pub fn run(top: Sampling, a: CheckArgs) -> anyhow::Result<i32> {
    let s = Sampling::merge(top, a.sampling);
    let mut parts = source::parts(&s, &a.source, wedgewatch::model::RawFiles::All)?;
    let opts = s.assemble();
    if let Some(base) = &a.baseline {
        super::snapshot::against_baseline(&mut parts, base, &opts)?;
    }
    let snap = snapshot::assemble(parts, &opts);
    let status = Status::of(a.fail_on.worst(&snap.findings));
    if a.json {
        print_json(status, Some(&snap), None)?;
    } else {
        // findings quote host text (ids, names): no live control sequences
        let text = plugin_text(status, &snap.findings);
        print!("{}", wedgewatch::redact::control::text(&text));
    }
    Ok(status.code())
}

/// What a check that could not run prints on stdout (where the monitoring system reads);
/// exit 3.
pub fn unknown(json: bool, why: &str) -> i32 {
    if json {
        let _ = print_json(Status::Unknown, None, Some(why));
    } else {
        println!("WEDGEWATCH UNKNOWN - {why}");
    }
    Status::Unknown.code()
}

fn print_json(status: Status, snap: Option<&Snapshot>, error: Option<&str>) -> anyhow::Result<()> {
    let out = CheckJson {
        schema: "wedgewatch.check/1",
        status,
        exit_code: status.code(),
        taken_at: snap.map(|s| s.taken_at.as_str()),
        error,
        findings: snap.map(|s| s.findings.as_slice()).unwrap_or_default(),
    };
    println!("{}", serde_json::to_string_pretty(&out)?);
    Ok(())
}

/// The status line with perfdata, then one line per finding, most severe first.
fn plugin_text(status: Status, f: &[Finding]) -> String {
    let mut sorted: Vec<&Finding> = f.iter().collect();
    sorted.sort_by_key(|f| std::cmp::Reverse(f.severity));
    let count = |s: Severity| f.iter().filter(|x| x.severity == s).count();
    let (c, w, i) = (
        count(Severity::Critical),
        count(Severity::Warning),
        count(Severity::Info),
    );
    let head = match sorted.first() {
        None => "no findings".to_string(),
        Some(top) => format!(
            "{} finding{}, worst: {}",
            f.len(),
            if f.len() == 1 { "" } else { "s" },
            one_line(top)
        ),
    };
    let mut out = format!(
        "WEDGEWATCH {} - {head} | findings={} critical={c} warning={w} info={i}\n",
        status.word(),
        f.len()
    );
    for x in sorted {
        out.push_str(&format!(
            "{} {}\n",
            x.severity.as_str().to_uppercase(),
            one_line(x)
        ));
    }
    out
}

/// `wedged_request at decode@127.0.0.1:31012: 4 requests ...`, on one line.
fn one_line(f: &Finding) -> String {
    let at = f
        .component
        .as_deref()
        .map(|c| format!(" at {c}"))
        .unwrap_or_default();
    // a summary quoting host text must not break the one-line-per-finding contract
    let summary = f.summary.replace(['\n', '\r', '|'], " ");
    format!("{}{at}: {summary}", f.kind)
}

#[cfg(test)]
mod tests {
    use super::*;
    use wedgewatch::model::FindingKind;

    fn finding(kind: FindingKind, severity: Severity) -> Finding {
        Finding {
            kind,
            severity,
            component: Some("decode@127.0.0.1:31012".into()),
            role: None,
            summary: "4 requests accepted\nand forgotten | x".into(),
            requests: vec![],
            evidence: vec![],
            explanation: None,
        }
    }

    #[test]
    fn status_follows_the_worst_counted_finding() {
        let w = finding(FindingKind::ConfigChanged, Severity::Warning);
        let c = finding(FindingKind::WedgedRequest, Severity::Critical);
        let i = finding(FindingKind::ProcessRestarted, Severity::Info);
        let st = |fail: FailOn, f: &[Finding]| Status::of(fail.worst(f)).code();
        assert_eq!(st(FailOn::Warning, &[]), 0);
        assert_eq!(st(FailOn::Warning, std::slice::from_ref(&i)), 0);
        assert_eq!(st(FailOn::Info, std::slice::from_ref(&i)), 1);
        assert_eq!(st(FailOn::Warning, &[w.clone(), i.clone()]), 1);
        assert_eq!(st(FailOn::Warning, &[w.clone(), c.clone()]), 2);
        assert_eq!(st(FailOn::Critical, std::slice::from_ref(&w)), 0);
        assert_eq!(st(FailOn::Critical, &[w, c.clone()]), 2);
        assert_eq!(st(FailOn::Never, &[c]), 0);
    }

    #[test]
    fn one_line_per_finding() {
        let findings = [
            finding(FindingKind::ConfigChanged, Severity::Warning),
            finding(FindingKind::WedgedRequest, Severity::Critical),
        ];
        let text = plugin_text(Status::Critical, &findings);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 3, "{text}");
        assert!(
            lines[0].starts_with("WEDGEWATCH CRITICAL - 2 findings"),
            "{text}"
        );
        assert!(
            lines[0].ends_with("| findings=2 critical=1 warning=1 info=0"),
            "{text}"
        );
        assert!(
            lines[1].starts_with("CRITICAL wedged_request at decode@"),
            "{text}"
        );
        assert!(lines[2].starts_with("WARNING config_changed"), "{text}");
    }
}
