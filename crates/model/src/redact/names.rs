//! Detection by name: which variable, option, label or JSON key holds a secret.
//!
//! Word-wise (words split at anything not alphanumeric), because counts are not secrets:
//! `MAX_TOKENS` stays visible, while `HF_TOKEN`, `OPENAI_API_KEY`, `DB_PASS` are secret.

/// Substrings that make a name secret wherever they appear.
const SECRET_ANYWHERE: &[&str] = &[
    "SECRET",
    "PASSWORD",
    "PASSWD",
    "PASSPHRASE",
    "CREDENTIAL",
    "COOKIE",
    "PRIVATE",
    "APIKEY",
    "ACCESSKEY",
];
/// A word of the name that is or ends with one of these makes it secret.
const SECRET_WORD_ENDS: &[&str] = &["KEY", "KEYS", "TOKEN", "AUTH", "JWT", "BEARER"];
/// A word of the name that is exactly one of these makes it secret (as suffixes they
/// would hit ordinary words: `BYPASS`, `COMPASS`, `SPAT`).
const SECRET_WORDS: &[&str] = &[
    "PASS",
    "PW",
    "PAT",
    "CREDS",
    "DSN",
    "SIG",
    "SIGNATURE",
    "SESSIONID",
    "SID",
];
/// Names that match the rules above but are plainly not secret (`PWD` is the working
/// directory), compared case-insensitively.
const NOT_SECRET: &[&str] = &["PWD", "OLDPWD"];
/// Our own JSON field names, compared exactly: `key` is the env-name column of `Change`
/// records (an env variable named `KEY` is still secret).
const OUR_FIELDS: &[&str] = &["key", "keys"];

/// Whether a variable/option/label/JSON key name looks like it holds a secret.
pub fn is_secret_name(name: &str) -> bool {
    // Upper-cased on the stack: a redaction pass asks this of every key of a snapshot.
    let mut buf = [0u8; 64];
    let Some(up) = buf.get_mut(..name.len()) else {
        return is_secret_upper(&name.to_ascii_uppercase());
    };
    up.copy_from_slice(name.as_bytes());
    up.make_ascii_uppercase();
    // ASCII case changes keep UTF-8 valid
    std::str::from_utf8(up).is_ok_and(is_secret_upper)
}

/// [`is_secret_name`] of a name already upper-cased.
fn is_secret_upper(up: &str) -> bool {
    let bare = up.trim_start_matches('-');
    if NOT_SECRET.contains(&bare) {
        return false;
    }
    if SECRET_ANYWHERE.iter().any(|w| up.contains(w)) {
        return true;
    }
    up.split(|c: char| !c.is_ascii_alphanumeric()).any(|word| {
        word.starts_with("AUTH")
            || SECRET_WORDS.contains(&word)
            || SECRET_WORD_ENDS.iter().any(|w| word.ends_with(w))
    })
}

/// Whether a JSON object key names a secret: as [`is_secret_name`], except our own fields.
pub fn is_secret_field(name: &str) -> bool {
    !OUR_FIELDS.contains(&name) && is_secret_name(name)
}

#[cfg(test)]
mod tests {
    use super::{is_secret_field, is_secret_name};

    #[test]
    fn our_key_field_is_not_a_secret_but_a_key_parameter_is() {
        assert!(!is_secret_field("key") && is_secret_field("api_key"));
        assert!(is_secret_name("key"), "?key=... in a URL is a credential");
    }

    #[test]
    fn secrets_by_word_not_counts() {
        for secret in [
            "HF_TOKEN",
            "OPENAI_API_KEY",
            "api-key",
            "APIKEY",
            "apiKey",
            "AWS_SECRET_ACCESS_KEY",
            "DB_PASSWORD",
            "DB_PASS",
            "GH_PAT",
            "SENTRY_DSN",
            "GOOGLE_APPLICATION_CREDENTIALS",
            "AUTHORIZATION",
            "PROXY_AUTH",
            "SSH_PRIVATE",
            "API_KEYS",
            "model.api_key",
            "--hf-token",
            "access_token",
            "sig",
            "KEY",
        ] {
            assert!(is_secret_name(secret), "{secret} must be redacted");
        }
        for plain in [
            "SGLANG_DECODE_PREALLOC_SPLIT_TOKENS",
            "MAX_TOKENS",
            "CUDA_VISIBLE_DEVICES",
            "TOKENIZERS_PARALLELISM",
            "SGLANG_TOKENIZER_PATH",
            "PWD",
            "OLDPWD",
            "KEYBOARD_LAYOUT",
            "BYPASS_CACHE",
            "PATH",
            "PATCH_LEVEL",
            "sglang:num_tokens",
            "model_path",
            "PASSES",
        ] {
            assert!(!is_secret_name(plain), "{plain} must stay visible");
        }
    }
}
