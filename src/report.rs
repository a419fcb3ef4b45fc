//! report.md: the snapshot rendered as Markdown for a bug report.
