//! Keyed masks of secret values for baselines: equal secrets give equal masks within one
//! daemon run, so `config_changed` still notices a changed secret, but a mask says nothing
//! about the value to anyone without the key.
//!
//! SipHash-2-4 under a random 128-bit key drawn once per process (one daemon run, one
//! recording); all 64 bits are kept. The key is never written anywhere. A mask reads
//! `<redacted:KEYID:MAC>`: `KEYID` is a 32-bit fingerprint of the key (SipHash of a fixed
//! label under it), so masks made under different keys (a recording directory continued by
//! a later daemon run) are known to be incomparable instead of reading as "changed".

use std::hash::Hasher;
use std::sync::OnceLock;

/// A secret key for masks. Deliberately neither `Debug` nor `Serialize`.
pub struct MaskKey {
    k0: u64,
    k1: u64,
    id: u32,
}

impl MaskKey {
    /// A key from explicit halves (tests).
    pub fn from_halves(k0: u64, k1: u64) -> MaskKey {
        let mut h = siphasher::sip::SipHasher24::new_with_keys(k0, k1);
        h.write(b"wedgewatch mask key id");
        MaskKey {
            k0,
            k1,
            id: (h.finish() >> 32) as u32,
        }
    }

    /// A fresh random key; `None` when the OS has no randomness to give (then baselines
    /// store plain `<redacted>`, never a weakly keyed mask).
    pub fn random() -> Option<MaskKey> {
        let mut b = [0u8; 16];
        getrandom::fill(&mut b).ok()?;
        let (a, c) = b.split_at(8);
        Some(MaskKey::from_halves(
            u64::from_le_bytes(a.try_into().ok()?),
            u64::from_le_bytes(c.try_into().ok()?),
        ))
    }

    /// This process's key (one per daemon run).
    pub fn process() -> Option<&'static MaskKey> {
        static KEY: OnceLock<Option<MaskKey>> = OnceLock::new();
        KEY.get_or_init(MaskKey::random).as_ref()
    }

    /// The stored form of a secret value.
    pub fn mask(&self, value: &str) -> String {
        let mut h = siphasher::sip::SipHasher24::new_with_keys(self.k0, self.k1);
        h.write(value.as_bytes());
        format!("<redacted:{:08x}:{:016x}>", self.id, h.finish())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::masked::{has_mask, same, unmask};

    #[test]
    fn equal_values_equal_masks_other_keys_other_masks() {
        let k = MaskKey::from_halves(1, 2);
        assert_eq!(k.mask("hunter22"), k.mask("hunter22"));
        assert_ne!(k.mask("hunter22"), k.mask("hunter23"));
        let other = MaskKey::from_halves(3, 4);
        assert_ne!(k.mask("hunter22"), other.mask("hunter22"));
        assert!(has_mask(&k.mask("x")) && !k.mask("hunter22").contains("hunter22"));
        assert_eq!(
            unmask(&format!("--api-key {}", k.mask("x"))),
            "--api-key <redacted>"
        );
    }

    /// The old CRC32(salt + value) mask was affine: for equal-length values
    /// mask(a) ^ mask(b) == crc(a) ^ crc(b) ^ const, independent of the salt, so a known
    /// old secret let anyone test guesses for the new one. A keyed PRF has no such relation.
    #[test]
    fn xor_of_masks_does_not_cancel_the_key() {
        let mac = |k: &MaskKey, v: &str| {
            let m = k.mask(v);
            u64::from_str_radix(&m[19..35], 16).unwrap_or(0)
        };
        let (k1, k2) = (MaskKey::from_halves(11, 12), MaskKey::from_halves(21, 22));
        let x1 = mac(&k1, "secret-aaaa") ^ mac(&k1, "secret-bbbb");
        let x2 = mac(&k2, "secret-aaaa") ^ mac(&k2, "secret-bbbb");
        assert_ne!(x1, x2, "the XOR of two masks must depend on the key");
    }

    #[test]
    fn masks_under_different_keys_are_not_a_change() {
        let (k1, k2) = (MaskKey::from_halves(1, 2), MaskKey::from_halves(3, 4));
        assert!(same(&k1.mask("a"), &k2.mask("b")));
        assert!(!same(&k1.mask("a"), &k1.mask("b")));
        assert!(same(&k1.mask("a"), &k1.mask("a")));
        assert!(MaskKey::random().is_some());
    }

    #[test]
    fn old_crc_masks_are_never_republished() {
        assert_eq!(unmask("<redacted:0badc0de>"), "<redacted>");
        let k = MaskKey::from_halves(1, 2);
        assert!(same("<redacted:0badc0de>", &k.mask("a")), "not comparable");
        assert!(!same("<redacted:0badc0de>", "<redacted:12345678>"));
    }
}
