//! Loading [`Thresholds`] from TOML. The struct itself and its defaults live in the model
//! layer (`model::thresholds`), since the correlator reads them too.

use crate::model::Thresholds;

impl Thresholds {
    /// Loads thresholds from TOML; missing keys keep their defaults, unknown keys and values
    /// out of range are an error naming the key (see [`Thresholds::validate`]).
    pub fn from_toml(text: &str) -> crate::Result<Thresholds> {
        let bad = |m: String| crate::Error::Other(m);
        let t: Thresholds =
            toml::from_str(text).map_err(|e| bad(crate::config_check::toml_message(text, &e)))?;
        t.validate().map_err(|e| bad(e.to_string()))?;
        Ok(t)
    }
}
