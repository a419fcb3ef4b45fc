//! GPU activity through NVML (nvml-wrapper).
