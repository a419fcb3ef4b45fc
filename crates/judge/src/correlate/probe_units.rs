//! The probe sizes each server has answered (a health check's bytes in and out), learned on
//! any of its connections, so that several probes cut as one exchange on a connection with
//! no probe of its own are still known as repeats (`Conn::note_repeated_probe`).

/// Most distinct probe sizes kept per server (the newest; a hostile client may send as many
/// small requests of as many sizes as it likes).
pub const MAX_UNITS: usize = 8;

/// One server's probe sizes, newest last.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ProbeUnits {
    units: Vec<(u64, u64)>,
}

impl ProbeUnits {
    /// Notes one probe's (bytes in, bytes out), as the newest.
    pub fn learn(&mut self, unit: (u64, u64)) {
        if let Some(i) = self.units.iter().position(|u| *u == unit) {
            self.units.remove(i);
        } else if self.units.len() >= MAX_UNITS {
            self.units.remove(0);
        }
        self.units.push(unit);
    }

    /// The known sizes, newest first.
    pub fn iter(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.units.iter().rev().copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_newest_sizes_are_kept_once_each_and_bounded() {
        let mut p = ProbeUnits::default();
        assert_eq!(p.iter().count(), 0);
        p.learn((120, 111));
        p.learn((80, 60));
        p.learn((120, 111));
        assert_eq!(p.iter().collect::<Vec<_>>(), vec![(120, 111), (80, 60)]);
        for i in 0..100 {
            p.learn((i, i));
        }
        assert_eq!(p.iter().count(), MAX_UNITS);
        assert_eq!(p.iter().next(), Some((99, 99)));
        assert!(!p.iter().any(|u| u == (120, 111)), "the oldest went first");
    }
}
