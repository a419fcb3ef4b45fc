//! Detectors: small lint-like functions over the correlated model, each producing findings with evidence.
