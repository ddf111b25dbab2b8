//! The agent layer's integration tests, one binary: the interaction, tools,
//! the adapter, typed output, strict-mode schemas and (features `openai`
//! and `anthropic`) the providers against a loopback server.
#![allow(missing_docs)]

mod adapter;
#[cfg(feature = "anthropic")]
mod anthropic;
mod common;
mod interaction;
#[cfg(feature = "openai")]
mod openai;
mod stream;
mod strict;
mod tools;
#[cfg(any(feature = "openai", feature = "anthropic"))]
mod wire;
