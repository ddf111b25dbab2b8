//! `serve`: a long-running worker host for the registry's programs (the
//! `baton-server` crate), stopped by SIGINT or SIGTERM.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use baton::run::EngineConfig;
use baton_server::{ServeConfig, ServeError, Server, Tokens};
use clap::Args;

use crate::context::Context;
use crate::error::{CliError, Stop};

/// `serve`'s flags.
#[derive(Clone, Debug, Args)]
pub struct ServeArgs {
    /// Serve the HTTP API on this address (`127.0.0.1:8080`); without it
    /// the host only runs trees.
    #[arg(long, value_name = "ADDR")]
    pub listen: Option<SocketAddr>,
    /// A file of API tokens, one `SCOPE TOKEN` per line (`#` comments);
    /// tokens are kept only as hashes. `BATON_TOKENS` (same lines) adds to
    /// it.
    #[arg(long, value_name = "FILE")]
    pub tokens: Option<PathBuf>,
    /// The most trees driven at once.
    #[arg(long, value_name = "N", default_value_t = 64)]
    pub max_running: usize,
    /// How long a shutdown waits for dispatches in flight to settle.
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = humantime::parse_duration)]
    pub grace: Duration,
    /// The lease time-to-live: how long after an engine dies another takes
    /// its trees over (the takeover loop scans every half of it).
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = humantime::parse_duration)]
    pub lease_ttl: Duration,
}

fn failed(error: &ServeError) -> CliError {
    CliError::host(error.code(), error.to_string())
}

/// Runs the host until SIGINT or SIGTERM, then shuts it down gracefully.
pub(crate) async fn serve(context: &Context, args: ServeArgs) -> Result<(), CliError> {
    let mut tokens = Tokens::new();
    if let Some(file) = &args.tokens {
        tokens
            .extend_from_file(file)
            .map_err(|error| CliError::host(error.code(), error.to_string()))?;
    }
    if std::env::var_os("BATON_TOKENS").is_some() {
        tokens
            .extend_from_env("BATON_TOKENS")
            .map_err(|error| CliError::host(error.code(), error.to_string()))?;
    }
    if args.listen.is_some() && tokens.is_empty() {
        return Err(CliError::argument(
            "--listen needs API tokens, or the API would refuse every request: pass --tokens FILE (lines `SCOPE TOKEN`, tokens of at least 16 characters) or set BATON_TOKENS",
        ));
    }
    // The tokens are checked before the store is opened (or created).
    let store = context.open_or_create_store()?;
    let engine = EngineConfig {
        programs: context.registry().programs().to_vec(),
        limits: context.registry().limits().clone(),
        lease_ttl: args.lease_ttl,
        ..EngineConfig::new(store.shared())
    };
    let config = ServeConfig {
        listen: args.listen,
        tokens,
        max_running: args.max_running,
        grace: args.grace,
        wake: store.wake().await,
        ..ServeConfig::new(engine)
    };
    let server = Server::bind(config).await.map_err(|error| failed(&error))?;
    if let Some(addr) = server.local_addr() {
        eprintln!("serving the HTTP API on http://{addr} (GET /openapi.json describes it)");
    }
    let handle = server.handle();
    let announce = tokio::spawn(async move {
        handle.ready().await;
        eprintln!("ready: unfinished trees recovered; SIGINT or SIGTERM shuts down gracefully");
    });
    let stopped = async {
        let signal = match context.interrupted().await {
            Stop::Terminate => "SIGTERM",
            _ => "SIGINT",
        };
        eprintln!(
            "{signal}: shutting down (dispatches in flight may settle for up to {})",
            humantime::format_duration(args.grace)
        );
    };
    let served = server.run(stopped).await;
    announce.abort();
    served.map_err(|error| failed(&error))?;
    eprintln!("stopped: every lease this host held is released");
    Ok(())
}
