//! Bounds on elapsed wall time. A test asserts a configured timeout was kept as
//! `elapsed < within(timeout)`, never a tighter figure: on a loaded 2-core machine a thread
//! can wait seconds for a core. What the step waits for when the timeout is not kept (a
//! hung peer, a blocked read) must outlast the bound, so that the assert can still fail.

use std::time::Duration;

/// What a loaded machine may add to a bound a test asserts on wall time (the unit tests'
/// `clock::TEST_SLACK`).
pub const SLACK: Duration = wedgewatch::clock::TEST_SLACK;

/// The latest a step bounded by `timeout` may end: `timeout` plus [`SLACK`].
pub fn within(timeout: Duration) -> Duration {
    wedgewatch::clock::test_bound(timeout)
}

/// Discovery's /proc deadlines for a test: a loaded machine must not cut a pass short (the
/// defaults are sized for a daemon on a host, where a pass left short is read again next
/// time; a test asserts on its one pass).
pub fn roomy_deadlines() -> wedgewatch::discover::ProcDeadlines {
    wedgewatch::discover::ProcDeadlines {
        read: SLACK,
        table: SLACK * 2,
    }
}
