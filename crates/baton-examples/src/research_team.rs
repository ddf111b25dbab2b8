//! A research team whose work touches the world: a model coordinator hands
//! a question to a researcher agent, which searches an HTTP endpoint with a
//! `search` tool and writes its note to disk with a `write_note` tool, then
//! answers; the coordinator completes with the answer.
//!
//! Run it with `cargo run -p baton-examples --example research_team`.
//! Offline (the default) both models are [`ScriptedModel`]s and `search`
//! calls a small search endpoint the example serves on 127.0.0.1; it prints
//! the answer, the note written, the tool calls, and the tokens and cost
//! charged. With the conventional variables it runs on a real model:
//! `ANTHROPIC_MODEL` (with `ANTHROPIC_API_KEY`, optionally
//! `ANTHROPIC_BASE_URL`) selects the Anthropic provider, else
//! `OPENAI_MODEL` (with `OPENAI_API_KEY` and `OPENAI_BASE_URL`) an
//! OpenAI-compatible server. `RESEARCH_SEARCH_URL` points `search` at
//! another endpoint (it is sent `?q=<query>` and its answer's text goes to
//! the model) and `RESEARCH_NOTES_DIR` says where notes are written.
//!
//! The tools are the point of the example (see the guide
//! `docs/guides/tools-that-touch-the-world.md`): `search` is idempotent, so
//! it replays with the same identity after a crash and sends its idempotency
//! key along; `write_note` is not, so a call lost in a crash becomes an
//! unknown effect for a person to resolve, never a second write.

use std::error::Error;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use baton::agent::{
    Adapter, AdapterConfig, ChatModel, Interaction, InteractionConfig, InteractionInput,
    InteractionOutput, Message, ModelError, Part, Price, Response, ScriptedModel, Tool, ToolCall,
    ToolConfig, ToolContext, ToolError, Usage,
};
use baton::run::dispatch::ReplayPolicy;
use baton::run::dispatch::RetryHint;
use baton::run::program::Schema;
use baton::run::{
    Budget, ChildKey, Engine, EngineConfig, MemoryStore, Name, Payload, Program, Quota, StartId,
    StartRequest, Visibility,
};
use baton::team::{Binding, Config, Decision, Mode, TaskRequest, Turn};
use baton::workflow::TransformError;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// The question the team researches.
pub const QUESTION: &str = "How do durable agents avoid repeating side effects after a crash?";

/// The researcher worker's name.
pub const RESEARCHER: &str = "research.researcher";

/// The most text of a search answer handed to the model.
const MAX_RESULT_CHARS: usize = 4_000;

/// Which models answer.
#[derive(Clone)]
pub struct Models {
    /// The coordinator's.
    pub coordinator: Arc<dyn ChatModel>,
    /// The researcher's.
    pub researcher: Arc<dyn ChatModel>,
}

impl Models {
    /// The deterministic local models, priced so the run shows its cost.
    pub fn scripted() -> Models {
        let price = Price::per_million(2_500_000, 10_000_000);
        Models {
            coordinator: Arc::new(coordinator_model().with_price(price)),
            researcher: Arc::new(researcher_model().with_price(price)),
        }
    }

    /// A real provider chosen by the conventional variables, or the scripted
    /// models when none is configured: `ANTHROPIC_MODEL` selects Anthropic,
    /// else `OPENAI_MODEL` an OpenAI-compatible server.
    pub fn from_env() -> Result<Models, ModelError> {
        let set = |name: &str| std::env::var(name).is_ok_and(|v| !v.trim().is_empty());
        let model: Arc<dyn ChatModel> = if set("ANTHROPIC_MODEL") {
            use baton::agent::anthropic::{AnthropicConfig, AnthropicModel};
            Arc::new(AnthropicModel::new(AnthropicConfig::from_env()?)?)
        } else if set("OPENAI_MODEL") {
            use baton::agent::openai::{OpenAiConfig, OpenAiModel};
            Arc::new(OpenAiModel::new(OpenAiConfig::from_env()?)?)
        } else {
            return Ok(Models::scripted());
        };
        Ok(Models {
            coordinator: model.clone(),
            researcher: model,
        })
    }
}

/// The arguments of `search`.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SearchArgs {
    /// What to search for.
    pub query: String,
}

/// The arguments of `write_note`.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct NoteArgs {
    /// The file name (letters, digits, `.`, `_`, `-`; no directories).
    pub file: String,
    /// What to write.
    pub text: String,
}

/// `search`: an HTTP GET of `url?q=<query>`, whose answer's text (at most
/// 4000 characters) the model reads. A GET changes nothing, so the tool
/// replays with the same identity; the idempotency key goes along as a
/// header for endpoints that deduplicate.
pub fn search_tool(url: String) -> Result<Tool, Box<dyn Error>> {
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(20))
        .build()?;
    let mut config = ToolConfig::new("search", "Search the web; returns the results as text.");
    config.build = "research_team search 1".into();
    config.replay = ReplayPolicy::SameIdentity;
    config.timeout = Duration::from_secs(30);
    let tool = Tool::function(config, move |args: SearchArgs, context: ToolContext| {
        let request = client
            .get(url.clone())
            .query(&[("q", args.query)])
            .header("idempotency-key", context.idempotency_key().to_string());
        async move {
            let response = request.send().await.map_err(|error| {
                ToolError::coded("research.search.unreachable", error.to_string())
                    .with_retry(RetryHint::definite(None))
            })?;
            let status = response.status();
            let text = response.text().await.map_err(|error| {
                ToolError::coded("research.search.interrupted", error.to_string())
                    .with_retry(RetryHint::uncertain())
            })?;
            if !status.is_success() {
                return Err(ToolError::coded(
                    "research.search.failed",
                    format!("the search endpoint answered {status}"),
                ));
            }
            Ok(text.chars().take(MAX_RESULT_CHARS).collect::<String>())
        }
    })?;
    Ok(tool)
}

/// `write_note`: writes a file into `dir`. Writing is not idempotent, so
/// the tool never replays: a call lost in a crash is an unknown effect the
/// host resolves. Set `approval` to [`Approval::Required`] to have a
/// person approve each write.
///
/// [`Approval::Required`]: baton::workflow::Approval::Required
pub fn write_note_tool(dir: PathBuf) -> Result<Tool, Box<dyn Error>> {
    let mut config = ToolConfig::new("write_note", "Write a note file; returns what was written.");
    config.build = "research_team write_note 1".into();
    config.replay = ReplayPolicy::Never;
    let tool = Tool::function(config, move |args: NoteArgs, _context: ToolContext| {
        let dir = dir.clone();
        async move {
            let plain = !args.file.starts_with('.')
                && !args.file.is_empty()
                && args
                    .file
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'));
            if !plain {
                return Err(ToolError::coded(
                    "research.note.name_invalid",
                    format!("{:?} is not a plain file name", args.file),
                ));
            }
            let path = dir.join(&args.file);
            let bytes = args.text.len();
            tokio::task::spawn_blocking(move || {
                std::fs::create_dir_all(&dir)?;
                std::fs::write(&path, args.text)
            })
            .await
            .map_err(|error| ToolError::new(error.to_string()))?
            .map_err(|error| ToolError::coded("research.note.write_failed", error.to_string()))?;
            Ok(format!("wrote {bytes} bytes to {}", args.file))
        }
    })?;
    Ok(tool)
}

/// The researcher: an agent with `search` and `write_note`, as a
/// `Program<String, String>` from the question to its answer.
pub fn researcher(
    model: Arc<dyn ChatModel>,
    search_url: String,
    notes: PathBuf,
) -> Result<Adapter<String, String>, Box<dyn Error>> {
    let mut config = InteractionConfig::new(
        "research.researcher_model",
        "Research a question with the search and write_note tools.",
        model,
        1_024,
        6,
    );
    config.system = Some(
        "You research the question you are given. Call search once, then call write_note once \
         with file notes.md and a few lines of findings, then answer with a two-sentence summary."
            .into(),
    );
    config.tools = vec![search_tool(search_url)?, write_note_tool(notes)?];
    config.max_concurrent_tool_calls = 2;
    let interaction = Interaction::new(config)?;
    Ok(Adapter::new(AdapterConfig::<String, String> {
        name: RESEARCHER.into(),
        description: "Research a question and write a note.".into(),
        build: "research_team researcher 1".into(),
        interaction: interaction.program(),
        budget: budget(96, 100_000, 100_000)?,
        capabilities: Default::default(),
        build_input: Box::new(|question: &String| {
            Ok(InteractionInput::new(vec![Message::user(question.clone())]))
        }),
        decode_output: Box::new(|output: InteractionOutput| Ok(output.response.message().text())),
    })?)
}

/// The coordinator: a model asked for a decision of exactly this team's
/// shape (`baton::team::decision_schema`), so a strict provider can enforce
/// it; a validator turns an invalid answer into feedback and another call.
pub fn coordinator(
    model: Arc<dyn ChatModel>,
    workers: &[Binding],
) -> Result<Adapter<Turn, Decision>, Box<dyn Error>> {
    let mut config = InteractionConfig::new(
        "research.coordinator_model",
        "Choose the research team's next decision.",
        model,
        2_048,
        3,
    );
    config.system = Some(format!(
        "You coordinate a research team. You get a Turn as JSON and answer with one Decision. \
         On turn 1 start one task with key research on worker {RESEARCHER} whose input is the \
         question (the state), with mode wait. When that task is done, complete the team with its \
         output as the team's output."
    ));
    let schema =
        baton::team::decision_schema(&Schema::of::<String>(), &Schema::of::<String>(), workers);
    config.options.response_format =
        Some(baton::agent::output::format_for_schema("Decision", &schema));
    config.build = "research_team coordinator validator 1".into();
    config.validator = Some(Arc::new(|response: &Response| {
        baton::agent::output::decode::<Decision>(response)
            .map(|_| ())
            .map_err(|error| format!("{error}; answer with one valid Decision as JSON"))
    }));
    let interaction = Interaction::new(config)?;
    Ok(Adapter::new(AdapterConfig::<Turn, Decision> {
        name: "research.coordinator".into(),
        description: "Render a turn and decode the model's decision.".into(),
        build: "research_team coordinator 1".into(),
        interaction: interaction.program(),
        budget: budget(48, 40_000, 60_000)?,
        capabilities: Default::default(),
        build_input: Box::new(|turn: &Turn| {
            let rendered = Payload::encode(turn).map_err(|e| TransformError::new(e.to_string()))?;
            Ok(InteractionInput::new(vec![Message::user(
                rendered.as_str(),
            )]))
        }),
        decode_output: Box::new(|output: InteractionOutput| {
            baton::agent::output::decode::<Decision>(&output.response)
                .map_err(|e| TransformError::new(e.to_string()))
        }),
    })?)
}

/// A budget of `steps` steps, half as many effects, as many signals, and
/// token and cost limits.
fn budget(steps: u64, tokens: u64, cost_micros: u64) -> Result<Budget, Box<dyn Error>> {
    Ok(Budget::unlimited()
        .with_steps(steps)
        .with_effects(steps / 2)
        .with_signals(steps)
        .with_meter(Name::new(baton::agent::TOKENS)?, tokens)
        .with_meter(Name::new(baton::agent::COST_MICROS)?, cost_micros))
}

/// The team: the coordinator and the researcher, with finite budgets.
pub fn team(
    models: &Models,
    search_url: String,
    notes: PathBuf,
) -> Result<Program<String, String>, Box<dyn Error>> {
    let researcher = researcher(models.researcher.clone(), search_url, notes)?;
    let workers =
        vec![Binding::new(&researcher.program()).with_budget(budget(128, 100_000, 100_000)?)];
    let coordinator = coordinator(models.coordinator.clone(), &workers)?;
    Ok(baton::team::compile::<String, String>(Config {
        name: "research.team".into(),
        description: "Research a question with tools that touch the world.".into(),
        coordinator: Binding::new(&coordinator.program()).with_budget(budget(64, 40_000, 60_000)?),
        workers,
        max_turns: Quota::Finite(4),
        max_tasks: Quota::Finite(2),
        max_concurrent_tasks: 1,
        max_controls_per_turn: 1,
        stall_turns: baton::team::DEFAULT_STALL_TURNS,
    })?)
}

/// The scripted coordinator's decision for each turn.
pub fn decide(turn: &Turn) -> Result<Decision, String> {
    let state = turn.state.clone();
    match turn.task("research") {
        None => Ok(
            Decision::new(Mode::Wait, state.clone()).with_task(TaskRequest::new(
                ChildKey::new("research").map_err(|e| e.to_string())?,
                Name::new(RESEARCHER).map_err(|e| e.to_string())?,
                state,
            )),
        ),
        Some(task) => {
            let answer = match task.output() {
                Some(output) => output.clone(),
                None => Payload::encode(&format!("the research ended {:?}", task.status()))
                    .map_err(|e| e.to_string())?,
            };
            Ok(Decision::complete(state, answer))
        }
    }
}

/// The scripted coordinator: decides from the rendered Turn.
pub fn coordinator_model() -> ScriptedModel {
    ScriptedModel::new("research-coordinator", |request| {
        let text = request
            .messages()
            .last()
            .map(Message::text)
            .ok_or_else(|| ModelError::Malformed("expected one rendered turn".into()))?;
        let turn: Turn = Payload::parse_str(&text)
            .and_then(|payload| payload.decode())
            .map_err(|e| ModelError::Malformed(e.to_string()))?;
        let decision = decide(&turn).map_err(ModelError::Malformed)?;
        let json = Payload::encode(&decision).map_err(|e| ModelError::Malformed(e.to_string()))?;
        Ok(Response::text(json.as_str()).with_usage(usage(text.len())))
    })
}

/// The scripted researcher: searches, writes a note from the results, then
/// answers.
pub fn researcher_model() -> ScriptedModel {
    ScriptedModel::new("research-researcher", |request| {
        let results: Vec<&str> = request
            .messages()
            .iter()
            .flat_map(Message::parts)
            .filter_map(|part| match part {
                Part::ToolResult { result } => Some(result.output.as_str()),
                _ => None,
            })
            .collect();
        let question = request
            .messages()
            .iter()
            .find(|m| m.role() == baton::agent::Role::User)
            .map(Message::text)
            .unwrap_or_default();
        let call = |id: &str, name: &str, arguments: serde_json::Value| ToolCall {
            id: id.into(),
            name: name.into(),
            arguments: arguments.to_string(),
        };
        let response = match results.as_slice() {
            [] => Response::calls(vec![call(
                "call_search",
                "search",
                serde_json::json!({"query": question}),
            )]),
            [found] => Response::calls(vec![call(
                "call_note",
                "write_note",
                serde_json::json!({"file": "notes.md", "text": format!("# {question}\n\n{found}\n")}),
            )]),
            _ => Ok(Response::text(
                "Durable agents record every effect before acting and send an uncertain one \
                 again only when it is idempotent. The note is in notes.md.",
            )),
        }
        .map_err(|e| ModelError::Malformed(e.to_string()))?;
        Ok(response.with_usage(usage(results.iter().map(|r| r.len()).sum::<usize>() + 200)))
    })
}

/// A plausible usage for a scripted answer to a prompt of `chars` characters.
fn usage(chars: usize) -> Usage {
    Usage {
        input_tokens: (chars / 4) as u64 + 20,
        output_tokens: 40,
        ..Usage::default()
    }
}

/// Serves `GET /search?q=...` on 127.0.0.1 with a fixed JSON answer, for
/// offline runs; returns its URL.
pub async fn stub_search() -> std::io::Result<String> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}/search", listener.local_addr()?);
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut buffer = [0u8; 1024];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match stream.read(&mut buffer).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&buffer[..n]),
                    }
                }
                let body = serde_json::json!({"results": [
                    {"title": "Write-ahead logs", "snippet": "Record the intent before acting; replay the log after a crash."},
                    {"title": "Idempotency keys", "snippet": "Send a stable key so the other side can drop a repeated request."},
                ]})
                .to_string();
                let answer = format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = stream.write_all(answer.as_bytes()).await;
                let _ = stream.shutdown().await;
            });
        }
    });
    Ok(url)
}

/// Runs the team to the end on an in-memory engine with `models`, searching
/// `search_url` and writing notes into `notes`; returns the lines the
/// example prints.
pub async fn run_with(
    models: &Models,
    search_url: String,
    notes: PathBuf,
) -> Result<Vec<String>, Box<dyn Error>> {
    let team = team(models, search_url, notes.clone())?;
    let engine = Engine::new(EngineConfig {
        programs: vec![team.erase()],
        ..EngineConfig::new(Arc::new(MemoryStore::new()))
    })?;
    let mut request = StartRequest::new(StartId::new("example", "research")?, QUESTION.to_owned());
    request.budget = Budget::unlimited()
        .with_steps(512)
        .with_effects(256)
        .with_signals(512)
        .with_meter(Name::new(baton::agent::TOKENS)?, 300_000)
        .with_meter(Name::new(baton::agent::COST_MICROS)?, 400_000);
    let handle = engine.start(&team, request).await?;
    let answer = handle.output().await?;
    handle.join().await?;
    let view = engine
        .inspect(handle.scope(), handle.tree(), Visibility::Public)
        .await?;
    let calls = |program: &str| {
        view.processes
            .iter()
            .filter(|p| p.program.as_str() == program)
            .count()
    };
    let used = |meter: &str| -> Result<u64, Box<dyn Error>> {
        let meter = Name::new(meter)?;
        Ok(view
            .processes
            .iter()
            .filter_map(|p| p.usage.meters.get(&meter))
            .sum())
    };
    let note = notes.join("notes.md");
    let written = std::fs::metadata(&note).map(|m| m.len()).unwrap_or(0);
    Ok(vec![
        format!("question: {QUESTION}"),
        format!("answer: {answer}"),
        format!("note: {} ({written} bytes)", note.display()),
        format!(
            "tool calls: search {}, write_note {}",
            calls("tool.search"),
            calls("tool.write_note")
        ),
        format!(
            "charged: {} tokens in, {} out, {} cost micros",
            used(baton::agent::TOKENS_IN)?,
            used(baton::agent::TOKENS_OUT)?,
            used(baton::agent::COST_MICROS)?
        ),
    ])
}

/// Runs the example as its binary does: models and endpoints from the
/// environment, else offline.
pub async fn run() -> Result<Vec<String>, Box<dyn Error>> {
    let models = Models::from_env()?;
    let search_url = match std::env::var("RESEARCH_SEARCH_URL") {
        Ok(url) if !url.trim().is_empty() => url,
        _ => stub_search().await?,
    };
    let notes = match std::env::var("RESEARCH_NOTES_DIR") {
        Ok(dir) if !dir.trim().is_empty() => PathBuf::from(dir),
        _ => std::env::temp_dir().join("baton-research-notes"),
    };
    run_with(&models, search_url, notes).await
}
