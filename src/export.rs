//! Export the request timeline as Chrome trace-event JSON (Perfetto).
