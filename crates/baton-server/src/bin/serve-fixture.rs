//! `serve-fixture DB EFFECTS LEASE_MS GRACE_MS`: runs `serve` over a SQLite
//! store for the process tests of `baton-server` (SIGKILL and SIGINT).
//!
//! The registry holds two activities whose input is how many milliseconds
//! the call takes (on the engine's clock):
//!
//! - `fixture.never` (replay policy `Never`) appends its effect id to the
//!   file `EFFECTS` (its side effect, counted by the tests) before it waits;
//! - `fixture.same` (replay policy `SameIdentity`) only waits, so it may be
//!   sent again after a crash.
//!
//! It listens on 127.0.0.1 (a free port), with the tokens of the
//! environment variable `BATON_TOKENS`, and prints one line per fact the
//! tests read: `listening ADDR`, `dispatched PROGRAM EFFECT` when a call
//! starts, and `stopped` once the host shut down. SIGINT or SIGTERM shut
//! it down gracefully with `GRACE_MS` of grace.

use std::io::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use baton::run::dispatch::ReplayPolicy;
use baton::run::{EngineConfig, Program};
use baton::store::sqlite::SqliteStore;
use baton::workflow::{Activity, ActivityConfig, ActivityContext, ActivityError};
use baton_server::{ServeConfig, Server, Tokens, shutdown_signal};

fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    // A test reads these lines; a closed pipe only means nobody listens.
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

/// Waits `ms` on the engine's clock.
async fn take(ms: u64, context: &ActivityContext) {
    let clock = context.clock();
    clock
        .sleep_until(clock.now().plus(Duration::from_millis(ms)))
        .await;
}

fn activities(effects: PathBuf) -> Result<Vec<Program>, Box<dyn std::error::Error>> {
    let never = Activity::<u64, u64>::new(
        ActivityConfig {
            replay: ReplayPolicy::Never,
            timeout: Duration::from_secs(600),
            build: "serve-fixture never 1".into(),
            ..ActivityConfig::new(
                "fixture.never",
                "Append the effect id to a file, then wait.",
            )
        },
        move |ms: u64, context: ActivityContext| {
            let effects = effects.clone();
            async move {
                let effect = context.idempotency_key();
                let mut file = std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(&effects)
                    .map_err(|error| ActivityError::new(error.to_string()))?;
                writeln!(file, "{effect}")
                    .map_err(|error| ActivityError::new(error.to_string()))?;
                file.sync_all()
                    .map_err(|error| ActivityError::new(error.to_string()))?;
                say(&format!("dispatched fixture.never {effect}"));
                take(ms, &context).await;
                Ok(ms)
            }
        },
    )?;
    let same = Activity::<u64, u64>::new(
        ActivityConfig {
            replay: ReplayPolicy::SameIdentity,
            timeout: Duration::from_secs(600),
            build: "serve-fixture same 1".into(),
            ..ActivityConfig::new("fixture.same", "Wait; safe to send again.")
        },
        |ms: u64, context: ActivityContext| async move {
            say(&format!(
                "dispatched fixture.same {}",
                context.idempotency_key()
            ));
            take(ms, &context).await;
            Ok(ms)
        },
    )?;
    Ok(vec![never.program().erase(), same.program().erase()])
}

async fn run(args: &[String]) -> Result<(), Box<dyn std::error::Error>> {
    let [db, effects, lease_ms, grace_ms] = args else {
        return Err("usage: serve-fixture DB EFFECTS LEASE_MS GRACE_MS".into());
    };
    let store = SqliteStore::open_or_create(db)?;
    let mut tokens = Tokens::new();
    tokens.extend_from_env("BATON_TOKENS")?;
    let config = ServeConfig {
        listen: Some("127.0.0.1:0".parse()?),
        tokens,
        grace: Duration::from_millis(grace_ms.parse()?),
        ..ServeConfig::new(EngineConfig {
            programs: activities(PathBuf::from(effects))?,
            lease_ttl: Duration::from_millis(lease_ms.parse()?),
            ..EngineConfig::new(Arc::new(store))
        })
    };
    let shutdown = shutdown_signal()?;
    let server = Server::bind(config).await?;
    let addr = server.local_addr().ok_or("the server does not listen")?;
    say(&format!("listening {addr}"));
    server.run(shutdown).await?;
    say("stopped");
    Ok(())
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("serve-fixture: {error}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(&args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("serve-fixture: {error}");
            ExitCode::FAILURE
        }
    }
}
