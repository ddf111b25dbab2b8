//! A host process for the SIGKILL test (`tests/it/kill.rs`): runs 50 trees on
//! a SQLite store until they all finish, and may be killed at any moment.
//!
//! `killable <database> <side-file>` opens the store, recovers every
//! unfinished tree (`RecoverOptions { force: false }`: the killed owner's
//! lease is reclaimed because its process is gone), starts the trees that
//! are not stored yet, resolves every unknown effect it finds with the
//! settlement the dispatcher would have produced, answers every open wait
//! with a deterministic answer, and exits when all 50 roots have terminated.
//!
//! Each tree: the root dispatches a request and starts a worker child (which
//! dispatches one request of its own), then opens a host wait, then waits
//! for the child and completes with everything it saw. Dispatches have
//! replay policy `Never`; the dispatcher appends `tree effect` to the side
//! file and fsyncs it before it returns. Every state carries over 4 KiB of
//! its tree's own text, so each step is recorded as its change.
//!
//! Output, one line each: `E <tree> <event>` per committed event (the
//! progress markers), `RECOVERED <n>`, `RECOVER-ERROR <tree> <error>`,
//! `RESOLVED <tree> <effect>`, and `DONE` at the end.

use std::error::Error;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use baton::run::dispatch::{DispatchCall, Dispatcher, ReplayPolicy};
use baton::run::program::{
    Boundary, Condition, Definition, Descriptor, Effect, Execution, ExecutionState, Grant,
    ProgramConfig, Schema, Signal, SignalBody, StepError, Transition, configuration_digest,
    implementation_digest,
};
use baton::run::{
    BoxFuture, ChildKey, Engine, EngineConfig, EventKind, Payload, Program, RecoverOptions, Scope,
    Settlement, SignalError, SignalId, SignalRequest, StartId, StartRequest, Status, TreeId,
    Visibility,
};
use baton::store::sqlite::{Creation, SqliteConfig, SqliteStore};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

const TREES: u64 = 50;
const SCOPE: &str = "kill";

/// What a dispatch of `request` returns; the host resolves unknown effects
/// with the same, as it would after checking the side effect happened.
fn output_for(request: &Payload) -> Payload {
    Payload::from_value(&json!({ "done": request.to_value() })).expect("a small JSON value")
}

/// The host's deterministic answer to tree `n`'s wait.
fn answer_for(n: u64) -> bool {
    !n.is_multiple_of(3)
}

struct SideFile {
    file: Mutex<File>,
}

impl Dispatcher for SideFile {
    fn replay_policy(&self, _request: &Payload) -> ReplayPolicy {
        ReplayPolicy::Never
    }

    fn dispatch(&self, call: DispatchCall) -> BoxFuture<'static, Settlement> {
        let tree = call.request.to_value()["tree"].as_u64().unwrap_or(u64::MAX);
        let written = self
            .file
            .lock()
            .map_err(|_| "side file lock")
            .and_then(|mut file| {
                writeln!(file, "{tree} {}", call.effect).map_err(|_| "side file write")?;
                file.sync_data().map_err(|_| "side file fsync")
            });
        let settlement = match written {
            Ok(()) => Settlement::ok(output_for(&call.request)),
            Err(what) => Settlement::Unknown {
                diagnostic: what.to_owned(),
            },
        };
        Box::pin(std::future::ready(settlement))
    }
}

#[derive(Clone, Copy, Serialize, Deserialize)]
enum Role {
    Root,
    Worker,
}

#[derive(Serialize, Deserialize)]
struct State {
    role: Role,
    tree: u64,
    phase: u32,
    seen: Vec<Value>,
    /// Text that makes the state large enough (over 4 KiB) that each step
    /// is recorded as its change: recovery after a kill then rebuilds every
    /// state from the changes.
    ballast: String,
}

/// The [`State::ballast`] of tree `tree`: its own, so no two trees' states
/// share it.
fn ballast(tree: u64) -> String {
    format!("tree {tree} ").repeat(700)
}

struct Tree {
    role: Role,
    descriptor: Descriptor,
    children: Vec<Program>,
}

struct Run(State);

impl Definition for Tree {
    fn descriptor(&self) -> &Descriptor {
        &self.descriptor
    }

    fn start(&self, input: &Payload) -> Result<Box<dyn Execution>, StepError> {
        let tree = input.decode()?;
        Ok(Box::new(Run(State {
            role: self.role,
            tree,
            phase: 0,
            seen: Vec::new(),
            ballast: ballast(tree),
        })))
    }

    fn restore(&self, state: &ExecutionState) -> Result<Box<dyn Execution>, StepError> {
        Ok(Box::new(Run(state.decode()?)))
    }

    fn children(&self) -> Vec<Program> {
        self.children.clone()
    }
}

fn key(text: &str) -> Result<ChildKey, StepError> {
    ChildKey::new(text).map_err(StepError::other)
}

impl Run {
    fn record(&mut self, window: &[Signal]) -> Result<(), StepError> {
        for signal in window {
            let seen = match &signal.body {
                SignalBody::Settled { settlement, .. } => serde_json::to_value(settlement),
                SignalBody::ChildStarted { key, process, .. } => {
                    Ok(json!({ "started": key, "ok": process.is_some() }))
                }
                SignalBody::Input { payload } => Ok(json!({ "answer": payload.to_value() })),
                SignalBody::ChildrenReady { children, .. } => Ok(json!({
                    "children": children
                        .iter()
                        .map(|c| c.termination.output().map(Payload::to_value))
                        .collect::<Vec<_>>()
                })),
                SignalBody::WaitOpened { .. } | SignalBody::ControlReceipt { .. } => continue,
            };
            self.0.seen.push(seen.map_err(StepError::other)?);
        }
        Ok(())
    }
}

impl Execution for Run {
    fn step(&mut self, window: &[Signal]) -> Result<Transition, StepError> {
        let phase = self.0.phase;
        let tree = self.0.tree;
        match (self.0.role, phase) {
            (Role::Worker, 0) => {
                self.0.phase = 1;
                Ok(Transition::Continue {
                    consumed: 0,
                    effects: vec![Effect::dispatch(Payload::encode(
                        &json!({ "tree": tree, "by": "worker" }),
                    )?)],
                })
            }
            (Role::Worker, _) => {
                self.record(window)?;
                Ok(Transition::Complete {
                    consumed: window.len(),
                    output: Payload::encode(&self.0.seen)?,
                })
            }
            (Role::Root, 0) => {
                self.0.phase = 1;
                Ok(Transition::Continue {
                    consumed: 0,
                    effects: vec![
                        Effect::dispatch(Payload::encode(&json!({ "tree": tree, "by": "root" }))?),
                        Effect::StartChild {
                            key: key("worker")?,
                            program: worker_digest(),
                            input: Payload::encode(&tree)?,
                            budget: baton::run::Budget::unlimited(),
                            capabilities: baton::run::Capabilities::none(),
                            grant: Grant::Exact,
                        },
                    ],
                })
            }
            (Role::Root, 1) => {
                self.record(window)?;
                self.0.phase = 2;
                Ok(Transition::Continue {
                    consumed: window.len(),
                    effects: vec![Effect::Wait {
                        key: key("ask")?,
                        request: Payload::encode(&json!({ "tree": tree }))?,
                        answer_schema: Schema::of::<bool>(),
                    }],
                })
            }
            (Role::Root, 2) => {
                // Sleep until the addressed answer arrives.
                let opened = window.iter().find_map(|signal| match &signal.body {
                    SignalBody::WaitOpened { wait, .. } => Some(*wait),
                    _ => None,
                });
                let answered = window
                    .iter()
                    .any(|s| s.wait.is_some() && matches!(s.body, SignalBody::Input { .. }));
                if answered {
                    self.record(window)?;
                    self.0.phase = 3;
                    return Ok(Transition::Continue {
                        consumed: window.len(),
                        effects: vec![Effect::WaitChildren {
                            keys: vec![key("worker")?],
                            boundary: Boundary::Result,
                            condition: Condition::All,
                        }],
                    });
                }
                let wait = opened.ok_or_else(|| StepError::other("woken without a wait"))?;
                Ok(Transition::Wait {
                    consumed: window.len(),
                    wait,
                })
            }
            (Role::Root, _) => {
                self.record(window)?;
                Ok(Transition::Complete {
                    consumed: window.len(),
                    output: Payload::encode(&self.0.seen)?,
                })
            }
        }
    }

    fn snapshot(&self) -> Result<ExecutionState, StepError> {
        ExecutionState::encode(&self.0)
    }
}

fn program(role: Role, dispatcher: Arc<dyn Dispatcher>, children: Vec<Program>) -> Program {
    let name = match role {
        Role::Root => "kill.root",
        Role::Worker => "kill.worker",
    };
    let descriptor = Descriptor::new(
        name,
        "A kill-test tree.",
        Schema::of::<u64>(),
        Schema::any(),
    )
    .expect("a valid descriptor");
    Program::new(ProgramConfig {
        definition: Arc::new(Tree {
            role,
            descriptor,
            children,
        }),
        dispatcher: Some(dispatcher),
        implementation: implementation_digest(env!("CARGO_PKG_NAME"), env!("CARGO_PKG_VERSION")),
        configuration: configuration_digest(name).expect("encodes"),
    })
}

static WORKER: std::sync::OnceLock<baton::run::Digest> = std::sync::OnceLock::new();

fn worker_digest() -> baton::run::Digest {
    *WORKER.get().expect("set before any tree runs")
}

fn start_id(n: u64) -> StartId {
    StartId::new(SCOPE, format!("tree-{n}")).expect("a valid start id")
}

fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), Box<dyn Error>> {
    let mut args = std::env::args().skip(1);
    let (Some(database), Some(side)) = (args.next(), args.next()) else {
        return Err("usage: killable <database> <side-file>".into());
    };
    let store = SqliteStore::open_with(
        PathBuf::from(database),
        SqliteConfig {
            creation: Creation::ExistingOrNew,
            compact: false,
            ..SqliteConfig::default()
        },
    )?;
    let file = OpenOptions::new().create(true).append(true).open(side)?;
    let dispatcher: Arc<dyn Dispatcher> = Arc::new(SideFile {
        file: Mutex::new(file),
    });
    let worker = program(Role::Worker, dispatcher.clone(), Vec::new());
    WORKER
        .set(worker.reference().digest)
        .map_err(|_| "worker set twice")?;
    let root = program(Role::Root, dispatcher, vec![worker]);
    let mut config = EngineConfig {
        programs: vec![root.erase()],
        ..EngineConfig::new(Arc::new(store))
    };
    config.snapshot_every = 8;
    let engine = Engine::new(config)?;

    // Progress markers: one line per committed event.
    let mut events = engine.events();
    let (dirty_tx, mut dirty) = tokio::sync::mpsc::unbounded_channel::<TreeId>();
    tokio::spawn(async move {
        while let Ok(event) = events.recv().await {
            if matches!(event.kind, EventKind::Delta { .. }) {
                continue;
            }
            say(&format!("E {} {:?}", event.tree, event.kind).replace('\n', " "));
            let _ = dirty_tx.send(event.tree);
        }
    });

    let report = engine.recover(RecoverOptions::default()).await?;
    for (tree, result) in &report {
        if let Err(error) = result {
            say(&format!("RECOVER-ERROR {tree} {error}"));
        }
    }
    say(&format!("RECOVERED {}", report.len()));

    let scope = Scope::new(SCOPE)?;
    let mut trees = std::collections::BTreeMap::new();
    for n in 0..TREES {
        let handle = engine
            .start(&root, StartRequest::new(start_id(n), Payload::encode(&n)?))
            .await?;
        trees.insert(handle.tree(), n);
    }
    let mut pending: std::collections::BTreeSet<TreeId> = trees.keys().copied().collect();
    let mut check: Vec<TreeId> = pending.iter().copied().collect();
    loop {
        for tree in std::mem::take(&mut check) {
            if !pending.contains(&tree) {
                continue;
            }
            let view = engine.inspect(&scope, tree, Visibility::Private).await?;
            if view.root().status.is_terminal() {
                pending.remove(&tree);
                continue;
            }
            for process in &view.processes {
                for effect in &process.unknown_effects {
                    let request = process
                        .effects
                        .iter()
                        .find(|e| e.id == *effect)
                        .and_then(|e| e.request.clone())
                        .ok_or("an unknown effect without its request")?;
                    engine
                        .resolve_unknown(
                            &scope,
                            tree,
                            *effect,
                            Settlement::ok(output_for(&request)),
                        )
                        .await?;
                    say(&format!("RESOLVED {tree} {effect}"));
                }
                if process.status == Status::Waiting
                    && let Some(wait) = process.open_waits.first()
                {
                    let answer = SignalRequest {
                        id: SignalId::new("answer")?,
                        wait: Some(wait.id),
                        payload: Payload::encode(&answer_for(trees[&tree]))?,
                    };
                    match engine
                        .process::<Payload>(&scope, tree)
                        .await?
                        .signal(answer)
                        .await
                    {
                        Ok(_)
                        | Err(SignalError::WaitClosed { .. } | SignalError::Terminated { .. }) => {}
                        Err(error) => return Err(error.into()),
                    }
                }
            }
        }
        if pending.is_empty() {
            break;
        }
        // Look again at trees that committed something since.
        match dirty.recv().await {
            Some(tree) => check.push(tree),
            None => break,
        }
        while let Ok(tree) = dirty.try_recv() {
            if !check.contains(&tree) {
                check.push(tree);
            }
        }
    }
    say("DONE");
    engine.close().await;
    Ok(())
}
