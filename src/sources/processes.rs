//! Process facts from /proc.
