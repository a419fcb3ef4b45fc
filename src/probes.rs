//! Probe profiles: declarative TOML files (`probes/*.toml`, plus `--probes DIR`) that say how
//! to recognise each kind of process of an inference stack, which metrics mean what, and how
//! to classify Python stacks. Adding a stack needs a new TOML file, not new Rust.
//!
//! A file may hold any of three arrays of tables: `[[profile]]` (discovery),
//! `[[metric_map]]` (see [`crate::sources::metrics::MetricMap`]) and `[[stack_rule]]`
//! (see [`crate::sources::stacks::StackRule`]). Unknown keys are an error naming the file and
//! the key.

use crate::error::{Error, Result};
use crate::sources::metrics::MetricMap;
use crate::sources::stacks::StackRule;
use serde::Deserialize;
use std::path::{Path, PathBuf};

include!(concat!(env!("OUT_DIR"), "/builtin_probes.rs"));

/// How to recognise one kind of process and what role it plays.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Profile {
    pub name: String,
    pub stack: String,
    /// Role name (`router`, `engine`, `scheduler`, ...). `engine` may be refined by
    /// `mode_flag` into `prefill`/`decode`.
    pub role: String,
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
            let text = std::fs::read_to_string(&f).map_err(|e| Error::io(&f, e))?;
            self.add_text(&f, &text)?;
        }
        Ok(())
    }

    pub fn add_text(&mut self, path: &Path, text: &str) -> Result<()> {
        let file: ProbeFile = toml::from_str(text).map_err(|e| Error::Probe {
            path: path.to_path_buf(),
            message: e.to_string(),
        })?;
        self.profiles.extend(file.profile);
        self.metric_maps.extend(file.metric_map);
        self.stack_rules.extend(file.stack_rule);
        self.files.push(path.to_path_buf());
        Ok(())
    }
}
