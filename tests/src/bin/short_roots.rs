//! A host process for the short-roots SIGKILL test (`tests/it/short_kill.rs`):
//! many concurrent clients start short roots on one SQLite store, and the
//! process may be killed at any moment.
//!
//! `short_roots <database> <clients> <roots>` opens the store and runs
//! `clients` tasks, each with an engine of its own (as separate hosts on
//! one store would be), each starting roots `c<client>-<n>` for `n` in
//! `0..roots` one after another. Each root is a workflow of three pure
//! transforms that ends in its first round, so its start, its steps, its end
//! and its lease's release are one commit. A root that was stored before
//! (by an earlier, killed run) is answered from the store.
//!
//! Output, one line each: `F <start key> <output>` once a root's start
//! returned and its output arrived (the host saw it started and finished),
//! and `DONE` at the end.

use std::error::Error;
use std::io::Write;
use std::sync::Arc;

use baton::run::{Engine, EngineConfig, StartId, StartRequest};
use baton::store::sqlite::{Creation, SqliteConfig, SqliteStore};
use baton::workflow::{Config as WorkflowConfig, Workflow, transform};

/// The scope of every root.
const SCOPE: &str = "short";

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), Box<dyn Error>> {
    let mut args = std::env::args().skip(1);
    let usage = "usage: short_roots <database> <clients> <roots>";
    let database = args.next().ok_or(usage)?;
    let clients: u32 = args.next().ok_or(usage)?.parse()?;
    let roots: u32 = args.next().ok_or(usage)?.parse()?;
    let store = SqliteStore::open_with(
        &database,
        SqliteConfig {
            creation: Creation::ExistingOrNew,
            ..SqliteConfig::default()
        },
    )?;
    let chain = Workflow::new(WorkflowConfig {
        name: "kill.short".into(),
        description: "Three pure stages.".into(),
        build: "short-roots".into(),
        stages: vec![
            transform("a", |text: String| Ok(text + "a")),
            transform("b", |text: String| Ok(text + "b")),
            transform("c", |text: String| Ok(text + "c")),
        ],
    })?
    .program::<String, String>();
    let mut tasks = tokio::task::JoinSet::new();
    for client in 0..clients {
        let engine = Engine::new(EngineConfig {
            programs: vec![chain.erase()],
            ..EngineConfig::new(Arc::new(store.clone()))
        })?;
        let chain = chain.clone();
        tasks.spawn(async move {
            for n in 0..roots {
                let key = format!("c{client}-{n}");
                let id = StartId::new(SCOPE, &key)?;
                let handle = engine
                    .start(&chain, StartRequest::new(id, key.clone()))
                    .await?;
                let output = handle.output().await?;
                // One write per line, so a kill never splits one.
                let line = format!("F {key} {output}\n");
                std::io::stdout().lock().write_all(line.as_bytes())?;
            }
            Ok::<(), Box<dyn Error + Send + Sync>>(())
        });
    }
    while let Some(joined) = tasks.join_next().await {
        joined?.map_err(|error| error.to_string())?;
    }
    println!("DONE");
    Ok(())
}
