//! The end of a one-shot collection's window, for a source whose sample is made of steps (the
//! stacks source's rounds of dumps). A one-shot cuts every sample still running at its window's
//! end plus grace, and a cut sample carries nothing; a source that knows when stops at a step
//! just before and delivers what it has. The sampler sets the time in a task-local (so
//! [`Source`] stays one call); the daemon sets none.
//!
//! [`Source`]: super::Source

use std::future::Future;
use std::time::Duration;
use tokio::time::Instant;

tokio::task_local! {
    static FINISH_BY: Instant;
}

/// What a source keeps back before the cut to hand its sample over.
const HAND_OVER: Duration = Duration::from_millis(150);

/// Runs `sample` with `finish_by` as the time its sample will be cut off (None: no cut).
pub async fn until<F: Future>(finish_by: Option<Instant>, sample: F) -> F::Output {
    match finish_by {
        Some(t) => FINISH_BY.scope(t, sample).await,
        None => sample.await,
    }
}

/// When the running sample should be handed over at the latest: a little before the
/// collection cuts it off. None outside a one-shot collection.
pub fn wrap_up_by() -> Option<Instant> {
    FINISH_BY
        .try_with(|t| *t)
        .ok()
        .map(|t| t.checked_sub(HAND_OVER).unwrap_or(t))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_end_is_seen_inside_only() {
        assert_eq!(wrap_up_by(), None);
        let end = Instant::now() + Duration::from_secs(5);
        let seen = until(Some(end), async { wrap_up_by() }).await;
        assert_eq!(seen, Some(end - HAND_OVER));
        assert_eq!(until(None, async { wrap_up_by() }).await, None);
    }
}
