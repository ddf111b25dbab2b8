//! The adapter: any interaction as a typed program, as a three-stage
//! workflow render → call → decode.

use std::marker::PhantomData;
use std::sync::Arc;

use baton_run::{Budget, Capabilities, Program};
use baton_workflow::{Child, TransformError, Workflow, call, transform};
use schemars::JsonSchema;
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::interaction::{Input, Output};

type BuildInput<I> = dyn Fn(&I) -> Result<Input, TransformError> + Send + Sync;
type DecodeOutput<O> = dyn Fn(Output) -> Result<O, TransformError> + Send + Sync;

/// How to build an adapter.
pub struct AdapterConfig<I, O> {
    /// The adapter's descriptor name (lowercase dotted).
    pub name: String,
    /// What it does, for people.
    pub description: String,
    /// Identity of the code behind `build_input` and `decode_output`
    /// (change it when they change behaviour).
    pub build: String,
    /// The interaction it runs.
    pub interaction: Program<Input, Output>,
    /// The budget granted to each interaction child (the adapter's own
    /// budget must cover it).
    pub budget: Budget,
    /// Capabilities granted to each interaction child.
    pub capabilities: Capabilities,
    /// Renders the typed input as an interaction input (pure).
    pub build_input: Box<BuildInput<I>>,
    /// Decodes the interaction's output (pure); see [`crate::output::decode`]
    /// for strict typed JSON.
    pub decode_output: Box<DecodeOutput<O>>,
}

/// Why an adapter could not be built.
pub type AdapterError = baton_workflow::ConfigError;

/// An interaction wrapped as a `Program<I, O>`: a workflow whose stages are
/// `render` (a transform running `build_input`), `call` (the interaction as
/// a child) and `decode` (a transform running `decode_output`). A render or
/// decode error fails the adapter with `workflow.transform.failed`.
pub struct Adapter<I, O> {
    workflow: Workflow,
    types: PhantomData<fn(I) -> O>,
}

impl<I, O> std::fmt::Debug for Adapter<I, O> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Adapter")
            .field("workflow", &self.workflow)
            .finish()
    }
}

impl<I, O> Adapter<I, O>
where
    I: DeserializeOwned + JsonSchema + 'static,
    O: Serialize + JsonSchema + 'static,
{
    /// Builds the three-stage workflow.
    pub fn new(config: AdapterConfig<I, O>) -> Result<Adapter<I, O>, AdapterError> {
        let build_input: Arc<BuildInput<I>> = Arc::from(config.build_input);
        let decode_output: Arc<DecodeOutput<O>> = Arc::from(config.decode_output);
        let workflow = Workflow::new(baton_workflow::Config {
            name: config.name,
            description: config.description,
            build: format!("baton-agent adapter; {}", config.build),
            stages: vec![
                transform("render", move |input: I| build_input(&input)),
                call(
                    "call",
                    Child::new(&config.interaction)
                        .with_budget(config.budget)
                        .with_capabilities(config.capabilities),
                ),
                transform("decode", move |output: Output| decode_output(output)),
            ],
        })?;
        Ok(Adapter {
            workflow,
            types: PhantomData,
        })
    }

    /// The typed program.
    pub fn program(&self) -> Program<I, O> {
        self.workflow.program()
    }

    /// The workflow behind it (for conformance checks and inspection).
    pub fn workflow(&self) -> &Workflow {
        &self.workflow
    }
}
