//! Correlation: samples -> exchanges (per-request lifecycle), hop links, component state over time.
