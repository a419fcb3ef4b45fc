//! Recordings: append-only, size-bounded segment files of samples, tolerant of a torn tail.
