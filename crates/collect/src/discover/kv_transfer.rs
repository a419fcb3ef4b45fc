//! An engine's KV transfer facts from its flags, as its profile's `kv_transfer` table says
//! where to read them: the backend (`--disaggregation-transfer-backend mooncake`, or the
//! `kv_connector` of vLLM's `--kv-transfer-config` JSON), which way its pages go (a prefill
//! sends, a decode receives; vLLM's `kv_role`), and a transfer port the JSON names.

use super::profiles::flag_value;
use crate::model::topology::labels::{LABEL_KV_BACKEND, LABEL_KV_SIDE};
use crate::model::{KvSide, Role};
use crate::probes::{KvTransferProfile, Profile};
use std::collections::BTreeMap;

/// Longest `config_flag` value parsed (a command line is bounded by the kernel anyway).
const MAX_CONFIG_BYTES: usize = 16 << 10;

/// Writes `kv_backend` and `kv_side` for an engine of role `role`.
pub(super) fn kv_labels(
    prof: &Profile,
    args: &[String],
    role: Role,
    labels: &mut BTreeMap<String, String>,
) {
    let Some(kv) = &prof.kv_transfer else {
        return;
    };
    let config = config_json(kv, args);
    let text = |key: &Option<String>| -> Option<String> {
        let v = config.as_ref()?.get(key.as_deref()?)?;
        v.as_str().map(str::to_string)
    };
    let backend = text(&kv.backend_key)
        .or_else(|| flag_value(args, kv.backend_flag.as_deref()?))
        .or_else(|| {
            kv.default_backend
                .clone()
                .filter(|_| kv.config_flag.is_none())
        });
    // Without a JSON config, the side is the engine's role; with one, its side key.
    let side_name = match &kv.config_flag {
        Some(_) => text(&kv.side_key),
        None => Some(role.as_str().to_string()),
    };
    let side = side_name.and_then(|n| KvSide::of(kv.sends.contains(&n), kv.receives.contains(&n)));
    // A side only where a transfer is configured at all.
    if let (Some(b), Some(s)) = (backend, side) {
        labels.insert(LABEL_KV_BACKEND.into(), b);
        labels.insert(LABEL_KV_SIDE.into(), s.as_str().into());
    }
}

/// The transfer port the JSON config names (`kv_port`), if any.
pub(super) fn kv_port(prof: &Profile, args: &[String]) -> Option<u16> {
    let kv = prof.kv_transfer.as_ref()?;
    let v = config_json(kv, args)?;
    let p = v.get(kv.port_key.as_deref()?)?;
    p.as_u64()
        .or_else(|| p.as_str().and_then(|s| s.parse().ok()))
        .and_then(|n| u16::try_from(n).ok())
}

/// The `config_flag`'s value as a JSON object; anything else (absent, too long, not an
/// object) is no config.
fn config_json(kv: &KvTransferProfile, args: &[String]) -> Option<serde_json::Value> {
    let raw = flag_value(args, kv.config_flag.as_deref()?)?;
    if raw.len() > MAX_CONFIG_BYTES {
        return None;
    }
    serde_json::from_str::<serde_json::Value>(&raw)
        .ok()
        .filter(serde_json::Value::is_object)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| s.to_string()).collect()
    }

    fn sglang() -> Profile {
        Profile {
            kv_transfer: Some(KvTransferProfile {
                backend_flag: Some("--disaggregation-transfer-backend".into()),
                default_backend: Some("mooncake".into()),
                sends: vec!["prefill".into()],
                receives: vec!["decode".into()],
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn vllm() -> Profile {
        Profile {
            kv_transfer: Some(KvTransferProfile {
                config_flag: Some("--kv-transfer-config".into()),
                backend_key: Some("kv_connector".into()),
                side_key: Some("kv_role".into()),
                port_key: Some("kv_port".into()),
                sends: vec!["kv_producer".into(), "kv_both".into()],
                receives: vec!["kv_consumer".into(), "kv_both".into()],
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn labels_of(p: &Profile, a: &[&str], role: Role) -> BTreeMap<String, String> {
        let mut l = BTreeMap::new();
        kv_labels(p, &args(a), role, &mut l);
        l
    }

    #[test]
    fn sglang_side_is_the_role_and_the_backend_its_flag_or_default() {
        let l = labels_of(
            &sglang(),
            &["--disaggregation-transfer-backend", "nixl"],
            Role::Decode,
        );
        assert_eq!(l[LABEL_KV_BACKEND], "nixl");
        assert_eq!(l[LABEL_KV_SIDE], "receiver");
        let l = labels_of(&sglang(), &[], Role::Prefill);
        assert_eq!(
            (l[LABEL_KV_BACKEND].as_str(), l[LABEL_KV_SIDE].as_str()),
            ("mooncake", "sender")
        );
        // A unified engine moves no KV.
        assert!(labels_of(&sglang(), &[], Role::Engine).is_empty());
    }

    #[test]
    fn vllm_side_backend_and_port_come_from_the_json() {
        let cfg =
            r#"{"kv_connector":"P2pNcclConnector","kv_role":"kv_consumer","kv_port":"21001"}"#;
        let a = ["--kv-transfer-config", cfg];
        let l = labels_of(&vllm(), &a, Role::Engine);
        assert_eq!(
            (l[LABEL_KV_BACKEND].as_str(), l[LABEL_KV_SIDE].as_str()),
            ("P2pNcclConnector", "receiver")
        );
        assert_eq!(kv_port(&vllm(), &args(&a)), Some(21001));
        let both = r#"{"kv_connector":"NixlConnector","kv_role":"kv_both"}"#;
        let l = labels_of(&vllm(), &["--kv-transfer-config", both], Role::Engine);
        assert_eq!(l[LABEL_KV_SIDE], "both");
        // No config, or not an object: nothing.
        assert!(labels_of(&vllm(), &[], Role::Engine).is_empty());
        assert!(labels_of(&vllm(), &["--kv-transfer-config", "[1]"], Role::Engine).is_empty());
        assert_eq!(
            kv_port(&vllm(), &args(&["--kv-transfer-config", "{"])),
            None
        );
    }
}
