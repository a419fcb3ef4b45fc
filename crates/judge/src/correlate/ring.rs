//! [`Ring`]: one of the model's history buffers (oldest first), which knows the estimated
//! bytes it holds ([`Footprint`], taken when an entry is pushed), so the model can bound its
//! whole history in bytes and evict the oldest entry of all buffers first (`mod.rs`).
//!
//! Read access is the `VecDeque`'s (through `Deref`); entries are added and removed only
//! through [`Ring::push_back`] and [`Ring::pop_front`], which keep the count.

use super::footprint::Footprint;
use crate::clock::Millis;
use std::collections::VecDeque;

/// When an entry happened, for oldest-first eviction across buffers.
pub trait Timed {
    fn t_ms(&self) -> Millis;
}

#[derive(Debug, Clone)]
pub struct Ring<T> {
    items: VecDeque<T>,
    /// The footprint of each entry when it was pushed (entries of closed connections may
    /// still gain a link afterwards: the count stays that of the push, so it never drifts).
    sizes: VecDeque<usize>,
    bytes: usize,
}

impl<T> Default for Ring<T> {
    fn default() -> Self {
        Ring {
            items: VecDeque::new(),
            sizes: VecDeque::new(),
            bytes: 0,
        }
    }
}

impl<T> std::ops::Deref for Ring<T> {
    type Target = VecDeque<T>;
    fn deref(&self) -> &VecDeque<T> {
        &self.items
    }
}

impl<T: Footprint + Timed> Ring<T> {
    pub fn push_back(&mut self, x: T) {
        let n = x.footprint();
        self.bytes += n;
        self.sizes.push_back(n);
        self.items.push_back(x);
    }

    /// When its oldest entry happened.
    pub fn front_t(&self) -> Option<Millis> {
        self.items.front().map(Timed::t_ms)
    }
}

impl<T> Ring<T> {
    pub fn pop_front(&mut self) -> Option<T> {
        let x = self.items.pop_front()?;
        let n = self.sizes.pop_front().unwrap_or(0);
        self.bytes = self.bytes.saturating_sub(n);
        Some(x)
    }

    /// Estimated bytes held.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    pub fn iter_mut(&mut self) -> std::collections::vec_deque::IterMut<'_, T> {
        self.items.iter_mut()
    }

    pub fn as_deque(&self) -> &VecDeque<T> {
        &self.items
    }
}

impl Timed for super::metrics::MetricsPoint {
    fn t_ms(&self) -> Millis {
        self.t_ms
    }
}

impl Timed for super::CountPoint {
    fn t_ms(&self) -> Millis {
        self.t_ms
    }
}

impl Timed for crate::model::StackCapture {
    fn t_ms(&self) -> Millis {
        self.t_ms
    }
}

impl Timed for (Millis, crate::model::GpuReading) {
    fn t_ms(&self) -> Millis {
        self.0
    }
}

/// A closed connection: when it closed (what the time bound cuts by too).
impl Timed for super::exchange::Conn {
    fn t_ms(&self) -> Millis {
        self.closed_ms.unwrap_or(self.last_seen_ms)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug)]
    struct Blob(Millis, usize);
    impl Footprint for Blob {
        fn footprint(&self) -> usize {
            self.1
        }
    }
    impl Timed for Blob {
        fn t_ms(&self) -> Millis {
            self.0
        }
    }

    #[test]
    fn counts_what_it_holds() {
        let mut r: Ring<Blob> = Ring::default();
        r.push_back(Blob(1, 100));
        r.push_back(Blob(2, 50));
        assert_eq!((r.bytes(), r.len(), r.front_t()), (150, 2, Some(1)));
        assert_eq!(r.pop_front().map(|b| b.0), Some(1));
        assert_eq!((r.bytes(), r.front_t()), (50, Some(2)));
        r.pop_front();
        assert!(r.pop_front().is_none());
        assert_eq!((r.bytes(), r.front_t()), (0, None));
    }
}
