//! The node identity as a snapshot shows it. The machine-id is a stable identifier of a
//! machine (systemd asks that it never be shown to the network as is): a redacted snapshot
//! carries an app-specific hash of it instead, the way `sd_id128_get_machine_app_specific`
//! derives one, so two snapshots of one machine still match in `merge` and a bundle posted
//! publicly does not give the identifier away. Hostname, boot-id (new every boot) and
//! addresses are kept: they are what an operator reads to know which node it is.

use crate::model::NodeIdentity;
use sha2::{Digest, Sha256};

/// Prefix of a hashed machine-id.
pub const HASHED: &str = "sha256:";

/// The identity as written: machine-id hashed when `redact` (idempotent).
pub fn for_output(mut n: NodeIdentity, redact: bool) -> NodeIdentity {
    if redact {
        n.machine_id = n.machine_id.map(|m| hash_machine_id(&m));
    }
    n
}

/// `sha256:` and the first 128 bits of SHA-256 over an application key and the id; an
/// already hashed id is returned as it is.
pub fn hash_machine_id(id: &str) -> String {
    if id.starts_with(HASHED) {
        return id.to_string();
    }
    let mut h = Sha256::new();
    h.update(b"wedgewatch.machine-id/1:");
    h.update(id.trim().as_bytes());
    let digest = h.finalize();
    let hex: String = digest[..16].iter().map(|b| format!("{b:02x}")).collect();
    format!("{HASHED}{hex}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_machine_id_is_hashed_stably_and_only_when_redacting() {
        let n = NodeIdentity {
            name: "a".into(),
            machine_id: Some("0123456789abcdef0123456789abcdef".into()),
            ..NodeIdentity::default()
        };
        let r = for_output(n.clone(), true);
        let m = r.machine_id.clone().unwrap();
        assert!(m.starts_with(HASHED) && m.len() == HASHED.len() + 32, "{m}");
        assert!(!m.contains("0123456789abcdef"));
        assert_eq!(
            for_output(r.clone(), true),
            r,
            "hashing twice changes nothing"
        );
        assert_eq!(for_output(n.clone(), false), n);
        let other = NodeIdentity {
            machine_id: Some("fedcba9876543210fedcba9876543210".into()),
            ..n
        };
        assert_ne!(for_output(other, true).machine_id, r.machine_id);
    }
}
