//! The model-backed parts strategies share: `ModelConfig`, the typed
//! helper programs (a router's, a planner's, a merger's, a supervisor's
//! model) and chat agents built from a model.

use std::sync::Arc;

use baton_agent::output::{decode, format_for};
use baton_agent::{
    Adapter, AdapterConfig, ChatModel, Interaction, InteractionConfig, InteractionInput,
    InteractionOutput, Message, Options,
};
use baton_run::{Budget, Capabilities, Payload, Program};
use baton_workflow::TransformError;
use schemars::JsonSchema;
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::{Agent, ConfigError};

/// Which model a model-backed part calls, and what each call may spend.
#[derive(Clone)]
pub struct ModelConfig {
    /// The model.
    pub model: Arc<dyn ChatModel>,
    /// The most tokens one answer may take (each call reserves them from
    /// the `tokens` meter).
    pub max_tokens: u32,
    /// The budget each call's interaction is granted.
    pub budget: Budget,
}

impl ModelConfig {
    /// The model with 1024 tokens per answer and an unlimited budget.
    pub fn new(model: Arc<dyn ChatModel>) -> ModelConfig {
        ModelConfig {
            model,
            max_tokens: 1024,
            budget: Budget::unlimited(),
        }
    }
}

impl std::fmt::Debug for ModelConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ModelConfig")
            .field("model", &self.model.identity())
            .field("max_tokens", &self.max_tokens)
            .finish_non_exhaustive()
    }
}

/// The build identity of the helpers' render and decode code.
const HELPER_BUILD: &str = concat!("baton-strategy helper ", env!("CARGO_PKG_VERSION"));

/// A typed model call as a program: `I` is rendered as its JSON text in
/// one user message after `system`; the answer must be a JSON `O` (asked
/// for with `O`'s schema as a strict response format) and is decoded
/// strictly, never repaired. One model call per run.
pub(crate) struct Helper<'a> {
    /// The adapter's name; its interaction is `<name>.model`.
    pub name: String,
    pub description: &'a str,
    pub system: &'a str,
    pub model: &'a ModelConfig,
    pub temperature: Option<f64>,
}

impl Helper<'_> {
    pub fn program<I, O>(self) -> Result<Program<I, O>, ConfigError>
    where
        I: Serialize + DeserializeOwned + JsonSchema + 'static,
        O: Serialize + DeserializeOwned + JsonSchema + 'static,
    {
        let mut config = InteractionConfig::new(
            format!("{}.model", self.name),
            self.description,
            self.model.model.clone(),
            self.model.max_tokens,
            1,
        );
        config.build = HELPER_BUILD.into();
        config.system = Some(self.system.to_owned());
        config.options = Options {
            temperature: self.temperature,
            max_tokens: Some(self.model.max_tokens),
            response_format: Some(format_for::<O>()),
        };
        let interaction = Interaction::new(config)?;
        let adapter = Adapter::new(AdapterConfig::<I, O> {
            name: self.name,
            description: self.description.to_owned(),
            build: HELPER_BUILD.into(),
            interaction: interaction.program(),
            budget: self.model.budget.clone(),
            capabilities: Capabilities::none(),
            build_input: Box::new(|input: &I| {
                let text =
                    Payload::encode(input).map_err(|e| TransformError::new(e.to_string()))?;
                Ok(InteractionInput::new(vec![Message::user(text.as_str())]))
            }),
            decode_output: Box::new(|output: InteractionOutput| {
                decode::<O>(&output.response).map_err(|e| TransformError::new(e.to_string()))
            }),
        })?;
        Ok(adapter.program())
    }
}

/// A descriptor name segment made from an agent id: lowercase letters,
/// digits and `_`, starting with a letter.
pub(crate) fn name_segment(id: &str) -> String {
    let mut segment: String = id
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '_'
            }
        })
        .collect();
    if !segment.starts_with(|c: char| c.is_ascii_lowercase()) {
        segment.insert(0, 'a');
    }
    segment
}

impl Agent {
    /// A chat agent on `model`: an [`Interaction`] named
    /// `agent.<id as a name segment>` with `system` as its system prompt,
    /// at most 8 model calls and no tools. For tools, a validator or other
    /// limits, build the interaction yourself and use [`Agent::chat`].
    pub fn model(
        id: &str,
        description: &str,
        system: &str,
        model: &ModelConfig,
    ) -> Result<Agent, ConfigError> {
        let mut config = InteractionConfig::new(
            format!("agent.{}", name_segment(id)),
            description,
            model.model.clone(),
            model.max_tokens,
            8,
        );
        config.system = Some(system.to_owned());
        let interaction = Interaction::new(config)?;
        Ok(Agent::chat(id, &interaction.program())?
            .described(description)
            .with_budget(model.budget.clone()))
    }
}
