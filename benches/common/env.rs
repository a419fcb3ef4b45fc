//! A bench's knobs from the environment.

/// `name` parsed from the environment, else `default` (unset or not a `T`).
pub fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}
