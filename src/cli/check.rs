//! `wedgewatch check`: a monitoring-plugin check (Nagios, Icinga, Consul, Sensu). One status
//! line, then one line per finding; exit 0 OK, 1 WARNING, 2 CRITICAL, 3 UNKNOWN (could not
//! sample, bad input, or a usage error: a check that cannot run must not page as CRITICAL).

use super::exit::code;
use super::options::Sampling;
use super::source::{self, SourceArgs};
use super::unseen::{overrides, parse_source, unseen, Override, Unseen};
use anyhow::bail;
use clap::{Args, ValueEnum};
use serde::Serialize;
use std::path::PathBuf;
use wedgewatch::model::{Finding, Severity, Snapshot, SourceKind};
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
  wedgewatch check --from bundle/           # a snapshot file or bundle, as export --from
  wedgewatch check --require stacks,metrics # blind to stacks or metrics is CRITICAL

A source that could not be sampled is named on the status line (`not seen: gpu`), as a
line of its own and in the perfdata (`unavailable=1`): OK means looked and found nothing.

Exit status (monitoring-plugin convention):
  0 OK        nothing at or above --fail-on
  1 WARNING   a warning finding (and none critical)
  2 CRITICAL  a critical finding, or a source named in --require unavailable
  3 UNKNOWN   could not sample, processes or sockets unavailable with nothing found,
              bad input, or a usage error";

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
    /// Sources the check must see (processes, sockets, stacks, gpu, metrics; comma
    /// separated): one unavailable makes the check CRITICAL.
    #[arg(long, value_name = "SOURCES", value_delimiter = ',', value_parser = parse_source)]
    pub require: Vec<SourceKind>,
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
    /// Sources not seen (unavailable), and whether `--require` named them.
    unavailable: &'a [Unseen],
}

pub fn run(top: Sampling, a: CheckArgs) -> anyhow::Result<i32> {
    let s = Sampling::merge(top, a.sampling);
    let opts = s.assemble();
    let snap = match a.source.from.as_deref().map(super::report::still_frame) {
        // a snapshot file or bundle, as `export --from` takes
        Some(Ok(Some(snap))) => {
            if a.source.at.is_some() {
                bail!(
                    "--at needs a recording; {} is a snapshot",
                    a.source
                        .from
                        .as_deref()
                        .unwrap_or_else(|| std::path::Path::new(""))
                        .display()
                );
            }
            if a.baseline.is_some() {
                bail!("--baseline compares live or recorded samples, not a snapshot file: use `wedgewatch diff`");
            }
            snap
        }
        Some(Err(e)) => return Err(e),
        _ => {
            let mut parts = source::parts(&s, &a.source, wedgewatch::model::RawFiles::All)?;
            if let Some(base) = &a.baseline {
                super::snapshot::against_baseline(&mut parts, base, &opts)?;
            }
            snapshot::assemble(parts, &opts)
        }
    };
    let worst = a.fail_on.worst(&snap.findings);
    let unseen = unseen(&snap, &a.require);
    let status = match overrides(worst.is_none(), &unseen) {
        Some(Override::RequiredMissing) => Status::Critical,
        Some(Override::Blind) => Status::Unknown,
        None => Status::of(worst),
    };
    if a.json {
        print_json(status, Some(&snap), None, &unseen)?;
    } else {
        print!("{}", plugin_text(status, &snap.findings, &unseen));
    }
    Ok(status.code())
}

/// What a check that could not run prints on stdout (where the monitoring system reads);
/// exit 3.
pub fn unknown(json: bool, why: &str) -> i32 {
    if json {
        let _ = print_json(Status::Unknown, None, Some(why), &[]);
    } else {
        println!("WEDGEWATCH UNKNOWN - {}", field(why));
    }
    Status::Unknown.code()
}

fn print_json(
    status: Status,
    snap: Option<&Snapshot>,
    error: Option<&str>,
    unavailable: &[Unseen],
) -> anyhow::Result<()> {
    let out = CheckJson {
        schema: "wedgewatch.check/1",
        status,
        exit_code: status.code(),
        taken_at: snap.map(|s| s.taken_at.as_str()),
        error,
        findings: snap.map(|s| s.findings.as_slice()).unwrap_or_default(),
        unavailable,
    };
    println!("{}", serde_json::to_string_pretty(&out)?);
    Ok(())
}

/// The status line with perfdata, then one line per finding, most severe first, then one
/// per source not seen.
fn plugin_text(status: Status, f: &[Finding], unseen: &[Unseen]) -> String {
    let mut sorted: Vec<&Finding> = f.iter().collect();
    sorted.sort_by_key(|f| std::cmp::Reverse(f.severity));
    let count = |s: Severity| f.iter().filter(|x| x.severity == s).count();
    let (c, w, i) = (
        count(Severity::Critical),
        count(Severity::Warning),
        count(Severity::Info),
    );
    let mut head = match sorted.first() {
        None => "no findings".to_string(),
        Some(top) => format!(
            "{} finding{}, worst: {}",
            f.len(),
            if f.len() == 1 { "" } else { "s" },
            one_line(top)
        ),
    };
    let required: Vec<&str> = unseen
        .iter()
        .filter(|u| u.required)
        .map(|u| u.source.as_str())
        .collect();
    if !required.is_empty() {
        head = format!(
            "required source unavailable: {}; {head}",
            field(&required.join(", "))
        );
    }
    if !unseen.is_empty() {
        let names: Vec<&str> = unseen.iter().map(|u| u.source.as_str()).collect();
        head.push_str(&format!("; not seen: {}", field(&names.join(", "))));
    }
    let perf = [
        ("findings", f.len()),
        ("critical", c),
        ("warning", w),
        ("info", i),
        ("unavailable", unseen.len()),
    ]
    .map(|(label, n)| perfdata(label, n))
    .join(" ");
    let mut out = format!("WEDGEWATCH {} - {head} | {perf}\n", status.word());
    for x in sorted {
        out.push_str(&format!(
            "{} {}\n",
            x.severity.as_str().to_uppercase(),
            one_line(x)
        ));
    }
    for u in unseen {
        let req = if u.required { " (required)" } else { "" };
        out.push_str(&format!(
            "UNAVAILABLE {}{req}: {}\n",
            field(&u.source),
            field(&u.reason)
        ));
    }
    out
}

/// `wedged_request at decode@127.0.0.1:31012: 4 requests ...`, on one line.
fn one_line(f: &Finding) -> String {
    let at = f
        .component
        .as_deref()
        .map(|c| format!(" at {}", field(c)))
        .unwrap_or_default();
    format!("{}{at}: {}", field(&f.kind.to_string()), field(&f.summary))
}

/// Host text (ids, summaries, paths in errors) as one field of the plugin output: a line
/// break would add a line (a fake status) and a `|` would start perfdata, so both become
/// spaces; other control characters are escaped.
fn field(s: &str) -> String {
    let one_line = s.replace(['\n', '\r', '|'], " ");
    wedgewatch::redact::control::text(&one_line).into_owned()
}

/// One perfdata item, `'label'=value` by the monitoring-plugin grammar: a label may not
/// hold `=` or `'` (nor what `field` removes), and is quoted when it holds a space.
fn perfdata(label: &str, value: usize) -> String {
    let label = field(label).replace(['=', '\''], "_");
    if label.contains(' ') {
        format!("'{label}'={value}")
    } else {
        format!("{label}={value}")
    }
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
        let text = plugin_text(Status::Critical, &findings, &[]);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 3, "{text}");
        assert!(
            lines[0].starts_with("WEDGEWATCH CRITICAL - 2 findings"),
            "{text}"
        );
        assert!(
            lines[0].ends_with("| findings=2 critical=1 warning=1 info=0 unavailable=0"),
            "{text}"
        );
        assert!(
            lines[1].starts_with("CRITICAL wedged_request at decode@"),
            "{text}"
        );
        assert!(lines[2].starts_with("WARNING config_changed"), "{text}");
    }

    #[test]
    fn perfdata_labels_follow_the_grammar() {
        assert_eq!(perfdata("findings", 2), "findings=2");
        assert_eq!(perfdata("a b", 1), "'a b'=1");
        assert_eq!(perfdata("x='y'|\nz", 1), "'x__y_  z'=1");
        assert_eq!(field("a\nb|c\u{1b}"), "a b c\\x1b");
    }
}
