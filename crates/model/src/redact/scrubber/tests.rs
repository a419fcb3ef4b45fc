use super::*;
use serde_json::json;

fn v(s: &str) -> Vec<String> {
    s.split_whitespace().map(str::to_string).collect()
}

fn env_of(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect()
}

#[test]
fn env_names_decide() {
    let mut r = Redactor::new();
    let mut env = env_of(&[
        ("HF_TOKEN", "hf_abcdef"),
        ("OPENAI_API_KEY", "sk-123456"),
        ("db_password", "hunter22"),
        ("DB_PASS", "pass-word-1"),
        ("GH_PAT", "pat-value-2"),
        ("SGLANG_PORT", "30000"),
        ("PROXY", "http://bob:s3cr3t@proxy:8080/"),
        ("EMPTY_SECRET", ""),
        (
            "MODEL_CONFIG",
            r#"{"api_key": "json-in-env-3", "name": "m"}"#,
        ),
    ]);
    r.env(&mut env);
    for k in [
        "HF_TOKEN",
        "OPENAI_API_KEY",
        "db_password",
        "DB_PASS",
        "GH_PAT",
    ] {
        assert_eq!(env[k], REDACTED, "{k}");
    }
    assert_eq!(env["SGLANG_PORT"], "30000");
    assert_eq!(env["PROXY"], "http://bob:<redacted>@proxy:8080/");
    assert_eq!(env["EMPTY_SECRET"], "");
    assert_eq!(
        env["MODEL_CONFIG"],
        r#"{"api_key": "<redacted>", "name": "m"}"#
    );
    let s = r.scrub("token hf_abcdef and s3cr3t and json-in-env-3 in a log");
    assert_eq!(s, "token <redacted> and <redacted> and <redacted> in a log");
}

#[test]
fn args_flags_decide() {
    let mut r = Redactor::new();
    let out = r.args(&v("python -m x --api-key sk-1 --api-key=sk-2 --token t0k3n --port 30000 --model-path /m --url http://u:pw12@h:1 --password"));
    assert_eq!(
        out,
        v("python -m x --api-key <redacted> --api-key=<redacted> --token <redacted> --port 30000 --model-path /m --url http://u:<redacted>@h:1 --password")
    );
    assert!(r.secrets().any(|s| s == "t0k3n"));
    let out = r.args(&v(
        "curl -H Authorization: Bearer b34r3r-tok model.api_key=mk-9 http://h/v1?api_key=q1q1",
    ));
    assert_eq!(
        out,
        v("curl -H Authorization: Bearer <redacted> model.api_key=<redacted> http://h/v1?api_key=<redacted>")
    );
    let split = r.args(&[
        "Authorization: Basic".to_string(),
        "dXNlcjpwYXNz".to_string(),
    ]);
    assert_eq!(split[1], REDACTED);
    let one = r.args(&["Authorization: Bearer in-one-arg-1".to_string()]);
    assert_eq!(one, ["Authorization: Bearer <redacted>"]);
}

#[test]
fn learned_values_are_scrubbed_everywhere_in_the_output() {
    let mut r = Redactor::new();
    let mut parts = vec![
        json!({"env": {"HF_TOKEN": "plain-token-xyz"}}),
        json!({"threads": [{"tid": 1, "name": "w-plain-token-xyz"}]}),
        json!({"labels": {"api_key": "label-key-1", "url": "http://h/?token=q-tok-2"}}),
        json!({"stack": "f(plain-token-xyz) g(label-key-1) h(q-tok-2)"}),
    ];
    parts.iter().for_each(|p| r.learn_json(p));
    parts.iter_mut().for_each(|p| r.redact_json(p));
    let all = serde_json::to_string(&parts).unwrap_or_default();
    for s in ["plain-token-xyz", "label-key-1", "q-tok-2"] {
        assert!(!all.contains(s), "{s} leaked: {all}");
    }
    assert!(
        all.contains("HF_TOKEN") && all.contains("api_key"),
        "names stay"
    );
}

#[test]
fn change_records_keyed_by_a_secret_name_hide_both_sides() {
    let mut r = Redactor::new();
    let mut c =
        json!({"field": "env", "key": "DB_PASS", "before": "old-pw-1", "after": "new-pw-2"});
    r.redact_json(&mut c);
    assert_eq!(c["key"], "DB_PASS");
    assert_eq!(c["before"], REDACTED);
    assert_eq!(c["after"], REDACTED);
    let mut plain = json!({"field": "env", "key": "MAX_TOKENS", "before": "1", "after": "2"});
    r.redact_json(&mut plain);
    assert_eq!(plain["after"], "2");
}

#[test]
fn masking_keeps_secrets_comparable() {
    static KEY: std::sync::LazyLock<MaskKey> =
        std::sync::LazyLock::new(|| MaskKey::from_halves(5, 6));
    let mut r = Redactor::masking(Some(&KEY));
    let mut env = env_of(&[("HF_TOKEN", "tok-aaaa")]);
    r.env(&mut env);
    assert_eq!(env["HF_TOKEN"], KEY.mask("tok-aaaa"));
    let args = r.args(&v("--api-key key-bbbb"));
    assert_eq!(args[1], KEY.mask("key-bbbb"));
}

/// Ordinary values must stay readable: paths, model names, ports, git hashes, counts.
#[test]
fn ordinary_values_stay_readable() {
    let mut r = Redactor::new();
    let mut env = env_of(&[
        ("PATH", "/usr/local/bin:/usr/bin"),
        ("PWD", "/srv/models"),
        ("MAX_TOKENS", "4096"),
        ("SGLANG_DECODE_PREALLOC_SPLIT_TOKENS", "1"),
        ("CUDA_VISIBLE_DEVICES", "0,1,2,3"),
        ("GIT_COMMIT", "3f2c1a9e8b7d6c5f4e3d2c1b0a9f8e7d6c5b4a39"),
        ("HF_HOME", "/root/.cache/huggingface"),
        ("NO_PROXY", "localhost,127.0.0.1"),
        ("MODEL", "meta-llama/Llama-3.1-8B-Instruct"),
        ("LD_PRELOAD", ""),
        ("TOKENIZERS_PARALLELISM", "false"),
        (
            "SERVER_URL",
            "http://127.0.0.1:30000/v1/chat/completions?stream=true",
        ),
    ]);
    let before = env.clone();
    r.env(&mut env);
    assert_eq!(env, before);
    let argv = v("python3 -m sglang.launch_server --model-path /models/DeepSeek-V3 --port 30000 --tp-size 8 --max-total-tokens 65536 --host 0.0.0.0 --disaggregation-mode decode --dist-init-addr 10.0.0.1:5000 --served-model-name ds-v3");
    assert_eq!(r.args(&argv), argv);
    for t in [
        "File \"/usr/lib/python3.12/site-packages/sglang/srt/managers/scheduler.py\", line 1234, in event_loop",
        "sglang::scheduler_TP0",
        "VLLM::EngineCore_DP0",
        "decode@127.0.0.1:30000",
        "2026-12-01T05:46:55Z",
        "ESTABLISHED 10.0.0.1:443 -> 10.0.0.2:51234",
    ] {
        assert_eq!(r.text(t), t);
    }
    assert_eq!(r.secrets().count(), 0);
}
