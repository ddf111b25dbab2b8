//! Agents, models, engines and crash helpers shared by the strategy tests.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use baton_agent::{ModelCall, ModelError, Request, Response, Role, ScriptedModel};
use baton_run::dispatch::{DispatchCall, Dispatcher, ReplayPolicy};
use baton_run::log::RecordKind;
use baton_run::program::{
    Definition, Descriptor, Effect, Execution, ExecutionState, ProgramConfig, Schema, Signal,
    SignalBody, StepError, Transition, configuration_digest, implementation_digest,
};
use baton_run::store::Store;
use baton_run::{
    BoxFuture, ChildKey, Engine, EngineConfig, Event, EventKind, Failure, MemoryStore, Payload,
    ProcessHandle, Program, RecoverOptions, Scope, Settlement, StartId, StartRequest, Status,
    Termination, TreeId, TreeView, Visibility,
};
use baton_strategy::{Agent, BoardMessage, ModelConfig, Post, Posted, Work};
use baton_testkit::{ConformanceCase, Cut, FaultStore};
use serde::{Deserialize, Serialize};

pub const SCOPE: &str = "acme";

pub fn scope() -> Scope {
    Scope::new(SCOPE).expect("valid")
}

pub fn request(key: &str, work: Work) -> StartRequest<Work> {
    StartRequest::new(StartId::new(SCOPE, key).expect("valid"), work)
}

pub fn work(task: &str) -> Work {
    Work::new(task).expect("encodes")
}

pub fn payload<T: Serialize>(value: &T) -> Payload {
    Payload::encode(value).expect("encodes")
}

pub fn engine(store: Arc<dyn Store>, programs: &[Program]) -> Engine {
    Engine::new(EngineConfig {
        programs: programs.to_vec(),
        ..EngineConfig::new(store)
    })
    .expect("the engine configuration is valid")
}

/// How a test model answers.
pub type Answer = Arc<dyn Fn(&Request) -> Result<Response, ModelError> + Send + Sync>;

/// The models of one run: a scripted model per name, all answering with
/// one deterministic function, each counting its calls.
#[derive(Clone)]
pub struct Models {
    answer: Answer,
    models: Arc<Mutex<BTreeMap<String, ScriptedModel>>>,
}

impl Models {
    pub fn new(
        answer: impl Fn(&Request) -> Result<Response, ModelError> + Send + Sync + 'static,
    ) -> Models {
        Models {
            answer: Arc::new(answer),
            models: Arc::default(),
        }
    }

    /// The model `name` (made on first use).
    pub fn config(&self, name: &str) -> ModelConfig {
        let mut models = self.models.lock().expect("not poisoned");
        let model = models
            .entry(name.to_owned())
            .or_insert_with(|| {
                let answer = self.answer.clone();
                ScriptedModel::new(name, move |request| answer(request))
            })
            .clone();
        ModelConfig::new(Arc::new(model))
    }

    /// Calls per model.
    pub fn calls(&self) -> BTreeMap<String, usize> {
        self.models
            .lock()
            .expect("not poisoned")
            .iter()
            .map(|(name, model)| (name.clone(), model.calls()))
            .collect()
    }

    pub fn total(&self) -> usize {
        self.calls().values().sum()
    }

    /// Every request each model received, as JSON text, in order.
    pub fn requests_by_model(&self) -> BTreeMap<String, Vec<String>> {
        self.models
            .lock()
            .expect("not poisoned")
            .iter()
            .map(|(name, model)| {
                let requests = model
                    .requests()
                    .iter()
                    .map(|request| payload(request).as_str().to_owned())
                    .collect();
                (name.clone(), requests)
            })
            .collect()
    }

    /// Every request any model received, as JSON text.
    pub fn requests(&self) -> Vec<String> {
        self.models
            .lock()
            .expect("not poisoned")
            .values()
            .flat_map(|model| model.requests())
            .map(|request| payload(&request).as_str().to_owned())
            .collect()
    }

    /// What the models would answer, without calling one.
    pub fn answer(&self, request: &Request) -> Response {
        (self.answer)(request).expect("a scripted answer")
    }
}

/// The system prompt of a request.
pub fn system(request: &Request) -> String {
    request
        .messages()
        .first()
        .filter(|m| m.role() == Role::System)
        .map(|m| m.text())
        .unwrap_or_default()
}

/// The last user message of a request.
pub fn last_user(request: &Request) -> String {
    request
        .messages()
        .iter()
        .rev()
        .find(|m| m.role() == Role::User)
        .map(|m| m.text())
        .unwrap_or_default()
}

/// The echo answer of chat agents made by [`echo_agent`]: `<id> did <the
/// last user message>`, reading the id from the system prompt `You are <id>.`.
pub fn echo(request: &Request) -> Option<Response> {
    let system = system(request);
    let id = system.strip_prefix("You are ")?.strip_suffix('.')?;
    Some(Response::text(format!("{id} did {}", last_user(request))))
}

/// A chat agent on the model named after it, answering with [`echo`].
pub fn echo_agent(models: &Models, id: &str) -> Agent {
    Agent::model(
        id,
        &format!("The {id} agent."),
        &format!("You are {id}."),
        &models.config(id),
    )
    .expect("a valid agent")
}

/// What a test program agent does.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Behaviour {
    /// Completes at once with `<id> saw <input>`.
    Echo,
    /// Fails at once with external `test.agent.failed`.
    Fail,
    /// Opens an external wait that nobody answers.
    Hang,
    /// Completes at once with a `Posted`.
    Post(Vec<Post>),
    /// Waits at its gate, then completes with the board messages it
    /// received.
    Listen,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
struct AgentState {
    input: Payload,
    step: u32,
    #[serde(default)]
    received: Vec<BoardMessage>,
}

struct TestAgent {
    id: String,
    behaviour: Behaviour,
    descriptor: Descriptor,
}

struct TestRun {
    id: String,
    behaviour: Behaviour,
    state: AgentState,
}

impl Definition for TestAgent {
    fn descriptor(&self) -> &Descriptor {
        &self.descriptor
    }

    fn start(&self, input: &Payload) -> Result<Box<dyn Execution>, StepError> {
        Ok(Box::new(TestRun {
            id: self.id.clone(),
            behaviour: self.behaviour.clone(),
            state: AgentState {
                input: input.clone(),
                step: 0,
                received: Vec::new(),
            },
        }))
    }

    fn restore(&self, state: &ExecutionState) -> Result<Box<dyn Execution>, StepError> {
        Ok(Box::new(TestRun {
            id: self.id.clone(),
            behaviour: self.behaviour.clone(),
            state: state.decode()?,
        }))
    }
}

impl Execution for TestRun {
    fn step(&mut self, window: &[Signal]) -> Result<Transition, StepError> {
        let consumed = window.len();
        let step = self.state.step;
        self.state.step += 1;
        match &self.behaviour {
            Behaviour::Echo => Ok(Transition::Complete {
                consumed,
                output: Payload::encode(&format!("{} saw {}", self.id, self.state.input.as_str()))?,
            }),
            Behaviour::Fail => Err(StepError(Failure::external(
                "test.agent.failed",
                format!("agent {} failed on purpose", self.id),
            ))),
            Behaviour::Post(posts) => Ok(Transition::Complete {
                consumed,
                output: Payload::encode(&Posted {
                    output: Payload::encode(&format!("{} posted", self.id))?,
                    posts: posts.clone(),
                })?,
            }),
            Behaviour::Hang if step == 0 => Ok(Transition::Continue {
                consumed,
                effects: vec![Effect::Wait {
                    key: ChildKey::new("never").expect("valid"),
                    request: Payload::null(),
                    answer_schema: Schema::any(),
                }],
            }),
            Behaviour::Hang => {
                let wait = window
                    .iter()
                    .find_map(|signal| match &signal.body {
                        SignalBody::WaitOpened { wait, .. } => Some(*wait),
                        _ => None,
                    })
                    .ok_or_else(|| StepError::other("woken without a wait"))?;
                Ok(Transition::Wait { consumed, wait })
            }
            Behaviour::Listen => {
                let mut gate_opened = false;
                for signal in window {
                    match &signal.body {
                        SignalBody::Input { payload } => {
                            self.state.received.push(payload.decode()?);
                        }
                        SignalBody::Settled { .. } => gate_opened = true,
                        _ => {}
                    }
                }
                if step == 0 {
                    return Ok(Transition::Continue {
                        consumed,
                        effects: vec![Effect::dispatch(Payload::null())],
                    });
                }
                if !gate_opened {
                    return Err(StepError::other("a listener woke without its gate"));
                }
                Ok(Transition::Complete {
                    consumed,
                    output: Payload::encode(&self.state.received)?,
                })
            }
        }
    }

    fn snapshot(&self) -> Result<ExecutionState, StepError> {
        ExecutionState::encode(&self.state)
    }
}

/// A dispatcher that settles once its gate is open (and re-sends after a
/// crash: its requests have no side effect).
pub struct Gate(tokio::sync::watch::Receiver<bool>);

impl Dispatcher for Gate {
    fn replay_policy(&self, _: &Payload) -> ReplayPolicy {
        ReplayPolicy::SameIdentity
    }

    fn dispatch(&self, _: DispatchCall) -> BoxFuture<'static, Settlement> {
        let mut open = self.0.clone();
        Box::pin(async move {
            let _ = open.wait_for(|open| *open).await;
            Settlement::ok(Payload::null())
        })
    }
}

/// A test program agent `id` whose program is `test.<id>`.
pub fn program_agent(id: &str, behaviour: Behaviour, gate: Option<&Gate>) -> Agent {
    let mut descriptor = Descriptor::new(
        &format!("test.{id}"),
        format!("The {id} test agent."),
        Schema::any(),
        Schema::any(),
    )
    .expect("valid");
    if behaviour == Behaviour::Listen {
        descriptor = descriptor.with_signal_schema(Schema::of::<BoardMessage>());
    }
    let program: Program = Program::new(ProgramConfig {
        definition: Arc::new(TestAgent {
            id: id.to_owned(),
            behaviour: behaviour.clone(),
            descriptor,
        }),
        dispatcher: gate.map(|gate| Arc::new(Gate(gate.0.clone())) as Arc<dyn Dispatcher>),
        implementation: implementation_digest("baton-strategy-tests", "1"),
        configuration: configuration_digest(&(id, &behaviour)).expect("encodes"),
    });
    let agent = Agent::program(id, &program).expect("a valid agent");
    if matches!(behaviour, Behaviour::Post(_)) {
        agent.posting()
    } else {
        agent
    }
}

/// A gate and the sender that opens it.
pub fn gate() -> (Gate, tokio::sync::watch::Sender<bool>) {
    let (open, gate) = tokio::sync::watch::channel(false);
    (Gate(gate), open)
}

/// Runs a program to its end on a fresh memory store; returns the handle
/// (joined) and its engine.
pub async fn run<O>(
    program: &Program<Work, O>,
    key: &str,
    work: Work,
) -> (Engine, ProcessHandle<O>, Termination) {
    let engine = engine(Arc::new(MemoryStore::new()), &[program.erase()]);
    let handle = engine
        .start(program, request(key, work))
        .await
        .expect("starts")
        .into_handle();
    let ended = handle.join().await.expect("joins");
    (engine, handle, ended)
}

/// The failure a run ended with.
pub fn failure_of(ended: &Termination) -> &Failure {
    assert_eq!(ended.status(), Status::Failed, "{ended:?}");
    ended.failure().expect("a failed run has a failure")
}

/// How many processes of each program a finished tree holds.
pub fn processes(view: &TreeView) -> BTreeMap<String, usize> {
    let mut counts = BTreeMap::new();
    for process in &view.processes {
        *counts.entry(process.program.to_string()).or_default() += 1;
    }
    counts
}

/// Every `Turn` the root team's coordinator was given, in order, read from
/// the tree's capture: the coordinator's recorded state is its turn.
pub async fn recorded_turns(engine: &Engine, tree: TreeId) -> Vec<Payload> {
    let capture = engine.capture(&scope(), tree).await.expect("captures");
    let state = capture.state.to_value();
    let root = state["root"].as_str().expect("a root").to_owned();
    turns_where(&state, |process| {
        process["parent"].as_str() == Some(root.as_str())
    })
}

/// Every `Turn` the coordinator program `name` was given anywhere in the
/// tree (nested teams included), ordered by team and turn.
pub async fn turns_of(engine: &Engine, tree: TreeId, name: &str) -> Vec<Payload> {
    let capture = engine.capture(&scope(), tree).await.expect("captures");
    let state = capture.state.to_value();
    turns_where(&state, |process| {
        process["program"]["name"].as_str() == Some(name)
    })
}

fn turns_where(
    state: &serde_json::Value,
    keep: impl Fn(&serde_json::Value) -> bool,
) -> Vec<Payload> {
    let mut turns: Vec<(String, u64, Payload)> = state["processes"]
        .as_object()
        .expect("processes")
        .values()
        .filter(|process| keep(process))
        .filter_map(|process| {
            let number = process["key"]
                .as_str()?
                .strip_prefix("team.turn.")?
                .parse()
                .ok()?;
            let parent = process["parent"].as_str()?.to_owned();
            Some((parent, number, Payload::from_value(&process["state"]).ok()?))
        })
        .collect();
    turns.sort_by(|a, b| (&a.0, a.1).cmp(&(&b.0, b.1)));
    turns.into_iter().map(|(_, _, turn)| turn).collect()
}

/// Conformance cases of a coordinator: each recorded turn, stepped once.
pub fn turn_cases(turns: &[Payload]) -> Vec<ConformanceCase> {
    turns
        .iter()
        .enumerate()
        .map(|(index, turn)| {
            ConformanceCase::new(format!("turn {}", index + 1), turn.clone(), vec![vec![]])
        })
        .collect()
}

/// Resolves every unknown model call of a tree with what the models would
/// have answered (as a host that recorded the answer does); returns how
/// many it resolved.
pub async fn resolve_unknowns(engine: &Engine, tree: TreeId, models: &Models) -> usize {
    let view = engine
        .inspect(&scope(), tree, Visibility::Private)
        .await
        .expect("inspects");
    let mut resolved = 0;
    for process in &view.processes {
        for effect in &process.unknown_effects {
            let request = process
                .effects
                .iter()
                .find(|e| e.id == *effect)
                .and_then(|e| e.request.clone())
                .expect("an unknown effect shows its request");
            let call: ModelCall = request.decode().expect("a model call");
            let response = models.answer(&call.request);
            engine
                .resolve_unknown(&scope(), tree, *effect, Settlement::ok(payload(&response)))
                .await
                .expect("resolves");
            resolved += 1;
        }
    }
    resolved
}

/// Waits for a recovered tree to end, resolving unknown model calls as
/// they surface.
pub async fn finish<O>(
    engine: &Engine,
    events: &mut baton_run::Events,
    handle: &ProcessHandle<O>,
    models: &Models,
) -> (Termination, usize) {
    // Effects found pending on recovery settle unknown before the first
    // look; later ones announce themselves with an event.
    let mut resolved = resolve_unknowns(engine, handle.tree(), models).await;
    loop {
        tokio::select! {
            ended = handle.join() => return (ended.expect("the recovered tree ends"), resolved),
            event = events.recv() => {
                let unknown = matches!(
                    event,
                    Ok(Event { kind: EventKind::EffectSettled { unknown: true, .. }, .. })
                        | Err(baton_run::EventsError::Lagged(_))
                );
                if unknown {
                    resolved += resolve_unknowns(engine, handle.tree(), models).await;
                }
            }
        }
    }
}

/// A crash at the `nth` commit holding a `kind` record, cut `cut`.
pub struct Crash {
    pub kind: RecordKind,
    pub cut: Cut,
    pub nth: usize,
}

/// What a crashed and resumed run came to.
pub struct Resumed {
    /// Whether the crash happened before the run ended.
    pub crashed: bool,
    pub ended: Termination,
    pub view: TreeView,
    /// Unknown model calls the host resolved.
    pub resolved: usize,
}

/// Runs `program` on a store that crashes as `crash` says, then recovers
/// it on a new engine (resolving unknown model calls as a host would) and
/// runs it to its end.
pub async fn crash_and_resume<O>(
    program: &Program<Work, O>,
    key: &str,
    work: Work,
    crash: &Crash,
    models: &Models,
) -> Resumed {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let fault = FaultStore::new(store);
    fault.arm(crash.kind, crash.cut, crash.nth);
    let first = engine(Arc::new(fault.clone()), &[program.erase()]);
    let handle = first
        .start(program, request(key, work))
        .await
        .expect("starts")
        .into_handle();
    let tree = handle.tree();
    let before = handle.join().await;
    if !fault.crashed() {
        let ended = before.expect("an uncrashed run ends");
        let view = handle.inspect().await.expect("inspects");
        return Resumed {
            crashed: false,
            ended,
            view,
            resolved: 0,
        };
    }
    drop(handle);
    drop(first);
    let second = engine(fault.inner(), &[program.erase()]);
    let mut events = second.events();
    let report = second
        .recover(RecoverOptions::default())
        .await
        .expect("recovers");
    for (recovered, result) in &report {
        assert!(
            result.is_ok(),
            "tree {recovered} did not recover: {result:?}"
        );
    }
    let handle = second
        .process::<O>(&scope(), tree)
        .await
        .expect("the tree is stored");
    let (ended, resolved) = finish(&second, &mut events, &handle, models).await;
    let view = handle.inspect().await.expect("inspects");
    Resumed {
        crashed: true,
        ended,
        view,
        resolved,
    }
}

/// The processes of a tree that do work: every one but the coordinator's
/// turns (how many turns a run takes depends on how outcomes happen to
/// group, which a crash may change).
fn workers(view: &TreeView) -> BTreeMap<String, usize> {
    processes(view)
        .into_iter()
        .filter(|(program, _)| !program.ends_with(".coordinator"))
        .collect()
}

/// Crashes a run at every commit holding a step, a pending dispatch or a
/// settlement in turn (both cuts), and checks each resumed run against the
/// uninterrupted one: the same output, the same workers (no agent ran
/// again), and no model request sent twice (each call of the reference
/// run was made at most once, and one lost in the crash was resolved by
/// the host instead). Returns how many crashes it checked.
pub async fn crash_everywhere<O>(
    build: impl Fn(&Models) -> Program<Work, O>,
    answer: impl Fn(&Request) -> Result<Response, ModelError> + Send + Sync + 'static,
    task: &str,
) -> usize {
    let models = Models::new(answer);
    let program = build(&models);
    let (_, handle, expected) = run(&program, "reference", work(task)).await;
    let expected_view = handle.inspect().await.expect("inspects");
    let expected_calls = models.calls();
    let reference_total = models.total();
    let mut crashes = 0;
    for kind in [
        RecordKind::StepAdopted,
        RecordKind::EffectPending,
        RecordKind::EffectSettled,
    ] {
        for cut in [Cut::Before, Cut::After] {
            for nth in 1.. {
                let calls_before = models.calls();
                let seen_before = models.requests_by_model();
                let crash = Crash { kind, cut, nth };
                let resumed = crash_and_resume(
                    &program,
                    &format!("crashed-{crashes}"),
                    work(task),
                    &crash,
                    &models,
                )
                .await;
                let at = format!("{kind:?} {cut:?} #{nth}");
                assert_eq!(resumed.ended.status(), expected.status(), "{at}");
                assert_eq!(resumed.ended.output(), expected.output(), "{at}");
                assert_eq!(
                    resumed.ended.failure().map(|f| f.code.clone()),
                    expected.failure().map(|f| f.code.clone()),
                    "{at}"
                );
                assert_eq!(workers(&resumed.view), workers(&expected_view), "{at}");
                let mut total = 0;
                let seen_after = models.requests_by_model();
                for (model, count) in models.calls() {
                    let made = count - calls_before.get(&model).copied().unwrap_or_default();
                    let reference = expected_calls.get(&model).copied().unwrap_or_default();
                    assert!(
                        made <= reference,
                        "{at}: model {model} was called {made} times, {reference} without the crash"
                    );
                    total += made;
                    let requests = &seen_after[&model];
                    let earlier = seen_before.get(&model).map(Vec::len).unwrap_or_default();
                    let fresh: std::collections::BTreeSet<&String> =
                        requests[earlier..].iter().collect();
                    assert_eq!(
                        fresh.len(),
                        requests.len() - earlier,
                        "{at}: model {model} got a request twice"
                    );
                }
                assert!(
                    total <= reference_total && total + resumed.resolved >= reference_total,
                    "{at}: {total} calls and {} resolutions for {reference_total} calls without the crash",
                    resumed.resolved,
                );
                if !resumed.crashed {
                    break;
                }
                crashes += 1;
            }
        }
    }
    eprintln!("{crashes} crashes checked");
    crashes
}

/// The agent stream view of a finished tree, read by a watch from its
/// first record, checked for the view's promises: every agent that starts
/// ends once, after it started, each tool call ends once, and exactly one
/// terminal event comes last. Returns the events.
pub async fn agent_stream(engine: &Engine, tree: TreeId) -> Vec<baton_agent::AgentEvent> {
    use baton_agent::AgentEvent;
    let mut watch = engine.watch(&scope(), tree, 1).await.expect("watches");
    let mut stream = baton_agent::AgentStream::new();
    let mut events = Vec::new();
    while let Some(event) = watch.next().await {
        events.extend(stream.push(&event.expect("reads the log")));
    }
    let terminals = events.iter().filter(|e| e.is_terminal()).count();
    assert_eq!(terminals, 1, "exactly one terminal event: {events:#?}");
    assert!(
        events.last().is_some_and(AgentEvent::is_terminal),
        "the terminal event comes last"
    );
    let mut open = std::collections::BTreeSet::new();
    let mut calls = std::collections::BTreeSet::new();
    for event in &events {
        match event {
            AgentEvent::AgentStart { agent } => {
                assert!(
                    open.insert(agent.process),
                    "{:?} started twice",
                    agent.process
                )
            }
            AgentEvent::AgentEnd { agent, .. } => {
                assert!(
                    open.remove(&agent.process),
                    "{:?} ended unstarted",
                    agent.process
                )
            }
            AgentEvent::ToolCallStart { agent, call, .. } => {
                assert!(
                    open.contains(&agent.process),
                    "a call of an agent not running"
                );
                assert!(calls.insert(*call), "{call:?} started twice");
            }
            AgentEvent::ToolCallEnd { call, .. } => {
                assert!(calls.remove(call), "{call:?} ended unstarted")
            }
            _ => {}
        }
    }
    assert!(open.is_empty(), "agents that never ended: {open:?}");
    assert!(calls.is_empty(), "tool calls that never ended: {calls:?}");
    events
}

/// The names of the agents that started, in order.
pub fn started_agents(events: &[baton_agent::AgentEvent]) -> Vec<String> {
    events
        .iter()
        .filter_map(|event| match event {
            baton_agent::AgentEvent::AgentStart { agent } => {
                agent.name.as_ref().map(|name| name.as_str().to_owned())
            }
            _ => None,
        })
        .collect()
}
