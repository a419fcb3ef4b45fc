//! doctor: what can be sampled here and why not.
