//! `baton`: the command line over the demo programs, plus `baton demo`.
//!
//! This is `baton_cli` as a host uses it: a registry of programs (here the
//! worked example, the pause scenario and the strategy demos) and the
//! shared subcommands, with one subcommand of its own flattened beside
//! them. Errors are one line on stderr and a non-zero exit code; `--json`
//! prints machine-readable output instead of tables.

mod demo;

use std::process::ExitCode;

use baton_cli::{Context, Global, Registry};
use clap::{CommandFactory, Parser, Subcommand};

use crate::demo::{DemoArgs, DemoHooks};

/// The process allocator: mimalloc keeps freed memory for reuse, where
/// glibc hands a large state's blocks back to the system and faults them in
/// again at the next step (feature `mimalloc`, on by default).
#[cfg(feature = "mimalloc")]
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Durable, budgeted, decision-driven multi-agent work: the demos, and
/// operations on the trees of a store.
#[derive(Debug, Parser)]
#[command(name = "baton", version)]
struct Cli {
    #[command(flatten)]
    global: Global,
    #[command(subcommand)]
    command: BatonCommand,
}

#[derive(Debug, Subcommand)]
enum BatonCommand {
    /// Run the worked example: a team whose coordinator continues while an
    /// input gate is pending, then reviews the task. With a scenario, run
    /// that team strategy on scripted models and print its result line.
    Demo(DemoArgs),
    #[command(flatten)]
    Shared(baton_cli::Command),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let registry = match registry() {
        Ok(registry) => registry,
        Err(error) => {
            eprintln!("error: {error:#}");
            return ExitCode::FAILURE;
        }
    };
    baton_cli::execute(
        registry,
        cli.global,
        Cli::command(),
        async |context: &Context| match cli.command {
            BatonCommand::Demo(args) => demo::run(context, args).await,
            BatonCommand::Shared(command) => baton_cli::run(context, command).await,
        },
    )
}

/// The demo programs, in scope `demo`, with the hooks that settle the
/// strategy demos' lost model calls and print their result lines.
fn registry() -> anyhow::Result<Registry> {
    Ok(Registry::builder()
        .programs(&demo::programs()?)
        .limits(demo::limits())
        .default_scope(demo::SCOPE)
        .hooks(DemoHooks)
        .build()?)
}
