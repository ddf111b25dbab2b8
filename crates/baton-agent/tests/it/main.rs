//! The agent layer's integration tests, one binary: the interaction, the
//! adapter, typed output and (feature `openai`) the OpenAI-compatible provider.
#![allow(missing_docs)]

mod adapter;
mod common;
mod interaction;
#[cfg(feature = "openai")]
mod openai;
