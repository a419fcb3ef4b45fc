//! The daemon: continuous sampling, bounded history, baselines, live state on a Unix socket.
