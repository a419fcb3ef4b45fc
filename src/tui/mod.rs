//! The terminal UI (ratatui). The only module that may depend on ratatui.
