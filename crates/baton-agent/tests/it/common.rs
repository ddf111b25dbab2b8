//! Tools, models and engines shared by the agent tests.

use std::sync::Arc;
use std::time::Duration;

use baton_agent::{
    ChatModel, Interaction, InteractionConfig, InteractionInput, InteractionOutput, Message,
    ModelError, ModelIdentity, Request, Response, Tool, ToolCall, ToolConfig, ToolContext,
};
use baton_run::store::Store;
use baton_run::{
    BoxFuture, Engine, EngineConfig, Program, Scope, StartId, StartRequest, TreeId, TreeView,
    Visibility,
};
use baton_workflow::{Config, Workflow, transform};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use tokio::sync::{Semaphore, mpsc};

/// The arguments of the `add` tool.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AddArgs {
    pub a: i64,
    pub b: i64,
}

/// A tool program adding two numbers.
pub fn add_program() -> Program<AddArgs, i64> {
    Workflow::new(Config {
        name: "test.add".into(),
        description: "Adds two numbers.".into(),
        build: "agent tests 1".into(),
        stages: vec![transform("add", |args: AddArgs| Ok(args.a + args.b))],
    })
    .expect("valid workflow")
    .program()
}

pub fn add_tool() -> Tool {
    Tool::new("add", "Adds a and b.", &add_program())
}

/// The arguments of the `echo` tool.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct EchoArgs {
    pub text: String,
}

/// A tool function answering with its text.
pub fn echo_tool() -> Tool {
    Tool::function(
        ToolConfig::new("echo", "Echoes text."),
        |args: EchoArgs, _context: ToolContext| async move { Ok(args.text) },
    )
    .expect("a valid tool")
}

pub fn call(id: &str, name: &str, arguments: &str) -> ToolCall {
    ToolCall {
        id: id.into(),
        name: name.into(),
        arguments: arguments.into(),
    }
}

/// An interaction over `model` with the `add` tool.
pub fn interaction(
    model: Arc<dyn ChatModel>,
    max_calls: u32,
) -> Program<InteractionInput, InteractionOutput> {
    interaction_with(model, max_calls, baton_agent::default_model_retry())
}

/// [`interaction`] with model calls tried again as `retry` says.
pub fn interaction_with(
    model: Arc<dyn ChatModel>,
    max_calls: u32,
    retry: baton_run::dispatch::RetryPolicy,
) -> Program<InteractionInput, InteractionOutput> {
    let mut config = InteractionConfig::new(
        "test.assistant",
        "Answers with the help of tools.",
        model,
        100,
        max_calls,
    );
    config.system = Some("You add numbers.".into());
    config.tools = vec![add_tool()];
    config.model_retry = retry;
    Interaction::new(config)
        .expect("valid interaction")
        .program()
}

pub fn engine<I, O>(store: Arc<dyn Store>, program: &Program<I, O>) -> Engine {
    Engine::new(EngineConfig {
        programs: vec![program.erase()],
        ..EngineConfig::new(store)
    })
    .expect("the engine configuration is valid")
}

pub fn scope() -> Scope {
    Scope::new("acme").expect("valid")
}

pub fn start<I>(key: &str, input: I) -> StartRequest<I> {
    StartRequest::new(StartId::new("acme", key).expect("valid"), input)
}

pub fn ask(text: &str) -> InteractionInput {
    InteractionInput::new(vec![Message::user(text)])
}

/// The last message of a request.
pub fn last(request: &Request) -> &Message {
    request.messages().last().expect("a request has messages")
}

pub async fn wait_for(engine: &Engine, tree: TreeId, done: impl Fn(&TreeView) -> bool) -> TreeView {
    for _ in 0..20_000 {
        let view = engine
            .inspect(&scope(), tree, Visibility::Public)
            .await
            .expect("inspects");
        if done(&view) {
            return view;
        }
        tokio::task::yield_now().await;
    }
    panic!("condition never held");
}

/// A model that reports each request and blocks until the test releases it.
pub struct GatedModel {
    entered: mpsc::UnboundedSender<Request>,
    release: Arc<Semaphore>,
    answer: Box<dyn Fn(&Request) -> Response + Send + Sync>,
}

impl GatedModel {
    pub fn new(
        answer: impl Fn(&Request) -> Response + Send + Sync + 'static,
    ) -> (GatedModel, mpsc::UnboundedReceiver<Request>, Arc<Semaphore>) {
        let (entered, requests) = mpsc::unbounded_channel();
        let release = Arc::new(Semaphore::new(0));
        (
            GatedModel {
                entered,
                release: release.clone(),
                answer: Box::new(answer),
            },
            requests,
            release,
        )
    }
}

impl ChatModel for GatedModel {
    fn identity(&self) -> ModelIdentity {
        ModelIdentity {
            provider: "test".into(),
            model: "gated".into(),
        }
    }

    fn call(&self, request: Request) -> BoxFuture<'_, Result<Response, ModelError>> {
        Box::pin(async move {
            let answer = (self.answer)(&request);
            let _ = self.entered.send(request);
            self.release
                .acquire()
                .await
                .map_err(|e| ModelError::Interrupted(e.to_string()))?
                .forget();
            Ok(answer)
        })
    }
}

/// Receives the next request a gated model saw, failing after a while.
pub async fn next_request(requests: &mut mpsc::UnboundedReceiver<Request>) -> Request {
    tokio::time::timeout(Duration::from_secs(10), requests.recv())
        .await
        .expect("the model is called in time")
        .expect("the model is alive")
}

/// The outputs of the tool results in a request's conversation, in order.
pub fn tool_results(request: &Request) -> Vec<String> {
    request
        .messages()
        .iter()
        .flat_map(|message| message.parts())
        .filter_map(|part| match part {
            baton_agent::Part::ToolResult { result } => Some(result.output.clone()),
            _ => None,
        })
        .collect()
}
