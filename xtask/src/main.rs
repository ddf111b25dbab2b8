//! Project automation for the Baton workspace, run as `cargo xtask <command>`.
//!
//! `cargo xtask ci` is the single definition of CI: it runs every check the project has, in
//! order, and summarizes the failures. `cargo xtask tidy` runs only the architecture and hygiene
//! checks of [`tidy`], which plain `cargo test` also enforces through a test in that module.
//! `cargo xtask bench` runs the benchmark workloads (`baton-bench`) in release mode;
//! `cargo xtask fuzz` and `cargo xtask soak` run the fuzz tests and the SIGKILL tests long.
//! See `docs/development.md` for what each step does and `docs/performance.md` for the bench.

mod ci;
mod readme;
mod tidy;

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

use anyhow::{Context, Result, bail};

/// Help text printed for `cargo xtask help` and after a usage error.
const USAGE: &str = "\
usage: cargo xtask <command>

commands:
  ci [STEP...]   run the CI steps (all of them when none is named), in order:
                 fmt, clippy, test, doctest, rustdoc, tidy, readme
  tidy           run the tidy checks (dependency edges, crate docs, ignored tests, manifests)
  bench [ARG...] run the benchmark workloads in release mode, passing ARGs to baton-bench
                 (`cargo xtask bench -- --help` lists them)
  fuzz [CASES]   run every fuzz test (`fuzz_*`) in release mode with CASES inputs per
                 decoder (default 1000000; the normal test run uses a few hundred)
  soak [ROUNDS]  run the SIGKILL tests in release mode with ROUNDS rounds of kills each
                 (default 84, about 1000 kills of the kernel's test; the test run uses 1)
  help           print this text";

fn main() -> ExitCode {
    match run() {
        Ok(code) => code,
        Err(error) => {
            eprintln!("error: {error:#}");
            ExitCode::FAILURE
        }
    }
}

/// Dispatches the command line to a command.
fn run() -> Result<ExitCode> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some((command, rest)) = args.split_first() else {
        println!("{USAGE}");
        return Ok(ExitCode::FAILURE);
    };
    match command.as_str() {
        "ci" => ci::run(&workspace_root()?, rest),
        "tidy" => {
            if !rest.is_empty() {
                bail!("`tidy` takes no arguments\n\n{USAGE}");
            }
            tidy_command(&workspace_root()?)
        }
        "bench" => bench_command(&workspace_root()?, rest),
        "fuzz" => long_tests(
            &workspace_root()?,
            LongTests {
                filter: "test(/fuzz_/)",
                variable: "BATON_FUZZ_CASES",
                default: "1000000",
            },
            rest,
        ),
        "soak" => long_tests(
            &workspace_root()?,
            LongTests {
                filter: "test(/sigkill/)",
                variable: "BATON_SOAK_ROUNDS",
                default: "84",
            },
            rest,
        ),
        "help" | "-h" | "--help" => {
            println!("{USAGE}");
            Ok(ExitCode::SUCCESS)
        }
        other => bail!("unknown command `{other}`\n\n{USAGE}"),
    }
}

/// Runs the tidy checks and prints every violation.
fn tidy_command(root: &Path) -> Result<ExitCode> {
    let violations = tidy::run(root)?;
    if violations.is_empty() {
        println!("tidy: ok");
        return Ok(ExitCode::SUCCESS);
    }
    for violation in &violations {
        println!("{violation}");
    }
    println!("tidy: {} violation(s)", violations.len());
    Ok(ExitCode::FAILURE)
}

/// Runs `cargo run --release --locked -p baton-bench -- ARGS` and passes its exit status on.
fn bench_command(root: &Path, args: &[String]) -> Result<ExitCode> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| OsString::from("cargo"));
    // A leading `--` only separates xtask's arguments from the bench's.
    let args = args.strip_prefix(&["--".to_owned()]).unwrap_or(args);
    let status = Command::new(&cargo)
        .current_dir(root)
        .args(["run", "--release", "--locked", "-p", "baton-bench", "--"])
        .args(args)
        .status()
        .with_context(|| format!("failed to run `{} run`", cargo.to_string_lossy()))?;
    Ok(if status.success() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// A set of tests run long: the tests a filter selects, with their size in
/// an environment variable.
struct LongTests {
    /// The nextest filter expression selecting the tests.
    filter: &'static str,
    /// The variable the tests read their size from.
    variable: &'static str,
    /// The size when none is given.
    default: &'static str,
}

/// Runs `cargo nextest run --release --workspace -E FILTER` with the size
/// set (the only argument, else the default), and passes its status on.
fn long_tests(root: &Path, tests: LongTests, args: &[String]) -> Result<ExitCode> {
    let size = match args {
        [] => tests.default.to_owned(),
        [size] if size.parse::<u64>().is_ok_and(|n| n > 0) => size.clone(),
        _ => bail!("expected one positive number at most\n\n{USAGE}"),
    };
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| OsString::from("cargo"));
    println!("running {} with {}={size}", tests.filter, tests.variable);
    let status = Command::new(&cargo)
        .current_dir(root)
        .args([
            "nextest",
            "run",
            "--release",
            "--locked",
            "--profile",
            "long",
            "--workspace",
            "--no-fail-fast",
            "--success-output",
            "final",
            "-E",
            tests.filter,
        ])
        .env(tests.variable, &size)
        .status()
        .with_context(|| format!("failed to run `{} nextest`", cargo.to_string_lossy()))?;
    Ok(if status.success() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// The workspace root: the parent of this crate's manifest directory.
///
/// The path is fixed at compile time, which is exactly right for a binary that only ever runs
/// through `cargo xtask` from its own checkout.
pub fn workspace_root() -> Result<PathBuf> {
    let manifest_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let root = manifest_dir.parent().with_context(|| {
        format!(
            "xtask manifest dir {} has no parent",
            manifest_dir.display()
        )
    })?;
    let manifest = root.join("Cargo.toml");
    if !manifest.is_file() {
        bail!(
            "expected the workspace manifest at {}, but it is missing",
            manifest.display()
        );
    }
    Ok(root.to_path_buf())
}
