//! A lenient Prometheus text-format parser.
