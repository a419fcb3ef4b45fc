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
    NotARecording {
        path: PathBuf,
        why: crate::record::NotARecording,
    },
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

pub type Result<T, E = Error> = std::result::Result<T, E>;
