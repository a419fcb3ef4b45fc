//! The sampler: runs each source on its own cadence under its timeout.
