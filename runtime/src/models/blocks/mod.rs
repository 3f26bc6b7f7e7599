//! Transformer blocks shared by the model files. Each appends one layer's ops to a plan, given the
//! layer's weights (already in the plan) and the activation buffers it works in; the model file
//! loads the weights (their names and load-time folding are the checkpoint's) and calls a block
//! per layer. A new model reuses these, or adds its own block here, instead of writing a layer out.

pub mod dit;
pub mod gemma;
pub mod qwen3_vl;
pub mod siglip;
