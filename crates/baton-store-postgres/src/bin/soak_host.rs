//! The host process of the multi-process SIGKILL test
//! (`tests/it/soak.rs`): one of several engines serving one PostgreSQL
//! database, killed at any moment.
//!
//! `baton-postgres-soak-host <url> <side-file> <index> <hosts> <trees>`
//! opens the store (creating its tables if the database is empty), takes
//! up every unfinished tree whose writer is gone (`recover` without force:
//! the lease of a killed process on this host is reclaimed at once), starts
//! the trees of its share (`n % hosts == index`) that are not stored yet,
//! and then, on a short tick, takes up again whatever a killed host left,
//! until every one of the `trees` trees is done or parked on an unknown
//! effect. Then it prints `DONE` and exits.
//!
//! Each tree: the root dispatches one request and starts a worker child
//! (which dispatches one request of its own), waits for the child, and
//! completes with everything it saw. Every state carries 6 KB of seeded
//! text with one byte more changed per step, so every step's record is
//! stored as pieces and shares most of them with the step before: what the
//! writer's memory of each tree's last cut reuses, across takeovers.
//! Dispatches have replay policy `Never`;
//! the dispatcher appends `<tree> <effect>` to the side file (opened for
//! appending, so lines of several processes do not mix) and fsyncs it
//! before it returns.
//!
//! Output, one line each: `E <tree>` per committed event (the progress
//! markers), `RECOVER-ERROR <tree> <error>` for a failure other than a lease
//! held by a live host (or a takeover by one), and `DONE` at the end.

use std::error::Error;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use baton_run::dispatch::{DispatchCall, Dispatcher, ReplayPolicy};
use baton_run::program::{
    Boundary, Condition, Definition, Descriptor, Effect, Execution, ExecutionState, Grant,
    ProgramConfig, Schema, Signal, SignalBody, StepError, Transition, configuration_digest,
    implementation_digest,
};
use baton_run::store::{ListFilter, Store, TreeStatus};
use baton_run::{
    BoxFuture, Budget, Capabilities, ChildKey, Digest, Engine, EngineConfig, EventKind, Payload,
    Program, RecoverOptions, RuntimeError, Settlement, StartError, StartId, StartRequest,
    TreeError,
};
use baton_store_postgres::{Creation, PostgresConfig, PostgresStore};
use serde_json::{Value, json};

const SCOPE: &str = "soak";

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
                file.write_all(format!("{tree} {}\n", call.effect).as_bytes())
                    .map_err(|_| "side file write")?;
                file.sync_data().map_err(|_| "side file fsync")
            });
        let settlement = match written {
            Ok(()) => Settlement::ok(
                Payload::from_value(&json!({ "done": call.request.to_value() }))
                    .expect("a small JSON value"),
            ),
            Err(what) => Settlement::Unknown {
                diagnostic: what.to_owned(),
            },
        };
        Box::pin(std::future::ready(settlement))
    }
}

#[derive(Clone, Copy, serde::Serialize, serde::Deserialize)]
enum Role {
    Root,
    Worker,
}

#[derive(serde::Serialize, serde::Deserialize)]
struct State {
    role: Role,
    tree: u64,
    phase: u32,
    seen: Vec<Value>,
    /// Seeded text that makes every state longer than the store's inline
    /// limit, so each step's record is stored as pieces (and a step shares
    /// all but one of them with the step before), whoever holds the tree.
    ballast: String,
}

/// Bytes of [`State::ballast`]: over the stores' 4 KiB inline limit.
const BALLAST: usize = 6_000;

/// The ballast of tree `tree` at phase `phase`: the same seeded text, with
/// one byte per phase changed.
fn ballast(tree: u64, phase: u32) -> String {
    let mut word = tree.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut text: Vec<u8> = (0..BALLAST)
        .map(|_| {
            word ^= word << 13;
            word ^= word >> 7;
            word ^= word << 17;
            b"0123456789abcdef"[(word >> 60) as usize]
        })
        .collect();
    for at in 0..phase as usize {
        text[(at * 1_999 + 777) % BALLAST] = b'x';
    }
    String::from_utf8(text).expect("ascii")
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
            ballast: ballast(tree, 0),
        })))
    }

    fn restore(&self, state: &ExecutionState) -> Result<Box<dyn Execution>, StepError> {
        Ok(Box::new(Run(state.decode()?)))
    }

    fn children(&self) -> Vec<Program> {
        self.children.clone()
    }
}

impl Run {
    fn record(&mut self, window: &[Signal]) -> Result<(), StepError> {
        for signal in window {
            let seen = match &signal.body {
                SignalBody::Settled { settlement, .. } => serde_json::to_value(settlement),
                SignalBody::ChildStarted { key, process, .. } => {
                    Ok(json!({ "started": key, "ok": process.is_some() }))
                }
                SignalBody::ChildrenReady { children, .. } => Ok(json!({
                    "children": children
                        .iter()
                        .map(|c| c.termination.output().map(Payload::to_value))
                        .collect::<Vec<_>>()
                })),
                _ => continue,
            };
            self.0.seen.push(seen.map_err(StepError::other)?);
        }
        Ok(())
    }
}

fn dispatch(tree: u64, by: &str) -> Result<Effect, StepError> {
    Ok(Effect::dispatch(Payload::encode(
        &json!({ "tree": tree, "by": by }),
    )?))
}

fn worker_key() -> Result<ChildKey, StepError> {
    ChildKey::new("worker").map_err(StepError::other)
}

impl Execution for Run {
    fn step(&mut self, window: &[Signal]) -> Result<Transition, StepError> {
        let transition = self.advance(window)?;
        self.0.ballast = ballast(self.0.tree, self.0.phase);
        Ok(transition)
    }

    fn snapshot(&self) -> Result<ExecutionState, StepError> {
        ExecutionState::encode(&self.0)
    }
}

impl Run {
    fn advance(&mut self, window: &[Signal]) -> Result<Transition, StepError> {
        let tree = self.0.tree;
        match (self.0.role, self.0.phase) {
            (Role::Worker, 0) => {
                self.0.phase = 1;
                Ok(Transition::Continue {
                    consumed: 0,
                    effects: vec![dispatch(tree, "worker")?],
                })
            }
            (Role::Root, 0) => {
                self.0.phase = 1;
                Ok(Transition::Continue {
                    consumed: 0,
                    effects: vec![
                        dispatch(tree, "root")?,
                        Effect::StartChild {
                            key: worker_key()?,
                            program: *WORKER.get().expect("set before any tree runs"),
                            input: Payload::encode(&tree)?,
                            budget: Budget::unlimited(),
                            capabilities: Capabilities::none(),
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
                    effects: vec![Effect::WaitChildren {
                        keys: vec![worker_key()?],
                        boundary: Boundary::Result,
                        condition: Condition::All,
                    }],
                })
            }
            _ => {
                self.record(window)?;
                Ok(Transition::Complete {
                    consumed: window.len(),
                    output: Payload::encode(&self.0.seen)?,
                })
            }
        }
    }
}

static WORKER: OnceLock<Digest> = OnceLock::new();

fn program(role: Role, dispatcher: Arc<dyn Dispatcher>, children: Vec<Program>) -> Program {
    let name = match role {
        Role::Root => "soak.root",
        Role::Worker => "soak.worker",
    };
    let descriptor = Descriptor::new(
        name,
        "A soak-test tree.",
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

fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

/// Takes up every unfinished tree whose writer is gone; reports failures
/// other than a lease held by a live host.
async fn take_up(engine: &Engine) -> Result<(), Box<dyn Error>> {
    for (tree, result) in engine.recover(RecoverOptions::default()).await? {
        match result {
            // Held by a live host, or taken over by one meanwhile.
            Ok(())
            | Err(TreeError::LeaseHeld { .. } | TreeError::Stopped(RuntimeError::Fenced { .. })) => {
            }
            Err(error) => say(&format!("RECOVER-ERROR {tree} {error}")),
        }
    }
    Ok(())
}

/// Whether all `trees` trees are stored and each is done or parked.
async fn finished(store: &PostgresStore, trees: usize) -> Result<bool, Box<dyn Error>> {
    let listing = store.list(ListFilter::default()).await?;
    Ok(listing.trees.len() == trees
        && listing
            .trees
            .iter()
            .all(|meta| matches!(meta.status, TreeStatus::Done | TreeStatus::NeedsAttention)))
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), Box<dyn Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [url, side, index, hosts, trees] = &args[..] else {
        return Err(
            "usage: baton-postgres-soak-host <url> <side-file> <index> <hosts> <trees>".into(),
        );
    };
    let (index, hosts, trees): (u64, u64, usize) = (index.parse()?, hosts.parse()?, trees.parse()?);
    let store = PostgresStore::open_with(PostgresConfig {
        creation: Creation::ExistingOrNew,
        // The whole history stays, so the test checks every dispatch.
        compact: false,
        read_connections: 2,
        ..PostgresConfig::new(url.clone())
    })?;
    let file = OpenOptions::new().create(true).append(true).open(side)?;
    let dispatcher: Arc<dyn Dispatcher> = Arc::new(SideFile {
        file: Mutex::new(file),
    });
    let worker = program(Role::Worker, dispatcher.clone(), Vec::new());
    WORKER
        .set(worker.reference().digest)
        .map_err(|_| "worker set twice")?;
    let root = program(Role::Root, dispatcher, vec![worker]);
    let engine = Engine::new(EngineConfig {
        programs: vec![root.clone()],
        lease_ttl: Duration::from_secs(5),
        snapshot_every: 8,
        ..EngineConfig::new(Arc::new(store.clone()))
    })?;

    let mut events = engine.events();
    tokio::spawn(async move {
        while let Ok(event) = events.recv().await {
            if !matches!(event.kind, EventKind::Delta { .. }) {
                say(&format!("E {}", event.tree));
            }
        }
    });

    take_up(&engine).await?;
    for n in (0..trees as u64).filter(|n| n % hosts == index) {
        let id = StartId::new(SCOPE, format!("tree-{n}"))?;
        match engine
            .start(&root, StartRequest::new(id, Payload::encode(&n)?))
            .await
        {
            // Another host runs the tree: it took it up first, or took it
            // over from this one (two hosts that both find a writer gone
            // both force its lease; the later grant fences the earlier).
            Ok(_)
            | Err(
                StartError::LeaseHeld { .. }
                | StartError::Fenced { .. }
                | StartError::Tree(
                    TreeError::LeaseHeld { .. } | TreeError::Stopped(RuntimeError::Fenced { .. }),
                ),
            ) => {}
            Err(error) => return Err(error.into()),
        }
    }
    // A host that dies leaves no notice: look on a short tick for trees to
    // take up, as a server would, until all the work is done.
    let mut tick = tokio::time::interval(Duration::from_millis(200));
    while !finished(&store, trees).await? {
        tick.tick().await;
        take_up(&engine).await?;
    }
    say("DONE");
    engine.close().await;
    Ok(())
}
