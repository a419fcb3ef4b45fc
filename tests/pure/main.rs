//! Tests that need no process, socket or `/proc` of their own: the model, the correlator
//! and detectors, the outputs, the TUI in a test backend, fuzz corpora and the layering.
//! One binary: one link for all of them.

mod blame_past_hop;
mod correlate_channels;
mod correlate_headers_only;
mod detectors;
mod discovery_cache;
mod discovery_scope;
mod early_verdicts;
mod export;
mod fake_proc;
mod fuzz_corpora;
mod history_bounds;
mod kv_transfer_stalled;
mod many_mappings;
mod one_story;
mod prom_fuzz;
mod prometheus_exposition;
mod record;
mod redaction_outputs;
mod report_replay;
mod snapshot_sockets;
mod stack_corpus;
mod tui_80x24;
mod tui_follow;
mod tui_snapshots;
mod witnesses;
