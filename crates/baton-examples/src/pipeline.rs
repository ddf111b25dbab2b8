//! A workflow pipeline on the embedded durable store: two pure stages, one
//! program, a log on disk (the workflow of the README's "Use the library").
//! Run it with `cargo run -p baton-examples --example pipeline`; it prints
//! `[draft] quarterly report`.

use std::error::Error;
use std::sync::Arc;

use baton::run::{Engine, EngineConfig, Program, StartId, StartRequest};
use baton::store::sqlite::SqliteStore;
use baton::workflow::{Config, TransformError, Workflow, transform};

/// The pipeline: normalize a title, then tag it.
pub fn pipeline() -> Result<Program<String, String>, Box<dyn Error>> {
    Ok(Workflow::new(Config {
        name: "example.pipeline".into(),
        description: "Normalize a title, then tag it.".into(),
        build: "pipeline example 1".into(),
        stages: vec![
            transform("normalize", |title: String| {
                Ok::<_, TransformError>(title.trim().to_lowercase())
            }),
            transform("tag", |title: String| {
                Ok::<_, TransformError>(format!("[draft] {title}"))
            }),
        ],
    })?
    .program::<String, String>())
}

/// Runs the pipeline on a SQLite file in a fresh temporary directory, which
/// it removes afterwards, and returns the output line.
pub async fn run() -> Result<Vec<String>, Box<dyn Error>> {
    let pipeline = pipeline()?;
    let dir = std::env::temp_dir().join(format!("baton-pipeline-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let store = SqliteStore::open_or_create(dir.join("pipeline.db"))?;
    let engine = Engine::new(EngineConfig {
        programs: vec![pipeline.erase()],
        ..EngineConfig::new(Arc::new(store))
    })?;
    let request = StartRequest::new(
        StartId::new("acme", "title-1")?,
        "  Quarterly Report ".to_owned(),
    );
    let handle = engine.start(&pipeline, request).await?;
    let output = handle.output().await?;
    engine.close().await;
    std::fs::remove_dir_all(&dir)?;
    Ok(vec![output])
}
