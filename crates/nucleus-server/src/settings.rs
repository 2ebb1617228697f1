//! [`ApiRequest::settings`]: a completions or chat body's fields, checked and turned into the
//! engine's [`GenSettings`], in steps (sampling, logit bias, logprobs, stops, length, streaming,
//! `best_of` and beams, constrained output and tools). The checks run in a fixed order: a body
//! with several faults is answered with the first one's error.

use std::collections::HashMap;

use nucleus::sampling::{GrammarSpec, SamplingError, SamplingParams};
use serde_json::Value;

use crate::api::{
    ApiRequest, BeamSettings, Endpoint, GenSettings, StopField, MAX_LOGPROBS, MAX_N, MAX_STOPS,
};
use crate::error::ApiError;
use crate::tools::ToolSettings;

fn range_f32(name: &str, v: Option<f32>, lo: f32, hi: f32) -> Result<Option<f32>, ApiError> {
    match v {
        Some(x) if !(x.is_finite() && x >= lo && x <= hi) => Err(ApiError::param(
            name,
            format!("`{name}` = {x} is out of range [{lo}, {hi}]"),
        )),
        _ => Ok(v),
    }
}

fn range_i64(name: &str, v: Option<i64>, lo: i64, hi: i64) -> Result<Option<i64>, ApiError> {
    match v {
        Some(x) if x < lo || x > hi => Err(ApiError::param(
            name,
            format!("`{name}` = {x} is out of range [{lo}, {hi}]"),
        )),
        _ => Ok(v),
    }
}

/// A probability in (0, 1] (`top_p`, `typical_p`).
fn open_unit(name: &str, v: Option<f32>) -> Result<Option<f32>, ApiError> {
    match v {
        Some(x) if !(x > 0.0 && x <= 1.0) => Err(ApiError::param(
            name,
            format!("`{name}` = {x} must be in (0, 1]"),
        )),
        _ => Ok(v),
    }
}

/// What constrains the output: a grammar (from a structured-output field or from `tools`), the
/// field that asked for it, and the tools with the stop strings they add.
struct Constrained {
    grammar: Option<GrammarSpec>,
    grammar_field: Option<&'static str>,
    tools: Option<ToolSettings>,
    stop: Vec<String>,
}

impl ApiRequest {
    pub fn settings(&self, ep: Endpoint, n_vocab: usize) -> Result<GenSettings, ApiError> {
        let mut sampling = self.sampling_params(ep, n_vocab)?;
        let n = range_i64("n", self.n, 1, MAX_N)?.unwrap_or(1) as usize;
        let stop = self.stops()?;
        let max_tokens = self.max_tokens(ep)?;
        if self.echo == Some(true) {
            return Err(ApiError::param("echo", "`echo` is not supported")
                .with_code("unsupported_parameter"));
        }
        let stream = self.stream()?;
        self.check_metadata()?;
        let best_of = range_i64("best_of", self.best_of, 1, MAX_N)?.map_or(n, |b| b as usize);
        if best_of < n {
            return Err(ApiError::param(
                "best_of",
                format!("`best_of` = {best_of} must be >= `n` = {n}"),
            ));
        }
        if ep == Endpoint::Chat && self.suffix.is_some() {
            return Err(ApiError::param(
                "suffix",
                "`suffix` (fill-in-the-middle) belongs to /v1/completions",
            )
            .with_code("unsupported_parameter"));
        }
        let beams = self.beam_settings(best_of)?;
        let constrained = self.constrained(ep, beams.is_some(), stop)?;
        if beams.is_none() && best_of > n && stream {
            return Err(ApiError::param(
                "best_of",
                "`best_of` > `n` cannot stream: the best choices are known only at the end",
            ));
        }
        sampling.grammar = constrained.grammar;
        Ok(GenSettings {
            reasoning: None,
            grammar_field: constrained.grammar_field,
            tools: constrained.tools,
            best_of,
            beams,
            explain: self.explain.unwrap_or(false),
            sampling,
            n,
            stream,
            include_usage: self
                .stream_options
                .as_ref()
                .and_then(|o| o.include_usage)
                .unwrap_or(false),
            stop: constrained.stop,
            max_tokens,
            ignore_eos: self.ignore_eos.unwrap_or(false),
            context_policy: match &self.context_policy {
                None => None,
                Some(name) => Some(
                    name.parse()
                        .map_err(|e: String| ApiError::param("context_policy", e))?,
                ),
            },
        })
    }

    /// The sampler's settings: its fields, `logit_bias`, `logprobs` and llama-server's samplers,
    /// checked together by [`SamplingParams::validate`].
    fn sampling_params(&self, ep: Endpoint, n_vocab: usize) -> Result<SamplingParams, ApiError> {
        let mut p = self.sampling_fields()?;
        if let Some(bias) = &self.logit_bias {
            p.logit_bias = logit_bias(bias, n_vocab)?;
        }
        p.logprobs = self.logprobs(ep)?;
        self.samplers.apply(&mut p.community)?;
        p.samplers = self.samplers.order()?;
        p.validate().map_err(|e| match e {
            SamplingError::InvalidParam { name, .. } => ApiError::param(name, e.to_string()),
            other => ApiError::invalid(other.to_string()),
        })?;
        Ok(p)
    }

    /// Temperature, the truncations (`top_p`, `top_k`, `min_p`, `typical_p`), the penalties
    /// and the seed.
    fn sampling_fields(&self) -> Result<SamplingParams, ApiError> {
        let mut p = SamplingParams::default();
        if let Some(t) = range_f32("temperature", self.temperature, 0.0, 2.0)? {
            p.temperature = t;
        }
        if let Some(v) = open_unit("top_p", self.top_p)? {
            p.top_p = v;
        }
        if let Some(v) = range_f32("presence_penalty", self.presence_penalty, -2.0, 2.0)? {
            p.presence_penalty = v;
        }
        if let Some(v) = range_f32("frequency_penalty", self.frequency_penalty, -2.0, 2.0)? {
            p.frequency_penalty = v;
        }
        if let Some(v) = range_i64("top_k", self.top_k, 0, i64::from(u32::MAX))? {
            p.top_k = v as usize;
        }
        if let Some(v) = range_f32("min_p", self.min_p, 0.0, 1.0)? {
            p.min_p = v;
        }
        if let Some(v) = open_unit("typical_p", self.typical_p)? {
            p.typical_p = v;
        }
        if let Some(v) = self.repetition_penalty {
            if !(v.is_finite() && v > 0.0) {
                return Err(ApiError::param(
                    "repetition_penalty",
                    format!("`repetition_penalty` = {v} must be > 0"),
                ));
            }
            p.repeat_penalty = v;
        }
        if let Some(v) = self.repeat_last_n {
            p.repeat_last_n = if v < 0 { usize::MAX } else { v as usize };
        }
        if let Some(v) = range_i64("no_repeat_ngram", self.no_repeat_ngram, 0, 64)? {
            p.no_repeat_ngram = v as usize;
        }
        p.seed = self.seed.map(|s| s as u64);
        Ok(p)
    }

    /// Completions: `logprobs` is the number of alternatives; chat: `logprobs` is a boolean
    /// and `top_logprobs` the number.
    fn logprobs(&self, ep: Endpoint) -> Result<Option<usize>, ApiError> {
        match ep {
            Endpoint::Completions => match &self.logprobs {
                None | Some(Value::Null) => Ok(None),
                Some(Value::Number(x)) => match x.as_i64() {
                    Some(k) if (0..=MAX_LOGPROBS).contains(&k) => Ok(Some(k as usize)),
                    _ => Err(ApiError::param(
                        "logprobs",
                        format!("`logprobs` must be an integer in [0, {MAX_LOGPROBS}]"),
                    )),
                },
                Some(_) => Err(ApiError::param("logprobs", "`logprobs` must be an integer")),
            },
            Endpoint::Chat => {
                let top = range_i64("top_logprobs", self.top_logprobs, 0, MAX_LOGPROBS)?;
                match &self.logprobs {
                    None | Some(Value::Null) | Some(Value::Bool(false)) => {
                        if top.is_some_and(|t| t > 0) {
                            return Err(ApiError::param(
                                "top_logprobs",
                                "`top_logprobs` requires `logprobs: true`",
                            ));
                        }
                        Ok(None)
                    }
                    Some(Value::Bool(true)) => Ok(Some(top.unwrap_or(0) as usize)),
                    Some(_) => Err(ApiError::param("logprobs", "`logprobs` must be a boolean")),
                }
            }
        }
    }

    fn stops(&self) -> Result<Vec<String>, ApiError> {
        let stop = match &self.stop {
            None => Vec::new(),
            Some(StopField::One(s)) => vec![s.clone()],
            Some(StopField::Many(v)) => v.clone(),
        };
        if stop.len() > MAX_STOPS {
            return Err(ApiError::param(
                "stop",
                format!("at most {MAX_STOPS} stop strings"),
            ));
        }
        Ok(stop)
    }

    /// `max_completion_tokens` or its old name `max_tokens` (16 by default on completions).
    fn max_tokens(&self, ep: Endpoint) -> Result<Option<usize>, ApiError> {
        if let (Some(a), Some(b)) = (self.max_completion_tokens, self.max_tokens) {
            if a != b {
                return Err(ApiError::param(
                    "max_completion_tokens",
                    format!("`max_completion_tokens` = {a} and `max_tokens` = {b} disagree; `max_completion_tokens` is the new name of `max_tokens`: send one"),
                ));
            }
        }
        let max = self.max_completion_tokens.or(self.max_tokens);
        let param = if self.max_completion_tokens.is_some() {
            "max_completion_tokens"
        } else {
            "max_tokens"
        };
        match max {
            Some(m) if m < 1 => Err(ApiError::param(
                param,
                format!("`{param}` = {m} must be >= 1"),
            )),
            Some(m) => Ok(Some(m as usize)),
            // The legacy completions endpoint defaults to 16 tokens, as OpenAI's.
            None if ep == Endpoint::Completions => Ok(Some(16)),
            None => Ok(None),
        }
    }

    /// `stream`, with `stream_options` only when streaming.
    fn stream(&self) -> Result<bool, ApiError> {
        let stream = self.stream.unwrap_or(false);
        if self.stream_options.is_some() && !stream {
            return Err(ApiError::param(
                "stream_options",
                "`stream_options` is only allowed with `stream: true`",
            ));
        }
        Ok(stream)
    }

    /// `metadata` is unused, but held to OpenAI's shape.
    fn check_metadata(&self) -> Result<(), ApiError> {
        match &self.metadata {
            None | Some(Value::Null) => Ok(()),
            Some(Value::Object(m)) if m.len() <= 16 && m.values().all(Value::is_string) => Ok(()),
            Some(_) => Err(ApiError::param(
                "metadata",
                "`metadata` must be an object of at most 16 string values",
            )),
        }
    }

    /// The structured-output field or the tools (chat only), which exclude each other, beam
    /// search and `ignore_eos`; the tools' stop string joins `stop`.
    fn constrained(
        &self,
        ep: Endpoint,
        beams: bool,
        mut stop: Vec<String>,
    ) -> Result<Constrained, ApiError> {
        let constraint = crate::structured::constraint(self)?;
        let tools = match ep {
            Endpoint::Chat => crate::tools::tool_settings(self)?,
            Endpoint::Completions => {
                crate::reasoning::refuse_on_completions(self)?;
                self.refuse_tools_on_completions()?;
                None
            }
        };
        let mut grammar = None;
        let mut grammar_field = None;
        if let Some(c) = constraint {
            if tools.is_some() {
                return Err(ApiError::param(
                    c.field,
                    format!(
                        "`{}` cannot be combined with `tools` (unless `tool_choice` is \"none\")",
                        c.field
                    ),
                ));
            }
            grammar = Some(c.spec);
            grammar_field = Some(c.field);
        }
        if let Some(t) = &tools {
            if let Some(g) = &t.grammar {
                grammar = Some(g.clone());
                grammar_field = Some("tools");
            }
            if let Some(s) = t.stop.as_ref().filter(|s| !stop.contains(s)) {
                stop.push(s.clone());
            }
        }
        if let Some(field) = grammar_field.or(tools.as_ref().map(|_| "tools")) {
            if beams {
                return Err(ApiError::param(
                    field,
                    format!("`{field}` does not combine with `use_beam_search`"),
                ));
            }
        }
        if grammar_field.is_some() && self.ignore_eos == Some(true) {
            return Err(ApiError::param(
                "ignore_eos",
                "`ignore_eos` does not combine with a constrained output, which ends once complete",
            ));
        }
        Ok(Constrained {
            grammar,
            grammar_field,
            tools,
            stop,
        })
    }

    /// A non-empty `tools` on /v1/completions.
    fn refuse_tools_on_completions(&self) -> Result<(), ApiError> {
        if !matches!(&self.tools, None | Some(Value::Null))
            && self
                .tools
                .as_ref()
                .and_then(Value::as_array)
                .is_none_or(|a| !a.is_empty())
        {
            return Err(
                ApiError::param("tools", "`tools` belong to /v1/chat/completions")
                    .with_code("unsupported_parameter"),
            );
        }
        Ok(())
    }

    /// `use_beam_search` (with `best_of` beams, `length_penalty`), refusing the sampler settings
    /// it would leave unused.
    fn beam_settings(&self, width: usize) -> Result<Option<BeamSettings>, ApiError> {
        let length_penalty = range_f32("length_penalty", self.length_penalty, -10.0, 10.0)?;
        if self.use_beam_search != Some(true) {
            if length_penalty.is_some_and(|a| a != 1.0) {
                return Err(ApiError::param(
                    "length_penalty",
                    "`length_penalty` applies to beam search only: set `use_beam_search: true`",
                ));
            }
            return Ok(None);
        }
        self.refuse_sampling_with_beams()?;
        if self.context_policy.as_deref() == Some("stream") {
            return Err(ApiError::param(
                "context_policy",
                "beam search cannot stream past the context window: use `error` or `truncate`",
            ));
        }
        Ok(Some(BeamSettings {
            width,
            length_penalty: length_penalty.unwrap_or(1.0),
        }))
    }

    /// Beam search does not sample: the first sampler setting that is set away from its
    /// neutral value is refused.
    fn refuse_sampling_with_beams(&self) -> Result<(), ApiError> {
        let unused = |field: &str, neutral: bool| -> Result<(), ApiError> {
            if neutral {
                return Ok(());
            }
            Err(ApiError::param(
                field,
                format!("`{field}` steers sampling; beam search does not sample: leave it out with `use_beam_search`"),
            ))
        };
        unused("temperature", self.temperature.is_none_or(|t| t == 0.0))?;
        unused("top_p", self.top_p.is_none_or(|v| v == 1.0))?;
        unused("top_k", self.top_k.is_none_or(|v| v <= 0))?;
        unused("min_p", self.min_p.is_none_or(|v| v == 0.0))?;
        unused("typical_p", self.typical_p.is_none_or(|v| v == 1.0))?;
        unused(
            "presence_penalty",
            self.presence_penalty.is_none_or(|v| v == 0.0),
        )?;
        unused(
            "frequency_penalty",
            self.frequency_penalty.is_none_or(|v| v == 0.0),
        )?;
        unused(
            "repetition_penalty",
            self.repetition_penalty.is_none_or(|v| v == 1.0),
        )?;
        unused(
            "no_repeat_ngram",
            self.no_repeat_ngram.is_none_or(|v| v == 0),
        )?;
        unused(
            "logit_bias",
            self.logit_bias.as_ref().is_none_or(HashMap::is_empty),
        )?;
        let no_logprobs = matches!(
            self.logprobs,
            None | Some(Value::Null) | Some(Value::Bool(false))
        );
        unused("logprobs", no_logprobs)?;
        unused("explain", self.explain != Some(true))?;
        let mut community = nucleus::sampling::CommunityParams::default();
        self.samplers.apply(&mut community)?;
        if let Some(field) = self.samplers.first_set(&community) {
            unused(field, false)?;
        }
        unused("samplers", self.samplers.order()?.is_none())
    }
}

/// `logit_bias`: token ids (as strings) to biases in [-100, 100], sorted by token; -100 bans
/// the token.
fn logit_bias(bias: &HashMap<String, f32>, n_vocab: usize) -> Result<Vec<(u32, f32)>, ApiError> {
    let mut out = Vec::with_capacity(bias.len());
    for (k, &b) in bias {
        let tok: u32 = k.trim().parse().map_err(|_| {
            ApiError::param(
                "logit_bias",
                format!("logit_bias key {k:?} is not a token id"),
            )
        })?;
        if tok as usize >= n_vocab {
            return Err(ApiError::param(
                "logit_bias",
                format!("logit_bias token {tok} is outside the vocabulary of {n_vocab}"),
            ));
        }
        if !(-100.0..=100.0).contains(&b) {
            return Err(ApiError::param(
                "logit_bias",
                format!("logit_bias value {b} for token {tok} must be in [-100, 100]"),
            ));
        }
        // OpenAI: -100 effectively bans the token.
        out.push((tok, if b <= -100.0 { f32::NEG_INFINITY } else { b }));
    }
    out.sort_by_key(|&(t, _)| t);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The field the first failing check names, for a body with several faults.
    fn first_fault(ep: Endpoint, body: &str) -> String {
        let req = crate::api::parse(body.as_bytes()).expect("parses");
        let e = req.settings(ep, 100).expect_err("refused");
        e.param.unwrap_or_default()
    }

    #[test]
    fn the_checks_run_in_their_order() {
        let chat = Endpoint::Chat;
        let cases = [
            (
                r#"{"temperature": 5, "logit_bias": {"x": 1}, "n": 99}"#,
                "temperature",
            ),
            (
                r#"{"logit_bias": {"100": 1}, "logprobs": "yes"}"#,
                "logit_bias",
            ),
            (r#"{"logprobs": "yes", "n": 99}"#, "logprobs"),
            (r#"{"n": 99, "max_tokens": 0}"#, "n"),
            (r#"{"max_tokens": 0, "echo": true}"#, "max_tokens"),
            (r#"{"echo": true, "stream_options": {}}"#, "echo"),
            (r#"{"stream_options": {}, "metadata": 1}"#, "stream_options"),
            (r#"{"metadata": 1, "n": 2, "best_of": 1}"#, "metadata"),
            (r#"{"n": 2, "best_of": 1, "suffix": "x"}"#, "best_of"),
            (
                r#"{"suffix": "x", "use_beam_search": true, "top_p": 0.5}"#,
                "suffix",
            ),
            (
                r#"{"use_beam_search": true, "top_p": 0.5, "grammar": 1}"#,
                "top_p",
            ),
            (
                r#"{"use_beam_search": true, "response_format": {"type": "json_object"}, "ignore_eos": true}"#,
                "response_format",
            ),
            (
                r#"{"response_format": {"type": "json_object"}, "ignore_eos": true, "n": 1, "best_of": 2, "stream": true}"#,
                "ignore_eos",
            ),
            (
                r#"{"best_of": 2, "stream": true, "context_policy": "no"}"#,
                "best_of",
            ),
            (r#"{"context_policy": "no"}"#, "context_policy"),
        ];
        for (body, field) in cases {
            assert_eq!(first_fault(chat, body), field, "{body}");
        }
        // Completions: the per-endpoint rules come after the structured-output field's check.
        let completions = Endpoint::Completions;
        let body = r#"{"response_format": 1, "tools": [{"type": "function"}]}"#;
        assert_eq!(first_fault(completions, body), "response_format");
        let body = r#"{"tools": [{"type": "function"}], "ignore_eos": true}"#;
        assert_eq!(first_fault(completions, body), "tools");
    }

    #[test]
    fn the_steps_fill_the_settings() {
        let body = r#"{"temperature": 0.5, "top_p": 0.9, "logit_bias": {"7": -100, "3": 2},
            "logprobs": true, "top_logprobs": 2, "stop": "x", "max_completion_tokens": 5,
            "stream": true, "stream_options": {"include_usage": true}, "n": 2, "seed": 4}"#;
        let req = crate::api::parse(body.as_bytes()).expect("parses");
        let s = req.settings(Endpoint::Chat, 100).expect("valid");
        assert_eq!(s.sampling.temperature, 0.5);
        assert_eq!(s.sampling.top_p, 0.9);
        assert_eq!(
            s.sampling.logit_bias,
            vec![(3, 2.0), (7, f32::NEG_INFINITY)]
        );
        assert_eq!(s.sampling.logprobs, Some(2));
        assert_eq!(s.sampling.seed, Some(4));
        assert_eq!(s.stop, vec!["x".to_string()]);
        assert_eq!(s.max_tokens, Some(5));
        assert!(s.stream && s.include_usage);
        assert_eq!((s.n, s.best_of), (2, 2));
        assert!(s.beams.is_none() && s.sampling.grammar.is_none());
        // Completions default to 16 tokens; chat to none.
        let req = crate::api::parse(b"{}").expect("parses");
        assert_eq!(
            req.settings(Endpoint::Completions, 100).unwrap().max_tokens,
            Some(16)
        );
        assert_eq!(req.settings(Endpoint::Chat, 100).unwrap().max_tokens, None);
    }
}
