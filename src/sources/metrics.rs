//! Prometheus metrics, router /workers and engine /v1/loads.

use serde::Deserialize;

/// Which series mean what for one stack (owned by the metrics source; placeholder shape).
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct MetricMap {
    pub stack: String,
}
