//! Pi0.5 as a policy sees it. [`open`] settles the sizes (tensor shapes, lerobot's `config.json`,
//! the caller's choices), reads the normalization statistics and the tokenizer, builds the plan
//! and returns the [`ModelSpec`]; [`Pi05Processing`] keeps the prompt and writes each step's
//! tokens, with the state discretized into them (the state reaches Pi0.5 only as prompt text).

use crate::backend::Backend;
use crate::checkpoint::Checkpoint;
use crate::config::PolicyConfig;
use crate::error::{Error, Result};
use crate::models::{ConfigJson, EmbodimentInfo, ModelConfig, ModelInfo, ModelKind, ModelSpec, Processing};

use super::norm::{FeatureStats, NormStats};
use super::prompt::{PromptTokenizer, discretize_state, is_blank_task, raw_tokens};
use super::{BuildOptions, Config, LerobotConfig, PromptInputs, build};

pub fn open(ckpt: &Checkpoint, json: Option<&ConfigJson>, config: &PolicyConfig, progress: &dyn Fn(usize)) -> Result<ModelSpec> {
    let dir = ckpt.dir();
    if let Some(tag) = &config.embodiment {
        return Err(Error::invalid("config.embodiment", format!("{tag:?} given, but Pi0.5 has no embodiments (a GR00T setting)")));
    }
    if config.rtc.is_some_and(|r| !r.schedule.guided()) {
        return Err(Error::invalid(
            "config.rtc.schedule",
            "ramp is GR00T N1.7's real-time chunking; Pi0.5 guides its sampler with zeros, ones, linear or exp",
        ));
    }
    let lerobot: Option<LerobotConfig> = json.map(ConfigJson::parse).transpose()?;
    let mut model_config = Config::from_checkpoint(ckpt, lerobot.as_ref())?;
    if let Some(n) = config.prompt_len {
        model_config.prompt_len = n;
    }
    if let Some(n) = config.denoise_steps {
        model_config.denoise_steps = n;
    }
    if model_config.denoise_steps == 0 || model_config.prompt_len == 0 || model_config.horizon == 0 {
        return Err(Error::invalid("config", "denoise_steps, prompt length and horizon must be positive"));
    }
    let cameras = config.cameras.unwrap_or(model_config.cameras.len());
    if cameras == 0 {
        return Err(Error::invalid("config.cameras", "at least one camera is required"));
    }
    // Pi0.5's weights do not fix the number of views; slots beyond the checkpoint's named
    // cameras get distinct names, so explain() and error messages can tell them apart.
    let named = model_config.cameras.len();
    model_config.cameras.extend((named..cameras).map(|i| format!("observation.images.extra_{}", i - named)));
    model_config.cameras.truncate(cameras);

    let norm = NormStats::find(dir, lerobot.as_ref().map(LerobotConfig::modes).unwrap_or_default())?;
    let checkpoint_state_dim = model_config.state_dim.or(norm.state.as_ref().map(FeatureStats::dim));
    let state_dim = match (checkpoint_state_dim, config.state_dim) {
        (Some(ours), Some(asked)) if asked != ours => {
            return Err(Error::invalid(
                "config.state_dim",
                format!("{asked} differs from the checkpoint's {ours} (config.json / statistics); leave it unset or give {ours}"),
            ));
        }
        (Some(dim), _) | (None, Some(dim)) => dim,
        (None, None) => {
            return Err(Error::invalid("config.state_dim", "the checkpoint states no state dimension (config.json / statistics); set it"));
        }
    };
    let out_action_dim = model_config.robot_action_dim.or(norm.action.as_ref().map(FeatureStats::dim)).unwrap_or(model_config.action_dim);
    for (what, stats, dim) in [("state", &norm.state, state_dim), ("action", &norm.action, out_action_dim)] {
        if let Some(s) = stats.as_ref().filter(|s| s.dim() != dim) {
            return Err(Error::checkpoint(dir, format!("{what} statistics have {} dims, the policy uses {dim}", s.dim())));
        }
    }
    if out_action_dim > model_config.action_dim {
        return Err(Error::checkpoint(
            dir,
            format!("action dim {out_action_dim} exceeds the model's action width {}", model_config.action_dim),
        ));
    }
    let (action_scale, action_offset) = match &norm.action {
        Some(s) => s.unnormalize_affine(),
        None => (vec![1.0; out_action_dim], vec![0.0; out_action_dim]),
    };

    let tokenizer_path = config.tokenizer.clone().or_else(|| Some(dir.join("tokenizer.json")).filter(|p| p.exists()));
    let tokenizer = match tokenizer_path {
        Some(p) => {
            let tokenizer = PromptTokenizer::from_file(&p, model_config.prompt_len, state_dim)?;
            crate::models::check_ids_fit_embedding(&p, tokenizer.vocab_size(), &model_config.embedding_tensor, model_config.vocab)?;
            Some(tokenizer)
        }
        None => {
            log::warn!("no tokenizer.json beside the checkpoint: only raw token prompts (set_prompt_tokens) are accepted");
            None
        }
    };

    let opts = BuildOptions {
        cameras,
        max_frame_width: config.max_frame_width,
        max_frame_height: config.max_frame_height,
        out_action_dim,
        action_scale,
        action_offset,
        prompt_buckets: config.prompt_buckets,
        rtc: config.rtc,
    };
    let built = build(ckpt, &model_config, &opts, progress)?;
    let capacity = model_config.prompt_len;
    let processing = Pi05Processing {
        tokenizer,
        state_stats: norm.state,
        prompt: Prompt::None,
        vocab: model_config.vocab,
        inputs: built.prompt,
        bins: vec![0; state_dim],
        tokens: vec![0; capacity],
        token_mask: vec![false; capacity],
    };
    let info = ModelInfo {
        kind: ModelKind::Pi05,
        cameras: model_config.cameras.clone(),
        state_dim,
        horizon: model_config.horizon,
        action_dim: out_action_dim,
        denoise_steps: model_config.denoise_steps,
        prompt_capacity: capacity,
        parameters: model_config.parameter_count(),
        config: ModelConfig::Pi05(model_config),
        embodiment: None,
        embodiments: Vec::new(),
    };
    Ok(ModelSpec { plan: built.plan, weights: built.weights, io: built.io, processing: Box::new(processing), info })
}

enum Prompt {
    None,
    /// Text: the task part is tokenized; state bins are assembled in every step.
    Text,
    /// Raw token ids given by the caller, used as they are.
    Tokens {
        len: usize,
    },
}

/// Pi0.5's prompt: `"Task: …, State: <bins>;\nAction: "` tokenized, the bins from the
/// normalized state of each step.
pub struct Pi05Processing {
    tokenizer: Option<PromptTokenizer>,
    state_stats: Option<FeatureStats>,
    prompt: Prompt,
    vocab: usize,
    inputs: PromptInputs,
    // Scratch sized at open so `stage` never allocates.
    bins: Vec<i32>,
    tokens: Vec<i32>,
    token_mask: Vec<bool>,
}

impl Processing for Pi05Processing {
    fn set_prompt(&mut self, text: &str) -> Result<()> {
        let tok = self
            .tokenizer
            .as_mut()
            .ok_or_else(|| Error::Tokenizer("no tokenizer loaded: pass tokenizer.json or use raw prompt tokens".into()))?;
        if is_blank_task(text) {
            return Err(Error::invalid("prompt", "the task text is empty or only whitespace; the previous prompt stays"));
        }
        tok.set_task(text)?;
        self.prompt = Prompt::Text;
        Ok(())
    }

    fn set_prompt_tokens(&mut self, ids: &[i32]) -> Result<()> {
        let len = raw_tokens(ids, self.vocab, &mut self.tokens, &mut self.token_mask)?;
        self.prompt = Prompt::Tokens { len };
        Ok(())
    }

    fn stage(&mut self, state: &[f32], backend: &mut dyn Backend) -> Result<usize> {
        let valid = match self.prompt {
            Prompt::None => return Err(Error::invalid("prompt", "no prompt set: call set_prompt or set_prompt_tokens first")),
            Prompt::Tokens { len } => len,
            Prompt::Text => {
                for (i, (bin, &x)) in self.bins.iter_mut().zip(state).enumerate() {
                    let x = self.state_stats.as_ref().map_or(x, |s| s.normalize(i, x));
                    *bin = discretize_state(x);
                }
                let tok = self.tokenizer.as_ref().expect("a text prompt implies a tokenizer");
                tok.assemble(&self.bins, &mut self.tokens, &mut self.token_mask)?
            }
        };
        backend.input_i32(self.inputs.tokens).copy_from_slice(&self.tokens);
        for (dst, &m) in backend.input_i32(self.inputs.token_mask).iter_mut().zip(&self.token_mask) {
            *dst = m as i32;
        }
        Ok(valid)
    }

    /// The plan unnormalizes the actions itself (folded into its last op).
    fn finish(&mut self, _state: &[f32], output: &[f32], actions: &mut [f32]) {
        actions.copy_from_slice(output);
    }

    fn set_embodiment(&mut self, tag: &str) -> Result<EmbodimentInfo> {
        Err(Error::invalid("embodiment", format!("{tag:?} given, but Pi0.5 has no embodiments (a GR00T setting)")))
    }
}
