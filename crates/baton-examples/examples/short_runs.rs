//! Many short runs on a durable store: sixteen hosts (an engine each, as
//! separate processes sharing one store would be) start 1,000 roots of three
//! pure stages on one SQLite file, and the store's own count of write
//! transactions shows what they cost. Each root ends in its first round, so
//! its start, its steps, its end and the release of its lease are one
//! transaction (`Store::create_tree`), and roots that commit at the same
//! moment share one transaction and one fsync in the store's group commit.
//! See "Durability and group commit" in `docs/guides/durable-deployment.md`.
//!
//! Run it with `cargo run -p baton-examples --example short_runs`.

use std::error::Error;
use std::sync::Arc;

use baton::run::store::{ListFilter, Store, TreeStatus};
use baton::run::{Engine, EngineConfig, StartId, StartRequest};
use baton::store::sqlite::SqliteStore;
use baton::workflow::{Config as WorkflowConfig, Workflow, transform};

const HOSTS: usize = 16;
const ROOTS_PER_HOST: usize = 62;

#[tokio::main]
async fn main() -> Result<(), Box<dyn Error>> {
    let dir = std::env::temp_dir().join(format!("baton-short-runs-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let result = run(&dir.join("store.db")).await;
    std::fs::remove_dir_all(&dir)?;
    result
}

async fn run(path: &std::path::Path) -> Result<(), Box<dyn Error>> {
    let store = SqliteStore::create(path)?;
    let chain = Workflow::new(WorkflowConfig {
        name: "example.short".into(),
        description: "Three pure stages.".into(),
        build: "1".into(),
        stages: vec![
            transform("trim", |text: String| Ok(text.trim().to_owned())),
            transform("upper", |text: String| Ok(text.to_uppercase())),
            transform("mark", |text: String| Ok(format!("{text}!"))),
        ],
    })?
    .program::<String, String>();

    let before = store.transactions();
    let mut hosts = tokio::task::JoinSet::new();
    for host in 0..HOSTS {
        let engine = Engine::new(EngineConfig {
            programs: vec![chain.erase()],
            ..EngineConfig::new(Arc::new(store.clone()))
        })?;
        let chain = chain.clone();
        hosts.spawn(async move {
            for n in 0..ROOTS_PER_HOST {
                let id = StartId::new("example", format!("host{host}-{n}"))?;
                let handle = engine
                    .start(&chain, StartRequest::new(id, format!("  run {n} ")))
                    .await?;
                let output = handle.output().await?;
                if output != format!("RUN {n}!") {
                    return Err(format!("unexpected output {output:?}").into());
                }
            }
            engine.close().await;
            Ok::<(), Box<dyn Error + Send + Sync>>(())
        });
    }
    while let Some(joined) = hosts.join_next().await {
        joined?.map_err(|error| error.to_string())?;
    }
    let spent = store.transactions() - before;

    let listing = store
        .list(ListFilter {
            status: Some(TreeStatus::Done),
            ..ListFilter::default()
        })
        .await?;
    let roots = HOSTS * ROOTS_PER_HOST;
    println!(
        "{roots} roots started by {HOSTS} hosts, {} stored done",
        listing.trees.len()
    );
    println!(
        "{spent} write transactions in all: at most one per root, fewer when roots commit together"
    );
    if listing.trees.len() != roots || spent as usize > roots {
        return Err("the roots did not each cost at most one transaction".into());
    }
    Ok(())
}
