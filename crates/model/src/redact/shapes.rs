//! Detection by value shape: tokens whose format says what they are, wherever they sit
//! (a thread name, a stack frame's argument, a metrics label, a log line).
//!
//! Only prefixes that vendors reserve for credentials and long enough bodies, so ordinary
//! values (paths, model names, git hashes, UUIDs, ports) never match. A secret with no
//! recognisable shape is caught only by name or structure.

use std::ops::Range;
use std::sync::LazyLock;

/// `None` only if a pattern were malformed, which the tests below rule out.
static SHAPES: LazyLock<Option<regex::Regex>> = LazyLock::new(|| {
    let alternatives = [
        // Hugging Face user access tokens
        r"\bhf_[A-Za-z0-9]{30,}",
        // OpenAI / Anthropic style (sk-..., sk-proj-..., sk-ant-...)
        r"\bsk-[A-Za-z0-9_\-]{20,}",
        // Stripe live/test keys
        r"\b[rs]k_(?:live|test)_[A-Za-z0-9]{16,}",
        // GitHub tokens (classic and fine-grained)
        r"\bgh[pousr]_[A-Za-z0-9]{30,}",
        r"\bgithub_pat_[A-Za-z0-9_]{30,}",
        // GitLab personal access tokens
        r"\bglpat-[A-Za-z0-9_\-]{20,}",
        // Slack tokens
        r"\bxox[abposr]-[A-Za-z0-9\-]{10,}",
        // AWS access key ids
        r"\b(?:AKIA|ASIA)[A-Z0-9]{16}\b",
        // Google API keys
        r"\bAIza[A-Za-z0-9_\-]{35}",
        // JWTs: base64url JSON header and payload, then a signature (may be empty)
        r"\beyJ[A-Za-z0-9_\-]{8,}\.eyJ[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]*",
        // PEM blocks (keys, certificates), to their END line or the end of the text
        r"-----BEGIN [A-Z0-9 ]+-----(?s:.*?)(?:-----END [A-Z0-9 ]+-----|\z)",
    ];
    regex::Regex::new(&alternatives.join("|")).ok()
});

/// Byte ranges of `text` that look like credentials by their shape.
pub fn find(text: &str) -> Vec<Range<usize>> {
    SHAPES
        .as_ref()
        .map(|re| re.find_iter(text).map(|m| m.range()).collect())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hits(t: &str) -> Vec<&str> {
        find(t).into_iter().map(|r| &t[r]).collect()
    }

    #[test]
    fn vendor_shapes_are_found() {
        assert!(SHAPES.is_some(), "the shape patterns compile");
        let hf = "hf_abcdefghijklmnopqrstuvwxyzABCDEFGH";
        let sk = "sk-proj-abcdefghijklmnopqrstuvwxyz012345";
        let gh = "ghp_abcdefghijklmnopqrstuvwxyz0123456789";
        let pat = "github_pat_11ABCDEFG0abcdefghijklmnopqrstuvwxyz";
        let slack = "xoxb-1234567890-abcdefghij";
        let aws = "AKIAIOSFODNN7EXAMPLE";
        let jwt = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U";
        let pem = "-----BEGIN RSA PRIVATE KEY-----\nMIIEow\nabc\n-----END RSA PRIVATE KEY-----";
        for s in [hf, sk, gh, pat, slack, aws, jwt, pem] {
            assert_eq!(hits(&format!("thread worker-{s} x")), vec![s], "{s}");
        }
        assert_eq!(
            hits("cert -----BEGIN CERTIFICATE-----\nMIIB"),
            vec!["-----BEGIN CERTIFICATE-----\nMIIB"]
        );
    }

    #[test]
    fn ordinary_values_are_not_shapes() {
        for plain in [
            "/models/meta-llama/Llama-3.1-8B-Instruct",
            "deepseek-ai/DeepSeek-V3",
            "hf_transfer",
            "hf_hub_cache",
            "sk-1",
            "task-queue-abcdefghijklmnopqrstuvwxyz",
            "3f2c1a9e8b7d6c5f4e3d2c1b0a9f8e7d6c5b4a39",
            "123e4567-e89b-12d3-a456-426614174000",
            "127.0.0.1:30000",
            "sglang::scheduler_TP0",
            "AKIA",
            "eyJ",
            "python3 -m sglang.launch_server --model-path /m --port 30000",
        ] {
            assert!(hits(plain).is_empty(), "{plain} is not a secret");
        }
    }
}
