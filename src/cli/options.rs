//! The option groups verbs share, and what they turn into (attach options, thresholds, the
//! daemon's directories).
//!
//! Sampling options are not clap-global: a global flag is offered by every verb, and
//! `diff --native` means nothing. Each verb that samples flattens [`Sampling`] (or only
//! [`Targets`]); the top level flattens it too, for the bare `wedgewatch` (the live UI) and
//! for scripts that put them before the verb. [`Sampling::merge`] joins the two; a new
//! option is one field here and one line in `merge`.

use anyhow::{bail, Context};
use clap::Args;
use std::path::{Path, PathBuf};
use wedgewatch::attach::AttachOptions;
use wedgewatch::daemon::DaemonConfig;
use wedgewatch::detect::Thresholds;
use wedgewatch::discover::DiscoverOptions;
use wedgewatch::probes::ProbeSet;

/// Series kept per metrics scrape unless `--max-series` says otherwise.
const DEFAULT_MAX_SERIES: u32 = 20_000;

/// Where to look and with which tools: what doctor checks and every sampling verb uses.
#[derive(Debug, Args, Clone, Default, PartialEq)]
#[command(next_help_heading = "Sampling options")]
pub struct Targets {
    /// Extra probe profiles: every *.toml in DIR (repeatable).
    #[arg(long = "probes", value_name = "DIR")]
    pub probes: Vec<PathBuf>,
    /// Add a process discovery missed (repeatable); it must exist.
    #[arg(long = "pid", value_name = "PID", value_parser = clap::value_parser!(i32).range(1..))]
    pub pids: Vec<i32>,
    /// Watch only this process and its descendants (repeatable): on a host shared by
    /// several stacks, name the pod's shim, the launcher or the unit's main process, and
    /// every other process is left out of discovery. `--pid` targets are watched too.
    #[arg(long = "within", value_name = "PID", value_parser = clap::value_parser!(i32).range(1..))]
    pub within: Vec<i32>,
    /// Add an HTTP endpoint discovery missed, e.g. http://127.0.0.1:8000 (repeatable).
    #[arg(long = "url", value_name = "URL", value_parser = parse_url)]
    pub urls: Vec<String>,
    /// procfs root (for fixture trees in tests).
    #[arg(long, value_name = "PATH", hide = true)]
    pub proc_root: Option<PathBuf>,
    /// Load this libnvidia-ml.so instead of the default one (or $WEDGEWATCH_NVML_LIB).
    #[arg(long, value_name = "PATH")]
    pub nvml_lib: Option<PathBuf>,
    /// The py-spy binary to run (default: $WEDGEWATCH_PY_SPY, else PATH).
    #[arg(long, value_name = "PATH")]
    pub py_spy: Option<PathBuf>,
    /// Environment variable holding a router's API key, for a router whose own arguments
    /// have no --api-key: read from the router's environment, else from this one (sent only
    /// to a router run by root or by you). Never written to any output.
    #[arg(long, value_name = "NAME")]
    pub router_key_env: Option<String>,
}

/// How to sample, judge and show: every verb that samples or replays.
#[derive(Debug, Args, Clone, Default, PartialEq)]
#[command(next_help_heading = "Sampling options")]
pub struct Sampling {
    #[command(flatten)]
    pub targets: Targets,
    /// Also capture native frames with py-spy --native. This PAUSES the targets while
    /// they are read; only use it when asked to.
    #[arg(long)]
    pub native: bool,
    /// Detector thresholds (TOML; missing keys keep their defaults, see docs/findings.md).
    #[arg(long, value_name = "FILE")]
    pub thresholds: Option<PathBuf>,
    /// Where the daemon keeps its recording, lock and socket (default: root:
    /// $STATE_DIRECTORY or /var/lib/wedgewatch, socket in /run/wedgewatch; others:
    /// $XDG_STATE_HOME/wedgewatch, socket in $XDG_RUNTIME_DIR/wedgewatch).
    #[arg(long, value_name = "DIR")]
    pub state_dir: Option<PathBuf>,
    /// Series kept per metrics scrape (default 20000); an endpoint exporting more is cut
    /// there and the metrics source says so.
    #[arg(long, value_name = "N",
          value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub max_series: Option<u32>,
    /// Do not redact secrets (the output says so).
    #[arg(long)]
    pub no_redact: bool,
}

/// Accepts what the HTTP client can fetch: `http://host[:port][/path]`.
pub fn parse_url(s: &str) -> Result<String, String> {
    let eg = "(e.g. http://127.0.0.1:8000)";
    let url = url::Url::parse(s).map_err(|e| format!("{e} {eg}"))?;
    if url.scheme() != "http" {
        return Err(format!("only http:// endpoints are scraped {eg}"));
    }
    // the url crate reads `http:///x` as host `x` and `http:x` as `http://x/`: only the
    // plain form with a host is taken
    let written = s
        .get(..7)
        .is_some_and(|p| p.eq_ignore_ascii_case("http://"));
    if !written || s.get(7..).is_none_or(|rest| rest.starts_with('/')) {
        return Err(format!("expected http://host[:port][/path] {eg}"));
    }
    match wedgewatch::sys::addr::url_endpoint(&url) {
        Some((_, 0)) => Err(format!("port 0 {eg}")),
        Some(_) => Ok(s.to_string()),
        None => Err(format!("no host {eg}")),
    }
}

impl Targets {
    /// Joins the top-level values (`wedgewatch --pid 1 snapshot`) with the verb's.
    pub fn merge(top: Targets, verb: Targets) -> Targets {
        Targets {
            probes: [top.probes, verb.probes].concat(),
            pids: [top.pids, verb.pids].concat(),
            within: [top.within, verb.within].concat(),
            urls: [top.urls, verb.urls].concat(),
            proc_root: verb.proc_root.or(top.proc_root),
            nvml_lib: verb.nvml_lib.or(top.nvml_lib),
            py_spy: verb.py_spy.or(top.py_spy),
            router_key_env: verb.router_key_env.or(top.router_key_env),
        }
    }

    pub fn proc_root(&self) -> PathBuf {
        self.proc_root
            .clone()
            .unwrap_or_else(|| PathBuf::from("/proc"))
    }

    /// `--nvml-lib`, else `$WEDGEWATCH_NVML_LIB` (read here, not by clap, so the variable
    /// does not count as an option given to a verb that samples nothing).
    pub fn nvml_lib(&self) -> Option<PathBuf> {
        self.nvml_lib.clone().or_else(|| {
            std::env::var_os("WEDGEWATCH_NVML_LIB")
                .filter(|v| !v.is_empty())
                .map(PathBuf::from)
        })
    }

    pub fn probes(&self) -> anyhow::Result<ProbeSet> {
        Ok(ProbeSet::load(&self.probes)?)
    }

    /// `--router-key-env NAME`, its value held by every redactor from now on.
    fn router_key_env(&self) -> Option<String> {
        let name = self.router_key_env.clone()?;
        wedgewatch::sources::router_key::hold_own(&name);
        Some(name)
    }

    pub fn discover_options(&self) -> DiscoverOptions {
        DiscoverOptions {
            proc_root: self.proc_root(),
            extra_pids: self.pids.clone(),
            extra_urls: self.urls.clone(),
            within: self.within.clone(),
            router_key_env: self.router_key_env(),
            ..DiscoverOptions::default()
        }
    }

    /// Every `--pid` and `--within` names a process that exists now: a typo is a usage
    /// error, not a component listed as "not found" or an empty scope.
    pub fn check_pids(&self) -> anyhow::Result<()> {
        let proc = wedgewatch::sys::ProcFs::new(self.proc_root());
        let named = self.pids.iter().map(|p| ("--pid", p));
        for (flag, pid) in named.chain(self.within.iter().map(|p| ("--within", p))) {
            if proc.exists(*pid).is_err() {
                bail!(
                    "{flag} {pid}: no such process (not in {})",
                    proc.root().display()
                );
            }
        }
        Ok(())
    }
}

impl Sampling {
    /// Joins the top-level values with the verb's (the verb's win where only one counts).
    pub fn merge(top: Sampling, verb: Sampling) -> Sampling {
        Sampling {
            targets: Targets::merge(top.targets, verb.targets),
            native: top.native || verb.native,
            thresholds: verb.thresholds.or(top.thresholds),
            state_dir: verb.state_dir.or(top.state_dir),
            max_series: verb.max_series.or(top.max_series),
            no_redact: top.no_redact || verb.no_redact,
        }
    }

    /// The first option given, by its flag, if any (for verbs that take none).
    pub fn first_given(&self) -> Option<&'static str> {
        let t = &self.targets;
        [
            (!t.probes.is_empty(), "--probes"),
            (!t.pids.is_empty(), "--pid"),
            (!t.within.is_empty(), "--within"),
            (!t.urls.is_empty(), "--url"),
            (t.proc_root.is_some(), "--proc-root"),
            (t.nvml_lib.is_some(), "--nvml-lib"),
            (t.py_spy.is_some(), "--py-spy"),
            (t.router_key_env.is_some(), "--router-key-env"),
            (self.native, "--native"),
            (self.thresholds.is_some(), "--thresholds"),
            (self.state_dir.is_some(), "--state-dir"),
            (self.max_series.is_some(), "--max-series"),
            (self.no_redact, "--no-redact"),
        ]
        .into_iter()
        .find_map(|(given, flag)| given.then_some(flag))
    }

    /// The options every sampling verb attaches with.
    pub fn attach_options(&self) -> anyhow::Result<AttachOptions> {
        let t = &self.targets;
        t.check_pids()?;
        let mut o = AttachOptions::new(t.probes()?);
        o.proc_root = t.proc_root();
        o.extra_pids = t.pids.clone();
        o.within = t.within.clone();
        o.extra_urls = t.urls.clone();
        o.nvml_lib = t.nvml_lib();
        o.py_spy = t.py_spy.clone();
        o.native = self.native;
        o.thresholds = self.thresholds()?;
        o.max_series = self.max_series.unwrap_or(DEFAULT_MAX_SERIES) as usize;
        o.router_key_env = t.router_key_env();
        Ok(o)
    }

    pub fn thresholds(&self) -> anyhow::Result<Thresholds> {
        match &self.thresholds {
            None => Ok(Thresholds::default()),
            Some(p) => read_thresholds(p),
        }
    }

    pub fn daemon_config(&self) -> DaemonConfig {
        match &self.state_dir {
            Some(d) => DaemonConfig::new(d.clone()),
            None => DaemonConfig::default(),
        }
    }

    pub fn assemble(&self) -> wedgewatch::snapshot::AssembleOptions {
        wedgewatch::snapshot::AssembleOptions {
            redact: !self.no_redact,
            ..Default::default()
        }
    }
}

fn read_thresholds(p: &Path) -> anyhow::Result<Thresholds> {
    let text = wedgewatch::config::read_config(p).context("reading thresholds")?;
    Thresholds::from_toml(&text).with_context(|| format!("thresholds {}", p.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_checked_when_parsed() {
        for good in [
            "http://127.0.0.1:8000",
            "http://localhost:30000/metrics",
            "http://[::1]:8000/",
            "http://engine",
        ] {
            assert_eq!(parse_url(good).as_deref(), Ok(good), "{good}");
        }
        for bad in [
            "notaurl",
            "https://x:1",
            "http://",
            "http://:80",
            "http://h:99999",
            "http://h:0",
            "http://h:x",
            "http://a b:80",
            "http:///metrics",
            "localhost:8000",
            "http:x",
            "http:",
            "HTTP:/",
        ] {
            assert!(parse_url(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn top_level_and_verb_options_merge() {
        let top = Sampling {
            targets: Targets {
                pids: vec![1],
                proc_root: Some("/a".into()),
                ..Targets::default()
            },
            native: true,
            ..Sampling::default()
        };
        let verb = Sampling {
            targets: Targets {
                pids: vec![2],
                proc_root: Some("/b".into()),
                ..Targets::default()
            },
            ..Sampling::default()
        };
        assert_eq!(top.first_given(), Some("--pid"));
        let m = Sampling::merge(top, verb);
        assert_eq!(m.targets.pids, vec![1, 2]);
        assert_eq!(m.targets.proc_root(), PathBuf::from("/b"));
        assert!(m.native);
        assert_eq!(Sampling::default().first_given(), None);
    }
}
