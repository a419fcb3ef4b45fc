//! Redaction of secrets in env and cmdlines.
