//! The subcommands, and [`run`], which carries one out.

use std::collections::BTreeMap;

use baton::run::store::{ListCursor, ListFilter, TreeStatus};
use baton::run::{
    EffectId, Engine, Labels, Name, Payload, ProcessId, RecoverOptions, Scope, Settlement,
    SignalError, SignalReceipt, StartId, StartRequest, Started, TreeView, Visibility, WaitId,
};
use clap::{Subcommand, ValueEnum};

use crate::context::{Context, DriveArgs, WaitArgs};
use crate::drive::settle;
use crate::error::{CliError, Explain};
use crate::follow::{Follow, WatchView};
use crate::registry::LostEffect;
use crate::{emit, render};

/// The subcommands of the command line. A host that adds its own flattens
/// this enum into its subcommand enum (`#[command(flatten)]`) and hands
/// these to [`run`].
#[derive(Debug, Subcommand)]
#[non_exhaustive]
pub enum Command {
    /// Start a program as a new tree and drive it until it waits or ends.
    Start {
        /// The program's name (`programs` lists them); its newest version
        /// starts.
        program: String,
        /// The input as JSON (a JSON string needs its quotes: '"text"').
        input: String,
        /// The start id's key: starting the same id again returns the same
        /// tree (default: a random one).
        #[arg(long, value_name = "START_ID")]
        id: Option<String>,
        /// A label the tree carries (`ps --label` finds it); repeatable.
        #[arg(long = "label", value_name = "KEY=VALUE")]
        labels: Vec<String>,
        /// How the command drives the tree.
        #[command(flatten)]
        drive: DriveArgs,
    },
    /// List the programs this command line can start and take up.
    Programs,
    /// List trees.
    Ps {
        /// Only trees with this status.
        #[arg(long, value_enum)]
        status: Option<StatusFilter>,
        /// Only trees of this tenant scope (default: every scope).
        #[arg(long = "tenant")]
        tenant: Option<String>,
        /// Only trees carrying this label; repeatable (every one must match).
        #[arg(long = "label", value_name = "KEY=VALUE")]
        labels: Vec<String>,
        /// At most this many trees; the next page's command is printed on
        /// stderr.
        #[arg(long, value_name = "N")]
        limit: Option<std::num::NonZeroU32>,
        /// The page after this cursor (printed with the previous page).
        #[arg(long, value_name = "CURSOR")]
        after: Option<String>,
    },
    /// Show a tree: processes, statuses, budgets, open waits, unknown effects.
    Inspect {
        /// The tree (its root process id, `p_…`).
        id: String,
        /// Show usage by agent instead: what each process used (steps,
        /// effects, signals and meters such as tokens and cost), itself
        /// and with its subtree, and the totals by program.
        #[arg(long)]
        usage: bool,
    },
    /// Print a tree's log.
    Log {
        /// The tree.
        id: String,
        /// Recompute the hash chain and report the first bad record.
        #[arg(long)]
        verify: bool,
    },
    /// Follow a tree's events: its committed facts from the log, then
    /// each new one as it is committed; ends when the tree has finished.
    Watch {
        /// The tree.
        id: String,
        /// Start at this log sequence (resume after the last one you saw
        /// plus one; default: from the first).
        #[arg(long, value_name = "SEQ", default_value_t = 1)]
        from: u64,
        /// `events` (every event) or `agents` (the agent stream view:
        /// agents, their tokens, tool calls and handoffs, one terminal event).
        #[arg(long, value_enum, default_value_t = WatchView::Events)]
        view: WatchView,
    },
    /// Answer an open wait and drive the tree until it waits or ends.
    Answer {
        /// The tree.
        id: String,
        /// The wait to answer (`w_…`).
        #[arg(long)]
        wait: String,
        /// The answer as JSON (a JSON string needs its quotes: '"ship it"').
        json_answer: String,
        /// How the command drives the tree.
        #[command(flatten)]
        drive: DriveArgs,
    },
    /// Cancel a tree and drive it until it settles.
    Cancel {
        /// The tree.
        id: String,
        /// Why.
        #[arg(long, default_value = "canceled from the command line")]
        reason: String,
        /// How the command drives the tree.
        #[command(flatten)]
        drive: DriveArgs,
    },
    /// Resolve an unknown effect with its real outcome and drive the tree.
    Resolve {
        /// The tree.
        id: String,
        /// The unknown effect (`e_…`).
        #[arg(long)]
        effect: String,
        /// The effect's output as JSON (a success).
        json_output: String,
        /// How the command drives the tree.
        #[command(flatten)]
        drive: DriveArgs,
    },
    /// Reopen every unfinished tree and drive each until it waits or ends.
    Recover {
        /// Take trees over even from a live writer (fencing it).
        #[arg(long)]
        force: bool,
        /// How long it waits.
        #[command(flatten)]
        wait: WaitArgs,
    },
    /// Print a completion script for a shell (`source <(baton completions bash)`).
    Completions {
        /// The shell.
        shell: clap_complete::Shell,
    },
    /// Run a worker host: recover the store's unfinished trees, take over
    /// those of engines that died, and (with --listen) serve the HTTP API,
    /// until SIGINT or SIGTERM.
    Serve(crate::serve::ServeArgs),
}

/// A tree status, as `ps --status` takes it.
#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum StatusFilter {
    /// Some process is stepping or has work in flight.
    Running,
    /// Every live process waits for an answer.
    Waiting,
    /// Some process holds an unknown effect.
    NeedsAttention,
    /// The root ended.
    Done,
}

impl From<StatusFilter> for TreeStatus {
    fn from(filter: StatusFilter) -> TreeStatus {
        match filter {
            StatusFilter::Running => TreeStatus::Running,
            StatusFilter::Waiting => TreeStatus::Waiting,
            StatusFilter::NeedsAttention => TreeStatus::NeedsAttention,
            StatusFilter::Done => TreeStatus::Done,
        }
    }
}

/// Carries out one subcommand.
pub async fn run(context: &Context, command: Command) -> Result<(), CliError> {
    match command {
        Command::Start {
            program,
            input,
            id,
            labels,
            drive,
        } => start(context, &program, &input, id, &labels, drive).await,
        Command::Serve(args) => crate::serve::serve(context, args).await,
        Command::Programs => {
            emit(&render::programs(
                context.registry().programs(),
                context.json(),
            ));
            Ok(())
        }
        Command::Ps {
            status,
            tenant,
            labels,
            limit,
            after,
        } => {
            let page = Page {
                labels,
                limit,
                after,
            };
            ps(context, status, tenant, page).await
        }
        Command::Inspect { id, usage } => {
            let store = context.open_store()?;
            let engine = context.engine(store.shared())?;
            let view = engine
                .inspect(context.scope(), tree_id(&id)?, Visibility::Public)
                .await
                .map_err(|error| error.explain(context.bin()))?;
            if usage {
                emit(&render::usage(&view.usage(), context.json()));
            } else {
                emit(&render::tree(&view, context.json(), context.bin()));
            }
            Ok(())
        }
        Command::Log { id, verify } => log(context, &id, verify).await,
        Command::Watch { id, from, view } => watch(context, &id, from, view).await,
        Command::Answer {
            id,
            wait,
            json_answer,
            drive,
        } => answer(context, &id, &wait, &json_answer, drive).await,
        Command::Cancel { id, reason, drive } => cancel(context, &id, reason, drive).await,
        Command::Resolve {
            id,
            effect,
            json_output,
            drive,
        } => resolve(context, &id, &effect, &json_output, drive).await,
        Command::Recover { force, wait } => recover(context, force, wait).await,
        Command::Completions { shell } => {
            let mut interface = context.interface().clone();
            let mut script = Vec::new();
            clap_complete::generate(shell, &mut interface, context.bin(), &mut script);
            emit(&String::from_utf8_lossy(&script));
            Ok(())
        }
    }
}

fn tree_id(text: &str) -> Result<ProcessId, CliError> {
    text.parse().map_err(|error| {
        CliError::argument(format!(
            "{text:?} is not a tree id (expected p_ and 32 hex digits): {error}"
        ))
    })
}

fn json(text: &str, what: &str) -> Result<Payload, CliError> {
    Payload::parse_str(text).map_err(|error| {
        let hint = quoting_hint(text);
        CliError::argument(format!("{what} is not valid JSON: {error}{hint}"))
    })
}

/// What to do when refused text looks like a string whose quotes the
/// shell removed: a JSON string keeps its double quotes only when the
/// whole argument is quoted for the shell. Empty for text that starts like
/// another JSON value (an object, an array, a number, a string), whose
/// error says where it went wrong.
fn quoting_hint(text: &str) -> String {
    let trimmed = text.trim();
    let Some(first) = trimmed.chars().next() else {
        return r#"; give a JSON value, for example '"ship it"' (a string keeps its quotes)"#
            .to_owned();
    };
    if matches!(first, '{' | '[' | '"' | '-' | '0'..='9') {
        return String::new();
    }
    let quoted = serde_json::to_string(text).expect("a string is JSON");
    if quoted.contains('\'') {
        "; to pass it as a JSON string, write it in double quotes and quote the argument for the shell".to_owned()
    } else {
        format!("; to pass it as a JSON string, keep its quotes: '{quoted}'")
    }
}

/// A start key no earlier start used: 128 random bits.
fn random_key() -> Result<String, CliError> {
    let mut bytes = [0_u8; 16];
    getrandom::fill(&mut bytes).map_err(|error| {
        CliError::host(
            "cli.random.unavailable",
            format!("cannot draw a random start id: {error}"),
        )
    })?;
    Ok(bytes.iter().fold(String::from("cli-"), |mut key, byte| {
        key.push_str(&format!("{byte:02x}"));
        key
    }))
}

async fn start(
    context: &Context,
    program: &str,
    input: &str,
    id: Option<String>,
    labels: &[String],
    drive: DriveArgs,
) -> Result<(), CliError> {
    let bin = context.bin();
    let labels = Labels::parse_pairs(labels)
        .map_err(|error| CliError::argument(format!("invalid --label: {error}")))?;
    let name = Name::new(program).map_err(|error| {
        CliError::argument(format!("{program:?} is not a program name: {error}"))
    })?;
    let input = json(input, "the input")?;
    let key = match id {
        Some(key) => key,
        None => random_key()?,
    };
    let id = StartId::new(context.scope().as_str(), &key)
        .map_err(|error| CliError::argument(format!("invalid --id {key:?}: {error}")))?;
    let store = context.open_or_create_store()?;
    let engine = context.engine(store.shared())?;
    let scope = context.scope().clone();
    let tree = ProcessId::root(&id);
    let view = context
        .drive(engine, drive.wait, format!("tree {tree}"), async |engine| {
            let started = engine
                .start_named(
                    &name,
                    StartRequest {
                        labels,
                        ..StartRequest::new(id, input)
                    },
                )
                .await
                .map_err(|error| error.explain(bin))?;
            if matches!(started, Started::Existing(_)) && !context.json() {
                emitln!("(start id {key} names an existing tree: {tree})");
            }
            // The handle stays held while the tree is driven, so the engine
            // keeps the tree in memory instead of loading it again.
            let view = finish(engine, &scope, tree, drive, bin).await;
            drop(started);
            view
        })
        .await?;
    print_outcome(context, &view, drive);
    Ok(())
}

/// Drives `tree` until it settles, or, detached, reads what was committed.
async fn finish(
    engine: &Engine,
    scope: &Scope,
    tree: ProcessId,
    drive: DriveArgs,
    bin: &str,
) -> Result<TreeView, CliError> {
    if drive.detach {
        return engine
            .inspect(scope, tree, Visibility::Public)
            .await
            .map_err(|error| error.explain(bin));
    }
    settle(engine, scope, tree, bin).await
}

fn print_outcome(context: &Context, view: &TreeView, drive: DriveArgs) {
    if drive.detach && !context.json() {
        emitln!(
            "tree {} is {} (detached: `{} recover` or a worker drives it on)",
            view.tree,
            view.status,
            context.bin()
        );
        return;
    }
    emit(&render::outcome(view, context.json(), context.bin()));
}

/// `ps`'s label filter and page bounds.
struct Page {
    labels: Vec<String>,
    limit: Option<std::num::NonZeroU32>,
    after: Option<String>,
}

async fn ps(
    context: &Context,
    status: Option<StatusFilter>,
    tenant: Option<String>,
    page: Page,
) -> Result<(), CliError> {
    let labels = Labels::parse_pairs(&page.labels)
        .map_err(|error| CliError::argument(format!("invalid --label: {error}")))?;
    let after = page
        .after
        .as_deref()
        .map(str::parse::<ListCursor>)
        .transpose()
        .map_err(|error| CliError::argument(format!("invalid --after: {error}")))?;
    let store = context.open_store()?;
    let filter = ListFilter {
        status: status.map(TreeStatus::from),
        scope: tenant
            .map(|tenant| {
                Scope::new(&tenant)
                    .map_err(|error| CliError::argument(format!("invalid --tenant: {error}")))
            })
            .transpose()?,
        labels,
        limit: page.limit,
        after,
    };
    let listing = store
        .shared()
        .list(filter)
        .await
        .map_err(|error| error.explain(context.bin()))?;
    for row in &listing.unreadable {
        eprintln!(
            "warning: tree row {} does not read back: {}",
            row.id, row.error
        );
    }
    emit(&render::ps(&listing.trees, context.json()));
    if let Some(next) = listing.next {
        eprintln!(
            "more trees follow: `{} ps --after {next}` (with the same filters) lists the next page",
            context.bin()
        );
    }
    Ok(())
}

async fn log(context: &Context, id: &str, verify: bool) -> Result<(), CliError> {
    let bin = context.bin();
    let store = context.open_store()?;
    let tree = tree_id(id)?;
    let engine = context.engine(store.shared())?;
    // Scope check (and existence) before printing anything; a verification
    // reports damage with its record number.
    let checked = if verify {
        Some(
            engine
                .verify(context.scope(), tree)
                .await
                .map_err(|error| error.explain(bin))?,
        )
    } else {
        engine
            .inspect(context.scope(), tree, Visibility::Public)
            .await
            .map_err(|error| error.explain(bin))?;
        None
    };
    let records = store
        .records(tree)
        .await
        .map_err(|error| error.explain(bin))?;
    emit(&render::log(&records, context.json()));
    if let Some(checked) = checked {
        emitln!("{}", render::verification(&checked, context.json()));
    }
    Ok(())
}

async fn watch(context: &Context, id: &str, from: u64, view: WatchView) -> Result<(), CliError> {
    let bin = context.bin();
    let tree = tree_id(id)?;
    let store = context.open_store()?;
    let engine = context.engine(store.shared())?;
    let mut events = engine
        .watch(context.scope(), tree, from)
        .await
        .map_err(|error| error.explain(bin))?;
    let mut follow = Follow::new(context.json(), view);
    // Following a tree changes nothing, so a signal just ends the stream.
    let stopped = context.interrupted();
    tokio::pin!(stopped);
    loop {
        let next = tokio::select! {
            next = events.next() => next,
            _ = &mut stopped => {
                follow.finish(None);
                return Ok(());
            }
        };
        match next {
            Some(Ok(event)) => follow.event(&event),
            Some(Err(error)) => {
                follow.finish(None);
                return Err(error.explain(bin));
            }
            None => break,
        }
    }
    let usage = engine
        .inspect(context.scope(), tree, Visibility::Public)
        .await
        .ok()
        .map(|view| view.usage().total);
    follow.finish(usage.as_ref());
    Ok(())
}

async fn answer(
    context: &Context,
    id: &str,
    wait: &str,
    answer: &str,
    drive: DriveArgs,
) -> Result<(), CliError> {
    let bin = context.bin();
    let tree = tree_id(id)?;
    let wait: WaitId = wait
        .parse()
        .map_err(|error| CliError::argument(format!("{wait:?} is not a wait id: {error}")))?;
    let payload = json(answer, "the answer")?;
    let store = context.open_store()?;
    let engine = context.engine(store.shared())?;
    let scope = context.scope().clone();
    let view = context
        .drive(engine, drive.wait, format!("tree {tree}"), async |engine| {
            // The engine routes the answer to the process that opened the
            // wait; its signal id is derived from the wait, so answering
            // twice delivers one answer.
            let receipt = match engine.answer(&scope, tree, wait, payload).await {
                Ok(receipt) => receipt,
                Err(SignalError::WaitClosed { .. } | SignalError::Conflict { .. }) => {
                    return Err(CliError::engine(
                        "engine.signal.wait_closed",
                        format!(
                            "wait {wait} of tree {tree} was already answered with another answer"
                        ),
                        Some(format!("`{bin} inspect {tree}` shows its open waits")),
                    ));
                }
                Err(SignalError::UnknownWait { .. }) => {
                    return Err(unknown_wait(engine, &scope, tree, wait, bin).await);
                }
                Err(error @ SignalError::Rejected(_)) => {
                    let hint = format!(
                        "nothing was written; the wait's answer schema is its `answer_schema` in `{bin} inspect {tree} --json`"
                    );
                    return Err(CliError::engine(error.code(), &error, Some(hint)));
                }
                Err(error) => return Err(error.explain(bin)),
            };
            if receipt == SignalReceipt::Duplicate && !context.json() {
                emitln!("(this answer was already delivered)");
            }
            finish(engine, &scope, tree, drive, bin).await
        })
        .await?;
    print_outcome(context, &view, drive);
    Ok(())
}

/// The error for a wait the tree never opened, listing the waits it has open.
async fn unknown_wait(
    engine: &Engine,
    scope: &Scope,
    tree: ProcessId,
    wait: WaitId,
    bin: &str,
) -> CliError {
    let open: Vec<String> = match engine.inspect(scope, tree, Visibility::Public).await {
        Ok(view) => view
            .processes
            .iter()
            .flat_map(|process| process.open_waits.iter())
            .map(|open| format!("{} (key {})", open.id, open.key))
            .collect(),
        Err(error) => return error.explain(bin),
    };
    let hint = match open.as_slice() {
        [] => format!("it has no open wait now (`{bin} inspect {tree}` shows why)"),
        [only] => format!(
            "its open wait is {only}: `{bin} answer {tree} --wait {} JSON`",
            only.split(' ').next().unwrap_or_default()
        ),
        many => format!("its open waits are {}", many.join(", ")),
    };
    CliError::engine(
        "engine.signal.unknown_wait",
        format!("tree {tree} has no wait {wait}"),
        Some(hint),
    )
}

async fn cancel(
    context: &Context,
    id: &str,
    reason: String,
    drive: DriveArgs,
) -> Result<(), CliError> {
    let bin = context.bin();
    let tree = tree_id(id)?;
    let store = context.open_store()?;
    let engine = context.engine(store.shared())?;
    let scope = context.scope().clone();
    let view = context
        .drive(engine, drive.wait, format!("tree {tree}"), async |engine| {
            // Through the tree's inbox when another engine (a `serve`)
            // holds it.
            engine
                .cancel(&scope, tree, tree, reason)
                .await
                .map_err(|error| {
                    let hint = matches!(error, baton::run::ControlError::Terminated { .. })
                        .then(|| format!("the tree has ended: `{bin} inspect {tree}` shows how"));
                    match hint {
                        Some(hint) => CliError::engine(error.code(), &error, Some(hint)),
                        None => error.explain(bin),
                    }
                })?;
            finish(engine, &scope, tree, drive, bin).await
        })
        .await?;
    if drive.detach && !context.json() {
        print_outcome(context, &view, drive);
    } else {
        emit(&render::tree(&view, context.json(), bin));
    }
    Ok(())
}

async fn resolve(
    context: &Context,
    id: &str,
    effect: &str,
    output: &str,
    drive: DriveArgs,
) -> Result<(), CliError> {
    let bin = context.bin();
    let tree = tree_id(id)?;
    let effect: EffectId = effect
        .parse()
        .map_err(|error| CliError::argument(format!("{effect:?} is not an effect id: {error}")))?;
    let output = json(output, "the output")?;
    let store = context.open_store()?;
    let engine = context.engine(store.shared())?;
    let scope = context.scope().clone();
    let view = context
        .drive(engine, drive.wait, format!("tree {tree}"), async |engine| {
            if let Err(error) = engine
                .resolve_unknown(&scope, tree, effect, Settlement::ok(output))
                .await
            {
                let hint = match &error {
                    baton::run::ControlError::NotUnknown { .. } => {
                        Some(unknown_effects(engine, &scope, tree, bin).await)
                    }
                    _ => error.hint(bin),
                };
                return Err(CliError::engine(error.code(), &error, hint));
            }
            finish(engine, &scope, tree, drive, bin).await
        })
        .await?;
    if drive.detach && !context.json() {
        print_outcome(context, &view, drive);
    } else {
        emit(&render::tree(&view, context.json(), bin));
    }
    Ok(())
}

/// Which effects of the tree are unknown, for an error about another one.
async fn unknown_effects(engine: &Engine, scope: &Scope, tree: ProcessId, bin: &str) -> String {
    let Ok(view) = engine.inspect(scope, tree, Visibility::Public).await else {
        return format!("`{bin} inspect {tree}` lists its unknown effects");
    };
    let unknown: Vec<String> = view
        .processes
        .iter()
        .flat_map(|process| process.unknown_effects.iter())
        .map(ToString::to_string)
        .collect();
    match unknown.as_slice() {
        [] => format!("tree {tree} has no unknown effect (it is {})", view.status),
        [only] => {
            format!("its unknown effect is {only}: `{bin} resolve {tree} --effect {only} JSON`")
        }
        many => format!("its unknown effects are {}", many.join(", ")),
    }
}

async fn recover(context: &Context, force: bool, wait: WaitArgs) -> Result<(), CliError> {
    let bin = context.bin();
    let json = context.json();
    let store = context.open_store()?;
    let scopes: BTreeMap<ProcessId, Scope> = store
        .shared()
        .list(ListFilter::default())
        .await
        .map_err(|error| error.explain(bin))?
        .trees
        .into_iter()
        .map(|meta| (meta.tree, meta.scope))
        .collect();
    let engine = context.engine(store.shared())?;
    let failures = context
        .drive(engine, wait, "the recovery", async |engine| {
            let report = engine
                .recover(RecoverOptions { force, scope: None })
                .await
                .map_err(|error| error.explain(bin))?;
            if report.is_empty() && !json {
                emitln!("nothing to recover: every tree in the store has finished");
            }
            let mut failures = 0;
            for (index, (tree, result)) in report.iter().enumerate() {
                if !json {
                    eprintln!("[{}/{}] {tree}", index + 1, report.len());
                }
                let recovered = match result {
                    Ok(()) => match scopes.get(tree) {
                        Some(scope) => recovered(context, engine, scope, *tree).await,
                        None => Err(CliError::engine(
                            "engine.tree.not_found",
                            format!("tree {tree} was recovered but is not listed"),
                            None,
                        )),
                    },
                    Err(error) => Err(error.explain(bin)),
                };
                if let Err(error) = recovered {
                    failures += 1;
                    if json {
                        emitln!(
                            "{}",
                            serde_json::json!({ "tree": tree.to_string(), "error": error.to_string(), "code": error.code() })
                        );
                    } else {
                        emitln!("{tree}  not recovered: {error}");
                    }
                }
            }
            Ok((failures, report.len()))
        })
        .await?;
    match failures {
        (0, _) => Ok(()),
        (failed, of) => Err(CliError::engine(
            "cli.recover.incomplete",
            format!("{failed} of {of} trees could not be recovered"),
            None,
        )),
    }
}

/// Drives one recovered tree until it settles, lets the host's hooks settle
/// the effects the crash left unknown, and prints the tree's line.
async fn recovered(
    context: &Context,
    engine: &Engine,
    scope: &Scope,
    tree: ProcessId,
) -> Result<(), CliError> {
    let bin = context.bin();
    let mut view = settle(engine, scope, tree, bin).await?;
    let mut notes = Vec::new();
    if let Some(hooks) = context.registry().hooks()
        && view
            .processes
            .iter()
            .any(|process| !process.unknown_effects.is_empty())
    {
        let private = engine
            .inspect(scope, tree, Visibility::Private)
            .await
            .map_err(|error| error.explain(bin))?;
        for process in &private.processes {
            for effect in &process.unknown_effects {
                let request = process
                    .effects
                    .iter()
                    .find(|known| known.id == *effect)
                    .and_then(|known| known.request.as_ref());
                let lost = LostEffect {
                    tree: &private,
                    process,
                    effect: *effect,
                    request,
                };
                let Some(resolution) = hooks.resolve_lost(&lost) else {
                    continue;
                };
                engine
                    .resolve_unknown(scope, tree, *effect, resolution.settlement)
                    .await
                    .map_err(|error| error.explain(bin))?;
                notes.push(format!("resolved {effect}, {}", resolution.note));
            }
        }
        if !notes.is_empty() {
            view = settle(engine, scope, tree, bin).await?;
        }
    }
    emit(&render::recovered(&view, context.json()));
    if !context.json() {
        for note in &notes {
            emitln!("  {note}");
        }
        if let Some(line) = context
            .registry()
            .hooks()
            .and_then(|hooks| hooks.describe(&view))
        {
            emitln!("  {line}");
        }
    }
    Ok(())
}
