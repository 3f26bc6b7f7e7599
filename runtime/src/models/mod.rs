//! Model definitions: one file per model. Each derives its configuration from the checkpoint and
//! describes its forward pass once, as a [`crate::plan::Plan`].

pub mod pi05;
