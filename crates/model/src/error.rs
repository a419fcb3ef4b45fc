//! Library error type. The binary wraps these in `anyhow` at the edge.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("probe profile {path}: {message}")]
    Probe { path: PathBuf, message: String },
    #[error("{path}: not a wedgewatch snapshot: {message}")]
    BadSnapshot { path: PathBuf, message: String },
    #[error("{0}")]
    Json(#[from] serde_json::Error),
    #[error("{what} timed out after {ms} ms")]
    Timeout { what: String, ms: u64 },
    #[error("{path}: {why}")]
    NotARecording { path: PathBuf, why: NotARecording },
    #[error("{0}")]
    Other(String),
}

impl Error {
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Error::Io {
            path: path.into(),
            source,
        }
    }
}

/// Why bytes are refused as a recording.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum NotARecording {
    #[error("empty file, not a wedgewatch recording")]
    Empty,
    #[error("a wedgewatch snapshot, not a recording (recordings come from `wedgewatch record` or the daemon)")]
    Snapshot,
    #[error("JSON, not a wedgewatch recording")]
    Json,
    #[error("gzip data not written by wedgewatch, not a recording")]
    ForeignGzip,
    #[error("not a wedgewatch recording (it does not start with a recording header)")]
    NoHeader,
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
