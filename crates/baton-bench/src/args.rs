//! The command line: the usage text, the parsed [`Options`] with their
//! defaults, and the work per run each workload's size option sets.

use std::path::PathBuf;

use anyhow::{Context, Result, bail};

use baton::store::sqlite::{CommitOn, PageSize};

use crate::store::StoreKind;
use crate::workloads::state::STATE_STAGES;
use crate::workloads::team::{TEAM_BATCH, TEAM_ROUNDS};
use crate::workloads::{SMALL_RUNS, Workload};

/// Help text, printed for `--help` and after a usage error.
pub const USAGE: &str = "\
usage: baton-bench [WORKLOAD...] [--store memory|sqlite|postgres[=URL]] [--json] [--runs N]
                   [--clients [N]] [--roots N] [--steps N] [--dispatches N] [--children N]
                   [--resume N] [--idle N] [--page-size BYTES] [--commit-on caller|writer]

workloads (all when none is named):
  chain3      wall time per root of a three-transform workflow (1000 roots per run);
              with --clients N: runs per second of N concurrent hosts, each with an engine
              of its own on the one store, starting roots one after another (100 roots
              per client per run), and the p50 and p99 start-to-output latency
  fanout5     wall time per root that starts five children and joins them (1000 roots per run)
  state-1k    ms per stage of a ten-step chain carrying 1 KB of random state (also: marginal bytes per step)
  state-30k   the same with 30 KB
  state-250k  the same with 250 KB
  step        wall time per step of a root that loops Continue with a counter state
  dispatch    wall time per dispatch to an echo dispatcher (pending + settled + step)
  children    wall time per child lifecycle (start, complete, wait), ten children at a time
  team1000    wall time per worker task of a team running 1000 tasks, 100 at a time (also:
              coordinator turns, and ms to read the finished tree's log back: load, verify, fold)
  resume1000  ms per tree to recover roots parked on an input gate with a fresh engine and answer them all
              (sqlite, postgres: in a separate process)
  idle        resident memory per process waiting on an input gate

options:
  --store S       memory, sqlite, postgres or postgres=URL, comma-separated; repeatable
                  (default: memory,sqlite); postgres runs each run in a database of its own
                  on the server URL names (default postgres://postgres@127.0.0.1:5432/postgres),
                  created and dropped by the bench
  --json          print only the JSON lines, not the table
  --runs N        measured runs per workload and store after one warm-up (default 5)
  --clients [N]   run chain3 as the throughput workload with N concurrent hosts (64 when no
                  number follows); only chain3 runs unless other workloads are named too
  --roots N       roots per chain3 or fanout5 run (default 1000; with --clients, 100 per
                  client), split evenly between the clients
  --steps N       steps per `step` run (default 20000)
  --dispatches N  dispatches per `dispatch` run (default 5000)
  --children N    child lifecycles per `children` run (default 2000)
  --resume N      parked roots per `resume1000` run (default 1000)
  --idle N        waiting roots per `idle` run (default 100000, as W6 asks)
  --page-size B   sqlite: the page size of each new store and of the commit floor's
                  database, 1024 to 65536 (default: a new store's, 4096)
  --commit-on C   sqlite: who commits a short run's one commit, `caller` (the task
                  awaiting it, the default) or `writer` (the store's writer thread,
                  as it commits every other write)

figures beside the headline (JSON fields):
  commit_floor_us  sqlite, postgres: median latency of a one-row durable transaction on a
                   database of the bench's own on the same file system or server, measured in
                   the workload's process just before its measured runs
  floor_ratio      chain3, fanout5: the median per-run time over commit_floor_us (with
                   --clients: p50_us over it)
  paced_commit_us  chain3, fanout5 (one host) on sqlite, postgres: mean latency of the
                   same one-row transaction, each begun after pace_us of CPU work (the
                   median CPU time per run), measured after the measured runs
  state_floor_ms   state-*: median time of one canonical encode plus one blake3 hash of the
                   carried state; state_target_ms = state_floor_ms + 1.3 x commit_floor_us
  restore_floor_ms state-*: median time of one decode of the encoded state as the program
                   restores it (the kernel restores every candidate state before adopting it)
  inspect_ms       team1000: median ms to read the finished tree back from its store (load
                   the log, verify its hash chain, fold every record), after the measured phase";

/// Concurrent hosts of `chain3 --clients` when no number follows.
pub const DEFAULT_CLIENTS: usize = 64;

/// Roots per client and run of `chain3 --clients` when `--roots` is not given.
pub const ROOTS_PER_CLIENT: u64 = 100;

/// The parsed command line.
#[derive(Debug)]
pub struct Options {
    /// The workloads to run, in the order named (all when none is).
    pub workloads: Vec<Workload>,
    /// The stores to run them on, in the order named (both when none is).
    pub stores: Vec<StoreKind>,
    /// Print only the JSON lines, not the table.
    pub json: bool,
    /// Measured runs per workload and store.
    pub runs: usize,
    /// `chain3 --clients`: concurrent hosts (engines on the one store).
    pub clients: Option<usize>,
    /// Roots per `chain3` or `fanout5` run, when given.
    pub roots: Option<u64>,
    /// Steps per `step` run.
    pub steps: u64,
    /// Dispatches per `dispatch` run.
    pub dispatches: u64,
    /// Child lifecycles per `children` run.
    pub children: u64,
    /// Parked roots per `resume1000` run.
    pub resume: usize,
    /// Waiting roots per `idle` run.
    pub idle: usize,
    /// The PostgreSQL server of `--store postgres[=URL]`.
    pub postgres: String,
    /// The page size of new SQLite stores and of the commit floor's
    /// database.
    pub page_size: PageSize,
    /// Who commits SQLite writes (`--commit-on`).
    pub commit_on: CommitOn,
    /// Hidden: run one workload on the one store named in this process and
    /// print its samples.
    pub worker: Option<Workload>,
    /// Hidden, with `--worker`: run once before the measured runs.
    pub warm_up: bool,
    /// Hidden: run the second phase of `resume1000` on this SQLite file and
    /// print its sample.
    pub resume_phase2: Option<PathBuf>,
}

impl Options {
    /// `--commit-on`'s word for [`Options::commit_on`].
    pub fn commit_on_name(&self) -> &'static str {
        match self.commit_on {
            CommitOn::WriterThread => "writer",
            CommitOn::Caller => "caller",
        }
    }

    /// Parses the arguments after the program name; a usage error carries
    /// the usage text.
    pub fn parse(args: &[String]) -> Result<Options> {
        let mut options = Options {
            workloads: Vec::new(),
            stores: Vec::new(),
            json: false,
            runs: 5,
            clients: None,
            roots: None,
            steps: 20_000,
            dispatches: 5_000,
            children: 2_000,
            resume: 1_000,
            idle: 100_000,
            postgres: crate::store::POSTGRES_DEFAULT.to_owned(),
            page_size: PageSize::default(),
            commit_on: CommitOn::default(),
            worker: None,
            warm_up: false,
            resume_phase2: None,
        };
        let mut args = args.iter().peekable();
        while let Some(arg) = args.next() {
            let mut value = |flag: &str, what: &str| -> Result<&String> {
                args.next()
                    .with_context(|| format!("`{flag}` needs {what}\n\n{USAGE}"))
            };
            let number = |flag: &str, value: &str| -> Result<u64> {
                match value.parse::<u64>() {
                    Ok(n) if n > 0 => Ok(n),
                    _ => bail!("`{flag}` needs a positive number, got `{value}`\n\n{USAGE}"),
                }
            };
            match arg.as_str() {
                "--json" => options.json = true,
                "--runs" => options.runs = usize::try_from(number(arg, value(arg, "a number")?)?)?,
                "--clients" => {
                    // The number is optional: a workload or an option may
                    // follow instead.
                    let given = args
                        .next_if(|next| !next.starts_with("--") && Workload::parse(next).is_none());
                    options.clients = Some(match given {
                        None => DEFAULT_CLIENTS,
                        Some(given) => match given.parse::<usize>() {
                            Ok(n) if n > 0 => n,
                            _ => bail!(
                                "`--clients` needs a positive number of concurrent hosts, got `{given}`\n\n{USAGE}"
                            ),
                        },
                    });
                }
                "--roots" => options.roots = Some(number(arg, value(arg, "a number")?)?),
                "--steps" => options.steps = number(arg, value(arg, "a number")?)?,
                "--dispatches" => options.dispatches = number(arg, value(arg, "a number")?)?,
                "--children" => options.children = number(arg, value(arg, "a number")?)?,
                "--resume" => {
                    options.resume = usize::try_from(number(arg, value(arg, "a number")?)?)?;
                }
                "--idle" => options.idle = usize::try_from(number(arg, value(arg, "a number")?)?)?,
                "--page-size" => {
                    let given = value(arg, "a page size")?;
                    options.page_size = given
                        .parse::<u32>()
                        .ok()
                        .and_then(PageSize::from_bytes)
                        .with_context(|| {
                            format!(
                                "`--page-size` needs a power of two from 1024 to 65536, got `{given}`\n\n{USAGE}"
                            )
                        })?;
                }
                "--commit-on" => {
                    options.commit_on = match value(arg, "who commits")?.as_str() {
                        "caller" => CommitOn::Caller,
                        "writer" => CommitOn::WriterThread,
                        other => bail!(
                            "`--commit-on` takes `caller` or `writer`, got `{other}`\n\n{USAGE}"
                        ),
                    };
                }
                "--store" => {
                    for name in value(arg, "a store")?.split(',') {
                        let (store, url) = StoreKind::parse(name.trim()).with_context(|| {
                            format!(
                                "unknown store `{name}` (memory, sqlite, postgres or postgres=URL)\n\n{USAGE}"
                            )
                        })?;
                        if let Some(url) = url {
                            options.postgres = url;
                        }
                        if !options.stores.contains(&store) {
                            options.stores.push(store);
                        }
                    }
                }
                "--warm-up" => options.warm_up = true,
                "--worker" => {
                    let name = value(arg, "a workload")?;
                    options.worker = Some(
                        Workload::parse(name)
                            .with_context(|| format!("unknown workload `{name}`\n\n{USAGE}"))?,
                    );
                }
                "--resume-phase2" => {
                    options.resume_phase2 = Some(PathBuf::from(value(arg, "a database path")?));
                }
                other => match Workload::parse(other) {
                    Some(workload) if !options.workloads.contains(&workload) => {
                        options.workloads.push(workload);
                    }
                    Some(_) => {}
                    None => bail!("unknown argument `{other}`\n\n{USAGE}"),
                },
            }
        }
        if options.clients.is_some() {
            if options.workloads.is_empty() {
                options.workloads = vec![Workload::Chain3];
            } else if !options.workloads.contains(&Workload::Chain3) {
                bail!(
                    "`--clients` applies to `chain3`, which is not among the workloads named\n\n{USAGE}"
                );
            }
        }
        if options.workloads.is_empty() {
            options.workloads = Workload::ALL.to_vec();
        }
        if options.stores.is_empty() {
            options.stores = StoreKind::ALL.to_vec();
        }
        Ok(options)
    }

    /// The work per run: steps, dispatches, tasks, roots or stages.
    pub fn size(&self, workload: Workload) -> u64 {
        match workload {
            Workload::Step => self.steps,
            Workload::Dispatch => self.dispatches,
            Workload::Idle => self.idle as u64,
            Workload::Children => self.children,
            Workload::Team1000 => TEAM_ROUNDS * TEAM_BATCH,
            Workload::Resume1000 => self.resume as u64,
            Workload::Chain3 | Workload::Fanout5 => self.roots(workload),
            Workload::State1k | Workload::State30k | Workload::State250k => STATE_STAGES,
        }
    }

    /// Roots per `chain3` or `fanout5` run: `--roots`, else 1000, or 100
    /// per client for `chain3 --clients`.
    pub fn roots(&self, workload: Workload) -> u64 {
        match (self.roots, self.clients_of(workload)) {
            (Some(roots), _) => roots,
            (None, Some(clients)) => ROOTS_PER_CLIENT.saturating_mul(clients as u64),
            (None, None) => SMALL_RUNS,
        }
    }

    /// The concurrent hosts `workload` runs with: `--clients` for `chain3`,
    /// none for the others.
    pub fn clients_of(&self, workload: Workload) -> Option<usize> {
        self.clients.filter(|_| workload == Workload::Chain3)
    }

    /// The unit of `workload`'s headline figure: runs per second for
    /// `chain3 --clients`, else the workload's own.
    pub fn unit(&self, workload: Workload) -> &'static str {
        if self.clients_of(workload).is_some() {
            "runs/s"
        } else {
            workload.unit()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_parse() {
        let args: Vec<String> = ["idle", "step", "--runs", "3", "--idle", "100", "--json"]
            .map(String::from)
            .to_vec();
        let options = Options::parse(&args).unwrap();
        assert_eq!(options.workloads, [Workload::Idle, Workload::Step]);
        assert_eq!((options.runs, options.idle, options.json), (3, 100, true));
        assert_eq!(options.stores, StoreKind::ALL, "both stores by default");
        assert!(Options::parse(&["nope".to_owned()]).is_err());
        assert!(Options::parse(&["--runs".to_owned(), "0".to_owned()]).is_err());
        assert_eq!(Options::parse(&[]).unwrap().workloads, Workload::ALL);
        let stores = |args: &[&str]| {
            let args: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
            Options::parse(&args).map(|o| o.stores)
        };
        assert_eq!(stores(&["--store", "sqlite"]).unwrap(), [StoreKind::Sqlite]);
        assert_eq!(
            stores(&["--store", "sqlite,memory"]).unwrap(),
            [StoreKind::Sqlite, StoreKind::Memory]
        );
        assert_eq!(
            stores(&[
                "--store", "memory", "--store", "sqlite", "--store", "memory"
            ])
            .unwrap(),
            [StoreKind::Memory, StoreKind::Sqlite]
        );
        assert_eq!(
            stores(&["--store", "postgres"]).unwrap(),
            [StoreKind::Postgres]
        );
        let options = Options::parse(&[
            "--store".to_owned(),
            "sqlite,postgres=postgres://u@h/d".to_owned(),
        ])
        .unwrap();
        assert_eq!(options.stores, [StoreKind::Sqlite, StoreKind::Postgres]);
        assert_eq!(options.postgres, "postgres://u@h/d");
        assert!(stores(&["--store", "postgres="]).is_err());
        assert!(stores(&["--store", "mysql"]).is_err());
        assert!(stores(&["--store"]).is_err());
    }

    fn parse(args: &[&str]) -> Result<Options> {
        let args: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
        Options::parse(&args)
    }

    #[test]
    fn clients_take_an_optional_number_and_turn_chain3_into_the_throughput_workload() {
        let options = parse(&["chain3", "--clients", "8", "--store", "sqlite"]).unwrap();
        assert_eq!(options.clients, Some(8));
        assert_eq!(options.workloads, [Workload::Chain3]);
        assert_eq!(options.clients_of(Workload::Chain3), Some(8));
        assert_eq!(options.unit(Workload::Chain3), "runs/s");
        assert_eq!(options.size(Workload::Chain3), 800, "100 roots per client");
        // With no number, 64; a workload or an option may follow.
        for args in [
            &["chain3", "--clients"][..],
            &["--clients", "chain3"],
            &["--clients", "--runs", "2"],
        ] {
            let options = parse(args).unwrap();
            assert_eq!(options.clients, Some(DEFAULT_CLIENTS), "{args:?}");
            assert_eq!(options.workloads, [Workload::Chain3], "{args:?}");
        }
        // Other workloads named with chain3 run as they would without.
        let options = parse(&["fanout5", "chain3", "--clients", "4", "--roots", "10"]).unwrap();
        assert_eq!(options.workloads, [Workload::Fanout5, Workload::Chain3]);
        assert_eq!(options.clients_of(Workload::Fanout5), None);
        assert_eq!(options.unit(Workload::Fanout5), "us/run");
        assert_eq!(
            (
                options.size(Workload::Chain3),
                options.size(Workload::Fanout5)
            ),
            (10, 10)
        );
        // Without --clients chain3 is unchanged.
        let options = parse(&["chain3"]).unwrap();
        assert_eq!(options.clients_of(Workload::Chain3), None);
        assert_eq!(
            (
                options.unit(Workload::Chain3),
                options.size(Workload::Chain3)
            ),
            ("us/run", 1000)
        );
    }

    #[test]
    fn commit_on_takes_caller_or_writer() {
        assert_eq!(parse(&[]).unwrap().commit_on, CommitOn::Caller);
        let writer = parse(&["chain3", "--commit-on", "writer"]).unwrap();
        assert_eq!(writer.commit_on, CommitOn::WriterThread);
        assert_eq!(writer.commit_on_name(), "writer");
        let error = parse(&["--commit-on", "thread"]).unwrap_err().to_string();
        assert!(
            error.contains("`--commit-on` takes `caller` or `writer`, got `thread`"),
            "{error}"
        );
    }

    #[test]
    fn page_size_takes_the_sizes_sqlite_takes() {
        assert_eq!(parse(&[]).unwrap().page_size, PageSize::Kib4);
        let small = parse(&["chain3", "--page-size", "1024"]).unwrap();
        assert_eq!(small.page_size, PageSize::Kib1);
        for bad in ["512", "1000", "4k", "131072"] {
            let error = parse(&["--page-size", bad]).unwrap_err().to_string();
            assert!(
                error.starts_with(&format!(
                    "`--page-size` needs a power of two from 1024 to 65536, got `{bad}`"
                )),
                "{error}"
            );
        }
    }

    #[test]
    fn clients_refuse_zero_and_words_and_workloads_without_chain3() {
        let zero = parse(&["chain3", "--clients", "0"])
            .unwrap_err()
            .to_string();
        assert!(
            zero.starts_with("`--clients` needs a positive number of concurrent hosts, got `0`"),
            "{zero}"
        );
        for bad in ["-3", "many", "1.5"] {
            let error = parse(&["--clients", bad]).unwrap_err().to_string();
            assert!(error.contains(&format!("got `{bad}`")), "{error}");
        }
        let alone = parse(&["fanout5", "--clients", "4"])
            .unwrap_err()
            .to_string();
        assert!(
            alone.starts_with("`--clients` applies to `chain3`"),
            "{alone}"
        );
        assert!(parse(&["chain3", "--roots", "0"]).is_err());
    }
}
