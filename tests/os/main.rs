//! Tests that run the binary, spawn processes, open sockets or read `/proc`, without a lab
//! stack (those are the lab binary, `tests/labs/`). One binary: one link for all of them.

mod allocator;
mod bundle_safety;
mod cli_contract;
mod cli_errors;
mod config_errors;
mod correlate;
mod daemon;
mod daemon_log;
mod daemon_trust;
mod deploy_daemonset;
mod diff;
mod exporter_http;
mod fleet_snapshot;
mod hang_safety;
mod incidents;
mod input_safety;
mod layers;
mod merge;
mod metric_names;
mod metrics;
mod metrics_hostile;
mod output_safety;
mod prometheus_rules;
mod record_reader;
mod redaction;
mod report;
mod router_profiles;
mod service_unit;
mod sglang_lab_edits;
mod snapshot_contract;
mod sockets;
mod test_groups;
mod tui_pty;
mod versions_live;
mod versions_root;
