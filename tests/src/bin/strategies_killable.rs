//! A host process for the strategies' SIGKILL test
//! (`tests/it/strategy_kill.rs`): runs every strategy scenario of
//! `baton_examples::strategies` twice on a SQLite store until all twelve
//! trees finish, and may be killed at any moment.
//!
//! `strategies_killable <database> <side-file>` opens the store, recovers
//! every unfinished tree (`RecoverOptions { force: false }`), starts the
//! trees that are not stored yet, resolves every unknown model call it
//! finds with the answer the scripted model gives for that request (as a
//! host that recorded the answer does: the model is not called), and exits
//! when every root has terminated.
//!
//! Every model call appends its request, as one line of JSON, to the side
//! file and fsyncs it before the model answers, so the test can check
//! that no request was ever sent twice. Each tree's task names its run, so
//! the requests of different trees differ.
//!
//! Output, one line each: `E <tree> <event>` per committed event (the
//! progress markers), `RECOVERED <n>`, `RECOVER-ERROR <tree> <error>`,
//! `RESOLVED <tree> <effect>`, and `DONE` at the end.

use std::collections::{BTreeMap, BTreeSet};
use std::error::Error;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use baton::agent::{ChatModel, ModelCall, ModelError, ModelIdentity, Request, Response};
use baton::run::{
    BoxFuture, Engine, EngineConfig, EventKind, Payload, RecoverOptions, Scope, Settlement,
    StartId, StartRequest, TreeId, Visibility,
};
use baton::store::sqlite::{Creation, SqliteConfig, SqliteStore};
use baton::strategy::Work;
use baton_examples::strategies::{Scenario, answer};

const SCOPE: &str = "strategies";
/// Trees per scenario.
const RUNS: u32 = 2;

/// A scripted model that writes each request to the side file (fsynced)
/// before answering it with [`answer`].
struct Recorded {
    name: String,
    side: Arc<Mutex<File>>,
}

impl ChatModel for Recorded {
    fn identity(&self) -> ModelIdentity {
        // The scripted model's identity, so the programs are the CLI's.
        ModelIdentity {
            provider: "scripted".into(),
            model: self.name.clone(),
        }
    }

    fn call(&self, request: Request) -> BoxFuture<'_, Result<Response, ModelError>> {
        let written = serde_json::to_string(&request)
            .map_err(|e| e.to_string())
            .and_then(|line| {
                let mut file = self.side.lock().map_err(|_| "side file lock".to_owned())?;
                writeln!(file, "{line}").map_err(|e| e.to_string())?;
                file.sync_data().map_err(|e| e.to_string())
            });
        let result = match written {
            Ok(()) => answer(&request),
            Err(error) => Err(ModelError::Request(error)),
        };
        Box::pin(std::future::ready(result))
    }
}

/// The start id of run `n` of `scenario`.
pub fn start_id(scenario: Scenario, n: u32) -> StartId {
    StartId::new(SCOPE, format!("{}-{n}", scenario.name())).expect("a valid start id")
}

/// The work of run `n` of `scenario`.
pub fn work(scenario: Scenario, n: u32) -> Work {
    Work::new(&format!("{} (run {n})", scenario.task())).expect("a task encodes")
}

fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

/// Resolves the tree's unknown model calls with the scripted answers.
async fn resolve(
    engine: &Engine,
    scope: &Scope,
    tree: TreeId,
) -> Result<(), Box<dyn Error + Send + Sync>> {
    let view = engine.inspect(scope, tree, Visibility::Private).await?;
    for process in &view.processes {
        for effect in &process.unknown_effects {
            let request = process
                .effects
                .iter()
                .find(|e| e.id == *effect)
                .and_then(|e| e.request.clone())
                .ok_or("an unknown effect without its request")?;
            let call: ModelCall = request.decode()?;
            let response = answer(&call.request)?;
            engine
                .resolve_unknown(
                    scope,
                    tree,
                    *effect,
                    Settlement::ok(Payload::encode(&response)?),
                )
                .await?;
            say(&format!("RESOLVED {tree} {effect}"));
        }
    }
    Ok(())
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), Box<dyn Error + Send + Sync>> {
    let mut args = std::env::args().skip(1);
    let (Some(database), Some(side)) = (args.next(), args.next()) else {
        return Err("usage: strategies_killable <database> <side-file>".into());
    };
    let store = SqliteStore::open_with(
        PathBuf::from(database),
        SqliteConfig {
            creation: Creation::ExistingOrNew,
            compact: false,
            ..SqliteConfig::default()
        },
    )?;
    let side = Arc::new(Mutex::new(
        OpenOptions::new().create(true).append(true).open(side)?,
    ));
    let model = |name: &str| -> Arc<dyn ChatModel> {
        Arc::new(Recorded {
            name: name.to_owned(),
            side: side.clone(),
        })
    };
    let mut programs = BTreeMap::new();
    for scenario in Scenario::ALL {
        programs.insert(scenario, scenario.program_with(&model)?);
    }
    let mut config = EngineConfig {
        programs: programs.values().map(|p| p.erase()).collect(),
        ..EngineConfig::new(Arc::new(store))
    };
    config.snapshot_every = 16;
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
    let mut pending = BTreeSet::new();
    for (scenario, program) in &programs {
        for n in 0..RUNS {
            let request = StartRequest::new(start_id(*scenario, n), work(*scenario, n));
            let handle = engine.start(program, request).await?;
            pending.insert(handle.tree());
        }
    }
    let mut check: Vec<TreeId> = pending.iter().copied().collect();
    loop {
        for tree in std::mem::take(&mut check) {
            if !pending.contains(&tree) {
                continue;
            }
            let view = engine.inspect(&scope, tree, Visibility::Public).await?;
            if view.root().status.is_terminal() {
                pending.remove(&tree);
                continue;
            }
            if view.processes.iter().any(|p| !p.unknown_effects.is_empty()) {
                resolve(&engine, &scope, tree).await?;
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
