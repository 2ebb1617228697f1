//! llama-server's fields for the community samplers (DRY, XTC, mirostat, top-n-σ, dynamic
//! temperature), read into [`CommunityParams`]; the ranges are checked by
//! [`nucleus::sampling::SamplingParams::validate`], whose error names the field.

use nucleus::sampling::{order, ChainStage, CommunityParams};
use serde::Deserialize;
use serde_json::Value;

use crate::ApiError;

/// The request fields, with llama-server's names and meanings.
#[derive(Deserialize, Debug, Clone, Default)]
pub struct SamplerFields {
    pub dry_multiplier: Option<f32>,
    pub dry_base: Option<f32>,
    pub dry_allowed_length: Option<i64>,
    /// `-1`: the whole context; `0`: DRY off.
    pub dry_penalty_last_n: Option<i64>,
    pub dry_sequence_breakers: Option<Vec<String>>,
    pub xtc_probability: Option<f32>,
    pub xtc_threshold: Option<f32>,
    pub mirostat: Option<i64>,
    pub mirostat_tau: Option<f32>,
    pub mirostat_eta: Option<f32>,
    pub top_n_sigma: Option<f32>,
    pub dynatemp_range: Option<f32>,
    pub dynatemp_exponent: Option<f32>,
    /// llama-server's `samplers`: the order of the stages, a list of names
    /// (`["top_k", "top_p", "temperature"]`) or a string of letters (`"kpt"`).
    #[serde(rename = "samplers")]
    pub order: Option<Value>,
}

fn int(name: &str, v: i64, lo: i64, hi: i64) -> Result<i64, ApiError> {
    if (lo..=hi).contains(&v) {
        Ok(v)
    } else {
        Err(ApiError::param(
            name,
            format!("`{name}` = {v} is out of range [{lo}, {hi}]"),
        ))
    }
}

impl SamplerFields {
    /// Sets the fields present on `c` (range checks on the integers here, the rest in
    /// `SamplingParams::validate`).
    pub fn apply(&self, c: &mut CommunityParams) -> Result<(), ApiError> {
        let set = |dst: &mut f32, v: Option<f32>| {
            if let Some(v) = v {
                *dst = v;
            }
        };
        set(&mut c.dry_multiplier, self.dry_multiplier);
        set(&mut c.dry_base, self.dry_base);
        set(&mut c.xtc_probability, self.xtc_probability);
        set(&mut c.xtc_threshold, self.xtc_threshold);
        set(&mut c.mirostat_tau, self.mirostat_tau);
        set(&mut c.mirostat_eta, self.mirostat_eta);
        set(&mut c.top_n_sigma, self.top_n_sigma);
        set(&mut c.dynatemp_range, self.dynatemp_range);
        set(&mut c.dynatemp_exponent, self.dynatemp_exponent);
        if let Some(v) = self.dry_allowed_length {
            c.dry_allowed_length = int("dry_allowed_length", v, 0, 1 << 20)? as usize;
        }
        if let Some(v) = self.dry_penalty_last_n {
            c.dry_penalty_last_n = match int("dry_penalty_last_n", v, -1, i64::MAX)? {
                -1 => usize::MAX,
                n => n as usize,
            };
        }
        if let Some(b) = &self.dry_sequence_breakers {
            if b.is_empty() {
                return Err(ApiError::param(
                    "dry_sequence_breakers",
                    "`dry_sequence_breakers` must be a non-empty array of strings",
                ));
            }
            c.dry_sequence_breakers = b.clone();
        }
        if let Some(v) = self.mirostat {
            c.mirostat = int("mirostat", v, 0, 2)? as u8;
        }
        Ok(())
    }

    /// `samplers` read: `None` for llama.cpp's default order.
    pub fn order(&self) -> Result<Option<Vec<ChainStage>>, ApiError> {
        let bad = |reason: String| ApiError::param("samplers", format!("`samplers`: {reason}"));
        match &self.order {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(letters)) => order::from_letters(letters).map(Some).map_err(bad),
            Some(Value::Array(a)) => {
                let names = a
                    .iter()
                    .map(|v| v.as_str().ok_or(()))
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|_| bad("must be an array of sampler names or a string".into()))?;
                order::from_names(&names).map(Some).map_err(bad)
            }
            Some(_) => Err(bad(
                "must be an array of sampler names or a string of their letters".into(),
            )),
        }
    }

    /// The first field that asks for something (beam search, which does not sample, refuses
    /// it).
    pub fn first_set(&self, c: &CommunityParams) -> Option<&'static str> {
        [
            ("dry_multiplier", c.dry_on()),
            ("xtc_probability", c.xtc_on()),
            ("mirostat", c.mirostat > 0),
            ("top_n_sigma", c.top_n_sigma_on()),
            ("dynatemp_range", c.dynatemp_on()),
        ]
        .into_iter()
        .find(|x| x.1)
        .map(|x| x.0)
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn apply(v: serde_json::Value) -> Result<CommunityParams, String> {
        let f: SamplerFields = serde_json::from_value(v).unwrap();
        let mut c = CommunityParams::default();
        f.apply(&mut c).map_err(|e| e.param.unwrap_or_default())?;
        c.validate().map_err(|e| e.to_string())?;
        Ok(c)
    }

    #[test]
    fn llama_server_fields() {
        let c = apply(json!({
            "dry_multiplier": 0.8, "dry_base": 2.0, "dry_allowed_length": 3,
            "dry_penalty_last_n": -1, "dry_sequence_breakers": ["\n", "###"],
            "xtc_probability": 0.5, "xtc_threshold": 0.2, "mirostat": 2, "mirostat_tau": 4.0,
            "mirostat_eta": 0.2, "top_n_sigma": 1.5, "dynatemp_range": 0.3,
            "dynatemp_exponent": 2.0
        }))
        .unwrap();
        assert_eq!(c.dry_penalty_last_n, usize::MAX);
        assert_eq!(c.dry_sequence_breakers, vec!["\n", "###"]);
        assert_eq!((c.mirostat, c.mirostat_tau, c.mirostat_eta), (2, 4.0, 0.2));
        assert_eq!((c.xtc_probability, c.dynatemp_exponent), (0.5, 2.0));
        assert_eq!(apply(json!({"mirostat": 3})), Err("mirostat".into()));
        assert_eq!(
            apply(json!({"dry_penalty_last_n": -2})),
            Err("dry_penalty_last_n".into())
        );
        assert_eq!(
            apply(json!({"dry_sequence_breakers": []})),
            Err("dry_sequence_breakers".into())
        );
        assert!(apply(json!({"xtc_probability": 2.0}))
            .unwrap_err()
            .contains("`xtc_probability`"));
    }

    #[test]
    fn samplers_order() {
        use nucleus::sampling::ChainStage::*;
        let order = |v: serde_json::Value| {
            let f: SamplerFields = serde_json::from_value(v).unwrap();
            f.order().map_err(|e| e.message)
        };
        assert_eq!(order(json!({})), Ok(None));
        assert_eq!(
            order(json!({"samplers": ["top_k", "top_p", "temperature"]})),
            Ok(Some(vec![TopK, TopP, Temperature]))
        );
        assert_eq!(
            order(json!({"samplers": "kpt"})),
            Ok(Some(vec![TopK, TopP, Temperature]))
        );
        let e = order(json!({"samplers": ["top_k", "nope"]})).unwrap_err();
        assert!(e.contains("\"nope\""), "{e}");
        assert!(order(json!({"samplers": 3})).is_err());
    }
}
