//! Diff two snapshots: what changed since the baseline (env, cmdline, version, topology, process).
