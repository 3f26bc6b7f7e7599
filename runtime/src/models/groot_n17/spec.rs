//! GR00T N1.7 as a policy sees it. [`open`] reads the sidecar files for the embodiment, the
//! tokenizer and the sizes, builds the plan and returns the [`ModelSpec`]; [`GrootProcessing`]
//! turns a task into the prompt's inputs (token ids, masks, M-RoPE positions, image slots),
//! normalizes each step's state and decodes the action chunk.

use std::path::{Path, PathBuf};

use crate::backend::Backend;
use crate::checkpoint::Checkpoint;
use crate::config::PolicyConfig;
use crate::error::{Error, Result};
use crate::models::{ConfigJson, EmbodimentInfo, ModelConfig, ModelInfo, ModelKind, ModelSpec, Processing};
use crate::qwen_image::{Filter, QwenImage};

use super::lerobot;
use super::model::{BuildOptions, Config, GrootJson, ModelInputs, build};
use super::positions::mrope_positions;
use super::prompt::{PromptTokenizer, language};
use super::sidecar::Sidecars;

/// Text tokens a prompt may hold by default (the task after formalizing).
const DEFAULT_TEXT_CAPACITY: usize = 64;
/// Tokens around the images and the text: `<|im_start|>user\n` and `<|im_end|>\n`.
const FIXED_TOKENS: usize = 5;

/// Where a checkpoint's model config, backbone, processing and tokenizer come from: a raw
/// (Hugging Face layout) checkpoint's own files, or a lerobot fine-tune's pipelines and base model.
pub struct Source {
    pub groot: GrootJson,
    /// The directory the backbone's `model_name` is resolved against.
    pub backbone_dir: PathBuf,
    /// Every embodiment the processing describes in full, and the one to open with.
    pub embodiments: Vec<Sidecars>,
    pub active: usize,
    /// The checkpoint's own denoise step count, over its model config's.
    pub denoise_steps: Option<usize>,
    /// The state and action widths the processing pads to, checked against the model's.
    pub widths: Option<(usize, usize)>,
    /// Where a tokenizer.json is looked for, in order, and how to supply one.
    pub tokenizers: Vec<PathBuf>,
    pub tokenizer_hint: String,
}

impl Source {
    fn raw(dir: &Path, json: &ConfigJson, embodiment: Option<&str>) -> Result<Source> {
        let (embodiments, active) = Sidecars::read_all(dir, embodiment)?;
        Ok(Source {
            groot: json.parse()?,
            backbone_dir: dir.to_path_buf(),
            embodiments,
            active,
            denoise_steps: None,
            widths: None,
            tokenizers: vec![dir.join("tokenizer.json")],
            tokenizer_hint: "put tokenizer.json beside the checkpoint or set PolicyConfig::tokenizer".into(),
        })
    }
}

pub fn open(ckpt: &Checkpoint, json: Option<&ConfigJson>, config: &PolicyConfig, progress: &dyn Fn(usize)) -> Result<ModelSpec> {
    let dir = ckpt.dir();
    let json = json.ok_or_else(|| Error::checkpoint(dir, "a GR00T N1.7 checkpoint needs its config.json"))?;
    if config.rtc.is_some_and(|r| r.schedule.guided()) {
        return Err(Error::invalid(
            "config.rtc.schedule",
            "GR00T N1.7's real-time chunking is lerobot's GR00T scheme (a frozen prefix with a velocity ramp, no guidance): \
             use the ramp schedule; zeros, ones, linear and exp are Pi0.5's guidance",
        ));
    }
    let embodiment = config.embodiment.as_deref();
    let source = if lerobot::is_fine_tune(json) { lerobot::read(dir, json, embodiment)? } else { Source::raw(dir, json, embodiment)? };
    let mut model_config = Config::from_checkpoint(ckpt, &source.groot, &source.backbone_dir)?;
    if let Some(n) = config.denoise_steps.or(source.denoise_steps) {
        model_config.denoise_steps = n;
    }
    if model_config.denoise_steps == 0 {
        return Err(Error::invalid("config.denoise_steps", "must be positive"));
    }
    if let Some((state, action)) = source.widths.filter(|&w| w != (model_config.state_width, model_config.action_width)) {
        return Err(Error::checkpoint(
            dir,
            format!(
                "the processing pads state / action to {state} / {action}, the model takes {} / {}",
                model_config.state_width, model_config.action_width
            ),
        ));
    }
    let sidecars = &source.embodiments[source.active];
    let tag = &sidecars.tag;
    let cameras: Vec<String> = sidecars.modality.video.modality_keys.clone();
    if cameras.is_empty() {
        return Err(Error::checkpoint(dir, format!("processor_config.json names no cameras (video modality_keys) for {tag:?}")));
    }
    if let Some(n) = config.cameras.filter(|&n| n != cameras.len()) {
        return Err(Error::invalid(
            "config.cameras",
            format!("{n} given; this GR00T checkpoint takes its {} cameras {cameras:?}", cameras.len()),
        ));
    }
    let state_dim = sidecars.state_dim();
    if let Some(asked) = config.state_dim.filter(|&d| d != state_dim) {
        return Err(Error::invalid(
            "config.state_dim",
            format!("{asked} differs from the checkpoint's {state_dim} (statistics.json state groups)"),
        ));
    }
    if state_dim > model_config.state_width || sidecars.action_dim() > model_config.action_width {
        return Err(Error::checkpoint(
            dir,
            format!(
                "state {state_dim} / action {} exceed the model's widths {} / {}",
                sidecars.action_dim(),
                model_config.state_width,
                model_config.action_width
            ),
        ));
    }
    let kw = &sidecars.kwargs;
    let target = kw.image_target_size.unwrap_or([256, 256]);
    if target[0] != target[1] {
        return Err(Error::checkpoint(dir, format!("image_target_size {target:?}: only square targets are supported")));
    }
    let edge = kw.shortest_image_edge.unwrap_or(target[0]);
    let filter = if kw.use_albumentations { Filter::Cv2Area } else { Filter::TorchBicubic };
    if filter == Filter::Cv2Area && edge != target[0] {
        // That path's last resize is to the shortest edge, not the target.
        return Err(Error::checkpoint(
            dir,
            format!("use_albumentations with shortest_image_edge {edge} makes {edge}² images, not the {}² target", target[0]),
        ));
    }
    let crop_fraction = kw.crop_fraction.or(kw.image_crop_size.map(|c| c[0] as f64 / target[0] as f64)).unwrap_or(1.0);
    let image = QwenImage { target: target[0], edge, crop_fraction, letterbox: kw.letter_box_transform, patch: model_config.patch, filter };
    let tokens_per_image = model_config.tokens_per_image(image.target);
    let text_capacity = config.prompt_len.unwrap_or(DEFAULT_TEXT_CAPACITY);
    let slots = FIXED_TOKENS + cameras.len() * (tokens_per_image + 2) + text_capacity;

    let tokenizer_path = match &config.tokenizer {
        Some(path) => Some(path.clone()),
        None => source.tokenizers.iter().find(|p| p.exists()).cloned(),
    };
    let missing_tokenizer = format!(
        "no tokenizer.json (looked at {}); {}",
        source.tokenizers.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", "),
        source.tokenizer_hint
    );
    let tokenizer = match tokenizer_path {
        Some(path) => {
            let tokenizer = PromptTokenizer::from_file(&path)?;
            crate::models::check_ids_fit_embedding(&path, tokenizer.vocab_size, &model_config.embedding(), model_config.vocab)?;
            Some(tokenizer)
        }
        None => {
            log::warn!("{missing_tokenizer}: only raw token prompts (set_prompt_tokens) are accepted");
            None
        }
    };
    // The embodiments a step may switch to: those with as many cameras (the plan's image slots)
    // and within the model's widths — and, under real-time chunking, with the opened one's chunk
    // (the plan copies that many rows and columns of the previous chunk). Their weights stay
    // resident, one table entry per slot.
    let chunk_of = |e: &Sidecars| (e.action_steps.min(model_config.horizon), e.action_dim());
    let (rtc_rows, rtc_cols) = chunk_of(&source.embodiments[source.active]);
    let (mut switchable, mut excluded) = (Vec::new(), Vec::new());
    for (i, e) in source.embodiments.into_iter().enumerate() {
        let why = if e.modality.video.modality_keys.len() != cameras.len() {
            Some(format!("it has {} cameras, the policy was opened with {}", e.modality.video.modality_keys.len(), cameras.len()))
        } else if e.state_dim() > model_config.state_width || e.action_dim() > model_config.action_width {
            Some(format!("its state {} / action {} exceed the model's widths", e.state_dim(), e.action_dim()))
        } else if config.rtc.is_some() && chunk_of(&e) != (rtc_rows, rtc_cols) {
            let (rows, cols) = chunk_of(&e);
            Some(format!(
                "real-time chunking is on, and its chunk ({rows} x {cols}) is not the opened embodiment's ({rtc_rows} x {rtc_cols})"
            ))
        } else {
            None
        };
        match why {
            Some(why) => excluded.push((e.tag, why)),
            None => switchable.push((i == source.active, e)),
        }
    }
    let active = switchable.iter().position(|(opened, _)| *opened).expect("the opened embodiment was checked above");
    let mut embodiment_slots: Vec<usize> = Vec::new();
    let embodiments: Vec<Embodiment> = switchable
        .into_iter()
        .map(|(_, sidecars)| {
            let entry = embodiment_slots.iter().position(|&s| s == sidecars.slot).unwrap_or_else(|| {
                embodiment_slots.push(sidecars.slot);
                embodiment_slots.len() - 1
            });
            Embodiment { sidecars, entry }
        })
        .collect();
    let opts = BuildOptions {
        cameras: cameras.len(),
        max_frame_width: config.max_frame_width,
        max_frame_height: config.max_frame_height,
        slots,
        image,
        embodiment_slots,
        rtc: config.rtc,
        chunk_rows: rtc_rows,
        robot_action_dim: rtc_cols,
    };
    let built = build(ckpt, &model_config, &opts, progress)?;
    let grid = image.target / image.patch;
    let formalize = embodiments[active].sidecars.kwargs.formalize_language;
    let processing = GrootProcessing {
        tokenizer,
        missing_tokenizer,
        vocab: model_config.vocab,
        formalize,
        images: cameras.len(),
        tokens_per_image,
        grid: (grid / 2, grid / 2),
        prompt: None,
        inputs: built.inputs,
        vision_positions: vision_positions(cameras.len(), grid),
        normalized_state: vec![0.0; model_config.state_width],
        slots,
        action_width: model_config.action_width,
        horizon: model_config.horizon,
        embodiments,
        active,
        excluded,
    };
    let embodiment = processing.embodiment();
    let info = ModelInfo {
        kind: ModelKind::GrootN17,
        cameras: embodiment.cameras,
        state_dim: embodiment.state_dim,
        horizon: embodiment.horizon,
        action_dim: embodiment.action_dim,
        embodiment: Some(embodiment.tag),
        embodiments: processing.embodiments.iter().map(|e| e.sidecars.tag.clone()).collect(),
        denoise_steps: model_config.denoise_steps,
        prompt_capacity: slots,
        parameters: model_config.parameter_count(),
        config: ModelConfig::GrootN17(model_config),
    };
    Ok(ModelSpec { plan: built.plan, weights: built.weights, io: built.io, processing: Box::new(processing), info })
}

/// Every patch's (row, column) in merge order, per camera: `[2, cameras · grid²]`.
fn vision_positions(cameras: usize, grid: usize) -> Vec<i32> {
    let mut rows = Vec::new();
    let mut cols = Vec::new();
    for _ in 0..cameras {
        for br in 0..grid / 2 {
            for bc in 0..grid / 2 {
                for (sr, sc) in [(0, 0), (0, 1), (1, 0), (1, 1)] {
                    rows.push((2 * br + sr) as i32);
                    cols.push((2 * bc + sc) as i32);
                }
            }
        }
    }
    rows.extend(cols);
    rows
}

/// One prompt's inputs, made when it is set (it does not change per step).
struct PromptInputs {
    tokens: Vec<i32>,
    valid: Vec<f32>,
    text_valid: Vec<f32>,
    image_valid: Vec<f32>,
    mrope: Vec<i32>,
    image_slots: Vec<i32>,
    len: usize,
}

pub struct GrootProcessing {
    tokenizer: Option<PromptTokenizer>,
    /// Where the tokenizer was looked for and how to supply one, for the error without it.
    missing_tokenizer: String,
    vocab: usize,
    formalize: bool,
    images: usize,
    tokens_per_image: usize,
    /// The merged grid of one image (rows, cols).
    grid: (usize, usize),
    prompt: Option<PromptInputs>,
    inputs: ModelInputs,
    vision_positions: Vec<i32>,
    normalized_state: Vec<f32>,
    slots: usize,
    action_width: usize,
    /// The model's action rows (a chunk keeps at most this many).
    horizon: usize,
    /// The embodiments a step may switch to, and the one it uses.
    embodiments: Vec<Embodiment>,
    active: usize,
    /// The checkpoint's other embodiments, with why a step cannot switch to them.
    excluded: Vec<(String, String)>,
}

/// An embodiment a policy can switch to: its processing and its entry in the plan's tables of
/// embodiment-specific weights (embodiments that share a checkpoint slot share the entry).
struct Embodiment {
    sidecars: Sidecars,
    entry: usize,
}

impl GrootProcessing {
    fn sidecars(&self) -> &Sidecars {
        &self.embodiments[self.active].sidecars
    }

    /// What the caller sees of the active embodiment.
    fn embodiment(&self) -> EmbodimentInfo {
        let s = self.sidecars();
        EmbodimentInfo {
            tag: s.tag.clone(),
            cameras: s.modality.video.modality_keys.clone(),
            state_dim: s.state_dim(),
            action_dim: s.action_dim(),
            horizon: s.action_steps.min(self.horizon),
        }
    }

    /// The prompt inputs of `ids`, whose image-pad runs are the images.
    fn prompt_inputs(&self, ids: Vec<i32>, image_pad: i32) -> Result<PromptInputs> {
        if ids.len() > self.slots {
            return Err(Error::invalid(
                "prompt",
                format!("{} tokens exceed the prompt capacity {} (PolicyConfig::prompt_len sets the text part)", ids.len(), self.slots),
            ));
        }
        let grids = vec![self.grid; self.images];
        let [t, h, w] = mrope_positions(&ids, image_pad, &grids)?;
        let len = ids.len();
        let is_image: Vec<bool> = ids.iter().map(|&id| id == image_pad).collect();
        let pad = |v: Vec<f32>| -> Vec<f32> { v.into_iter().chain(std::iter::repeat(0.0)).take(self.slots).collect() };
        let mut mrope = vec![0; 3 * self.slots];
        for (axis, row) in [t, h, w].iter().enumerate() {
            mrope[axis * self.slots..][..len].copy_from_slice(row);
        }
        Ok(PromptInputs {
            valid: pad(vec![1.0; len]),
            text_valid: pad(is_image.iter().map(|&i| if i { 0.0 } else { 1.0 }).collect()),
            image_valid: pad(is_image.iter().map(|&i| if i { 1.0 } else { 0.0 }).collect()),
            image_slots: is_image.iter().enumerate().filter(|(_, i)| **i).map(|(k, _)| k as i32).collect(),
            tokens: ids.into_iter().chain(std::iter::repeat(0)).take(self.slots).collect(),
            mrope,
            len,
        })
    }
}

impl Processing for GrootProcessing {
    fn set_prompt(&mut self, text: &str) -> Result<()> {
        let tok =
            self.tokenizer.as_ref().ok_or_else(|| Error::Tokenizer(format!("{}; or use raw prompt tokens", self.missing_tokenizer)))?;
        if text.trim().is_empty() {
            return Err(Error::invalid("prompt", "the task text is empty or only whitespace; the previous prompt stays"));
        }
        let ids = tok.encode(&language(text, self.formalize), self.images, self.tokens_per_image)?;
        self.prompt = Some(self.prompt_inputs(ids, tok.image_pad)?);
        Ok(())
    }

    /// The whole chat turn as ids, the image pads included (one run of the image's tokens each).
    fn set_prompt_tokens(&mut self, ids: &[i32]) -> Result<()> {
        let image_pad = self.tokenizer.as_ref().map(|t| t.image_pad).ok_or_else(|| {
            Error::Tokenizer(format!("raw GR00T prompts need the tokenizer's <|image_pad|> id: {}", self.missing_tokenizer))
        })?;
        if let Some((i, id)) = ids.iter().enumerate().find(|(_, id)| !usize::try_from(**id).is_ok_and(|id| id < self.vocab)) {
            return Err(Error::invalid(
                format!("prompt_tokens[{i}]"),
                format!("token id {id} is outside the vocabulary 0..{}", self.vocab),
            ));
        }
        self.prompt = Some(self.prompt_inputs(ids.to_vec(), image_pad)?);
        Ok(())
    }

    fn stage(&mut self, state: &[f32], backend: &mut dyn Backend) -> Result<usize> {
        let p =
            self.prompt.as_ref().ok_or_else(|| Error::invalid("prompt", "no prompt set: call set_prompt or set_prompt_tokens first"))?;
        let i = &self.inputs;
        backend.input_i32(i.tokens).copy_from_slice(&p.tokens);
        backend.input_f32(i.valid).copy_from_slice(&p.valid);
        backend.input_f32(i.text_valid).copy_from_slice(&p.text_valid);
        backend.input_f32(i.image_valid).copy_from_slice(&p.image_valid);
        backend.input_i32(i.mrope).copy_from_slice(&p.mrope);
        backend.input_i32(i.image_slots).copy_from_slice(&p.image_slots);
        backend.input_i32(i.vision_positions).copy_from_slice(&self.vision_positions);
        backend.input_i32(i.embodiment)[0] = self.embodiments[self.active].entry as i32;
        self.embodiments[self.active].sidecars.normalize_state(state, &mut self.normalized_state);
        backend.input_f32(i.state).copy_from_slice(&self.normalized_state);
        Ok(p.len)
    }

    fn finish(&mut self, state: &[f32], output: &[f32], actions: &mut [f32]) {
        self.sidecars().decode_actions(output, self.action_width, state, actions);
    }

    fn set_embodiment(&mut self, tag: &str) -> Result<EmbodimentInfo> {
        if let Some(i) = self.embodiments.iter().position(|e| e.sidecars.tag == tag) {
            self.active = i;
            return Ok(self.embodiment());
        }
        let known: Vec<&str> = self.embodiments.iter().map(|e| e.sidecars.tag.as_str()).collect();
        let why = match self.excluded.iter().find(|(t, _)| t == tag) {
            Some((_, why)) => format!("embodiment {tag:?} cannot be switched to: {why} (open the policy with it instead)"),
            None => format!("unknown embodiment tag {tag:?}"),
        };
        Err(Error::invalid("embodiment", format!("{why}; this policy switches between {}", known.join(", "))))
    }
}
