//! Probe profiles: declarative TOML files (`probes/*.toml`, plus `--probes DIR`) that say how
//! to recognise each kind of process of an inference stack, which metrics mean what, and how
//! to classify Python stacks. Adding a stack needs a new TOML file, not new Rust.
//!
//! A file may hold any of three arrays of tables: `[[profile]]` (discovery),
//! `[[metric_map]]` (see [`crate::sources::metrics::MetricMap`]) and `[[stack_rule]]`
//! (see [`crate::sources::stacks::StackRule`]). Unknown keys are an error naming the file and
//! the key.

use crate::error::{Error, Result};
use crate::model::{ChannelKind, RequestsOn, Role};
use crate::sources::metrics::MetricMap;
use crate::sources::stacks::StackRule;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

include!(concat!(env!("OUT_DIR"), "/builtin_probes.rs"));

/// How to recognise one kind of process and what role it plays (a `[[profile]]` table): a
/// process matches when a regex of any `match_*` list does and no `exclude_cmdline` one
/// does. Every key: docs/probes.md.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Profile {
    pub name: String,
    pub stack: String,
    /// Role name (`router`, `engine`, `scheduler`, ...). `engine` may be refined by
    /// `mode_flag` into `prefill`/`decode`.
    pub role: String,
    /// Regexes over the whole command line, arguments joined by single spaces.
    #[serde(default)]
    pub match_cmdline: Vec<String>,
    /// Regexes over `/proc/PID/comm` (at most 15 bytes: write prefixes, not full titles).
    #[serde(default)]
    pub match_comm: Vec<String>,
    /// Regexes over the process title (`argv[0]` as setproctitle leaves it). A process whose
    /// title matches is "titled": its own cmdline and environ are not trusted.
    #[serde(default)]
    pub match_title: Vec<String>,
    /// Regexes over the joined command line that veto a match.
    #[serde(default)]
    pub exclude_cmdline: Vec<String>,
    /// Name of another profile: this one describes children of that component, matched only
    /// among its descendants.
    #[serde(default)]
    pub parent: Option<String>,
    /// Regex with one capture group over the title, giving the child's name in its id
    /// (`^sglang::(.+)$` turns `sglang::scheduler_TP0` into `scheduler_TP0`). Default: role.
    #[serde(default)]
    pub child_name: Option<String>,
    /// Flag whose value refines the role (`--disaggregation-mode`), through `mode_roles`.
    #[serde(default)]
    pub mode_flag: Option<String>,
    /// Flag value -> role (`decode = "decode"`). Values not listed keep `role`.
    #[serde(default)]
    pub mode_roles: BTreeMap<String, String>,
    /// Flag giving the listen host (`--host`) and its default when absent.
    #[serde(default)]
    pub host_flag: Option<String>,
    #[serde(default)]
    pub default_host: Option<String>,
    /// Flag giving the HTTP port (`--port`) and its default when absent.
    #[serde(default)]
    pub port_flag: Option<String>,
    #[serde(default)]
    pub default_port: Option<u16>,
    /// Also read listen addresses from the process's own LISTEN sockets (default true).
    #[serde(default = "yes")]
    pub ports_from_sockets: bool,
    /// Path of the Prometheus endpoint (`/metrics`); none: no metrics endpoint.
    #[serde(default)]
    pub metrics_path: Option<String>,
    /// Flags/default for a metrics endpoint on its own port; without them the metrics live
    /// on the HTTP port.
    #[serde(default)]
    pub metrics_port_flag: Option<String>,
    #[serde(default)]
    pub metrics_default_port: Option<u16>,
    #[serde(default)]
    pub metrics_host_flag: Option<String>,
    /// When titled, read the original arguments (and environment) from the nearest ancestor
    /// whose command line matches `match_cmdline` (a `timeout`/shell/supervisor launcher).
    #[serde(default)]
    pub args_from_ancestor: bool,
    /// Flags whose values are worker URLs (`--worker-urls`, `--prefill`, `--decode`): config
    /// edges from this component to the components listening there.
    #[serde(default)]
    pub worker_flags: Vec<String>,
    /// HTTP path listing the workers (`/workers`), asked (loopback only, hard timeout) when
    /// the arguments could not be recovered.
    #[serde(default)]
    pub workers_endpoint: Option<String>,
    /// Generic proxy rule: a process that listens on a port and has an ESTABLISHED
    /// connection to a known component's listen port.
    #[serde(default)]
    pub connects_to_known: bool,
    /// Environment variable naming the visible GPUs (`CUDA_VISIBLE_DEVICES`).
    #[serde(default)]
    pub gpu_env: Option<String>,
    /// Regex with one capture group over the title giving the rank whose GPU this child uses
    /// (`TP(\d+)`): the child gets that entry of `gpu_env` (or the index itself).
    #[serde(default)]
    pub gpu_index_from_title: Option<String>,
    /// Label name -> flag whose value becomes the label (`tp = "--tp-size"`).
    #[serde(default)]
    pub labels_from_flags: BTreeMap<String, String>,
    /// When several profiles match one process, the highest priority wins (then file order).
    #[serde(default)]
    pub priority: i32,
    /// Distributions whose installed versions a report shows (`sglang`, `torch`), read from
    /// disk (`sources::versions`).
    #[serde(default)]
    pub packages: Vec<String>,
    /// Regexes over environment variable names a report shows besides the changes
    /// (`^SGLANG_`).
    #[serde(default)]
    pub relevant_env: Vec<String>,
    /// Which listen addresses carry requests: `all` (default), `serving` (only the address
    /// of `port_flag`/`default_port`: an engine's other ports are channels), `none` (children).
    #[serde(default)]
    pub requests_on: RequestsOn,
    /// Channel kind -> flag whose value is that channel's port
    /// (`bootstrap = "--disaggregation-bootstrap-port"`).
    #[serde(default)]
    pub channel_flags: BTreeMap<String, String>,
    /// How the engine moves its KV cache in a PD pair: its backend and side from its flags.
    #[serde(default)]
    pub kv_transfer: Option<KvTransferProfile>,
}

/// A `kv_transfer` table: where an engine's flags name its KV transfer backend and which way
/// its pages go. A side is the engine's role (`prefill`) or, with `config_flag`, the value of
/// `side_key` in that flag's JSON (`kv_producer`); `sends`/`receives` list which ones send and
/// receive. Discovery writes the labels `kv_backend` and `kv_side`; a port under `port_key`
/// is a `kv_transfer` channel.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct KvTransferProfile {
    /// Flag naming the backend (`--disaggregation-transfer-backend`), and its default.
    #[serde(default)]
    pub backend_flag: Option<String>,
    #[serde(default)]
    pub default_backend: Option<String>,
    /// Flag holding a JSON object (`--kv-transfer-config`) with the keys below.
    #[serde(default)]
    pub config_flag: Option<String>,
    #[serde(default)]
    pub backend_key: Option<String>,
    #[serde(default)]
    pub side_key: Option<String>,
    #[serde(default)]
    pub port_key: Option<String>,
    #[serde(default)]
    pub sends: Vec<String>,
    #[serde(default)]
    pub receives: Vec<String>,
}

fn yes() -> bool {
    true
}

impl Profile {
    /// Checks what serde cannot: regexes compile, roles are known, numbers make sense.
    fn validate(&self) -> std::result::Result<(), String> {
        let ctx = |what: &str| format!("profile {:?}: {what}", self.name);
        if Role::parse(&self.role).is_none() {
            return Err(ctx(&format!("unknown role {:?}", self.role)));
        }
        for (flag, role) in &self.mode_roles {
            if Role::parse(role).is_none() {
                return Err(ctx(&format!("mode_roles.{flag}: unknown role {role:?}")));
            }
        }
        for kind in self.channel_flags.keys() {
            if ChannelKind::parse(kind).is_none() {
                return Err(ctx(&format!(
                    "channel_flags.{kind}: unknown channel kind (bootstrap, kv_transfer, internal)"
                )));
            }
        }
        let lists = [
            ("match_cmdline", &self.match_cmdline),
            ("match_comm", &self.match_comm),
            ("match_title", &self.match_title),
            ("exclude_cmdline", &self.exclude_cmdline),
            ("relevant_env", &self.relevant_env),
        ];
        for (key, list) in lists {
            for re in list {
                regex::Regex::new(re).map_err(|e| ctx(&format!("{key}: bad regex {re:?}: {e}")))?;
            }
        }
        for (key, re) in [
            ("child_name", &self.child_name),
            ("gpu_index_from_title", &self.gpu_index_from_title),
        ] {
            if let Some(re) = re {
                let r = regex::Regex::new(re)
                    .map_err(|e| ctx(&format!("{key}: bad regex {re:?}: {e}")))?;
                if r.captures_len() < 2 {
                    return Err(ctx(&format!("{key}: regex {re:?} needs a capture group")));
                }
            }
        }
        let has_match = !self.match_cmdline.is_empty()
            || !self.match_comm.is_empty()
            || !self.match_title.is_empty();
        if !has_match && !self.connects_to_known {
            return Err(ctx(
                "needs at least one of match_cmdline, match_comm, match_title or connects_to_known",
            ));
        }
        Ok(())
    }
}
/// One parsed probe file.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProbeFile {
    #[serde(default)]
    pub profile: Vec<Profile>,
    #[serde(default)]
    pub metric_map: Vec<MetricMap>,
    #[serde(default)]
    pub stack_rule: Vec<StackRule>,
}

/// Every profile, metric map and stack rule in force.
#[derive(Debug, Clone, Default)]
pub struct ProbeSet {
    pub profiles: Vec<Profile>,
    pub metric_maps: Vec<MetricMap>,
    pub stack_rules: Vec<StackRule>,
    /// Where each came from, for messages.
    pub files: Vec<PathBuf>,
}

impl ProbeSet {
    /// The profiles built into the binary (the repository's `probes/`).
    pub fn builtin() -> Result<ProbeSet> {
        let mut set = ProbeSet::default();
        for (name, text) in BUILTIN_PROBES {
            set.add_text(Path::new(&format!("probes/{name}")), text)?;
        }
        Ok(set)
    }

    /// Built-ins plus every `*.toml` in `extra` dirs (later files add to earlier ones).
    pub fn load(extra: &[PathBuf]) -> Result<ProbeSet> {
        let mut set = ProbeSet::builtin()?;
        for dir in extra {
            set.add_dir(dir)?;
        }
        Ok(set)
    }

    pub fn add_dir(&mut self, dir: &Path) -> Result<()> {
        let rd = std::fs::read_dir(dir).map_err(|e| Error::io(dir, e))?;
        let mut files: Vec<PathBuf> = rd
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|e| e == "toml"))
            .collect();
        files.sort();
        for f in files {
            // A FIFO or device named *.toml in a shared directory must not hang or flood us.
            if !f.metadata().is_ok_and(|m| m.is_file()) {
                return Err(Error::Probe {
                    path: f,
                    message: "not a regular file".into(),
                });
            }
            let text = crate::config::read_config(&f)?;
            self.add_text(&f, &text)?;
        }
        Ok(())
    }

    pub fn add_text(&mut self, path: &Path, text: &str) -> Result<()> {
        // Regex errors span several lines (pattern, caret, reason): one line per error.
        let bad = |message: String| Error::Probe {
            path: path.to_path_buf(),
            message: crate::config::one_line(&message),
        };
        let file: ProbeFile =
            toml::from_str(text).map_err(|e| bad(crate::config::toml_message(text, &e)))?;
        check_probe_file(&file).map_err(bad)?;
        for p in &file.profile {
            p.validate().map_err(bad)?;
            if self.profiles.iter().any(|q| q.name == p.name) {
                return Err(bad(format!("profile {:?} is defined twice", p.name)));
            }
        }
        // Bad regexes and unknown states in stack rules fail here, naming the file.
        crate::sources::stacks::RuleSet::new(&file.stack_rule).map_err(|e| bad(e.to_string()))?;
        self.profiles.extend(file.profile);
        self.metric_maps.extend(file.metric_map);
        self.stack_rules.extend(file.stack_rule);
        self.files.push(path.to_path_buf());
        Ok(())
    }

    /// The profile with this name.
    pub fn profile(&self, name: &str) -> Option<&Profile> {
        self.profiles.iter().find(|p| p.name == name)
    }
}

/// What serde cannot check in a probe file: ports, paths and depths that make sense.
/// (Regexes and roles are checked by the profile and stack-rule loaders.)
pub fn check_probe_file(file: &ProbeFile) -> Result<(), String> {
    for p in &file.profile {
        let ctx = |e: crate::config::RangeError| format!("profile {:?}: {e}", p.name);
        if p.name.trim().is_empty() {
            return Err("profile with an empty name".into());
        }
        for (key, port) in [
            ("default_port", p.default_port),
            ("metrics_default_port", p.metrics_default_port),
        ] {
            if let Some(port) = port {
                crate::config::in_range(key, port, 1, u16::MAX, "").map_err(ctx)?;
            }
        }
        for (key, path) in [
            ("metrics_path", &p.metrics_path),
            ("workers_endpoint", &p.workers_endpoint),
        ] {
            if let Some(path) = path.as_deref().filter(|s| !s.starts_with('/')) {
                return Err(format!(
                    "profile {:?}: {key} = {path:?}: expected a path starting with /",
                    p.name
                ));
            }
        }
    }
    for m in &file.metric_map {
        m.validate()?;
    }
    for r in &file.stack_rule {
        crate::config::in_range(
            "innermost_depth",
            r.innermost_depth,
            1,
            crate::config::MAX_STACK_DEPTH,
            "",
        )
        .map_err(|e| format!("stack_rule {:?}: {e}", r.name))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builtin_profiles_load() {
        let set = ProbeSet::builtin().expect("built-in probes load");
        for name in [
            "sglang-engine",
            "sglang-scheduler",
            "sglang-router",
            "sgl-router-rust",
            "vllm-router",
            "vllm-engine",
            "generic-proxy",
        ] {
            assert!(
                set.profile(name).is_some(),
                "missing built-in profile {name}"
            );
        }
    }

    #[test]
    fn unknown_key_names_file_and_key() {
        let mut set = ProbeSet::default();
        let err = set
            .add_text(
                Path::new("extra/bad.toml"),
                "[[profile]]\nname = \"x\"\nstack = \"s\"\nrole = \"proxy\"\nmatch_cmdlin = [\"x\"]\n",
            )
            .expect_err("unknown key must fail");
        let msg = err.to_string();
        assert!(msg.contains("extra/bad.toml"), "{msg}");
        assert!(msg.contains("match_cmdlin"), "{msg}");
    }

    #[test]
    fn bad_regex_and_role_are_errors() {
        let mut set = ProbeSet::default();
        let err = set
            .add_text(
                Path::new("r.toml"),
                "[[profile]]\nname = \"x\"\nstack = \"s\"\nrole = \"chef\"\nmatch_comm = [\"x\"]\n",
            )
            .expect_err("unknown role");
        assert!(err.to_string().contains("chef"));
        let err = set
            .add_text(
                Path::new("r.toml"),
                "[[profile]]\nname = \"x\"\nstack = \"s\"\nrole = \"proxy\"\nmatch_comm = [\"(\"]\n",
            )
            .expect_err("bad regex");
        assert!(err.to_string().contains("match_comm"));
    }
}
