//! `cargo xtask ci`: every CI step, in order, with a summary.
//!
//! Each step prints a `==> name` header and its wall time. A failing step does not stop the run,
//! so one run reports every failure; the exit code is non-zero when any step failed. The last
//! line of a run that included the `test` step is `tests: N passed, M failed`, which CI reads.

use std::ffi::OsString;
use std::io::{self, Read, Write};
use std::path::Path;
use std::process::{Command, ExitCode, ExitStatus, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};

use crate::tidy;

/// The CI steps, in the order they run.
pub const STEPS: &[&str] = &[
    "fmt", "clippy", "test", "doctest", "rustdoc", "tidy", "readme",
];

/// Optional features that no default build turns on, added to the clippy, test, doctest and
/// rustdoc steps so their code is linted and tested like the rest (baton-agent's `openai` and
/// `anthropic` are on through the facade's defaults; baton-cli's `otel` exporter is not).
const EXTRA_FEATURES: &[&str] = &["--features", "baton-cli/otel"];

/// Property-test case count used by the `test` step unless `PROPTEST_CASES` is already set.
const DEFAULT_PROPTEST_CASES: &str = "64";

/// Outcome of one step, for the summary table.
struct StepOutcome {
    /// Step name from [`STEPS`].
    name: &'static str,
    /// Whether the step succeeded.
    ok: bool,
    /// Wall time the step took.
    elapsed: Duration,
}

/// Test counts read from a test runner's output.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct TestCounts {
    /// Tests that passed.
    pub passed: u64,
    /// Tests that failed (including timed-out tests and tests that could not be executed).
    pub failed: u64,
}

/// Runs the named steps (all of them when `selected` is empty) from the workspace `root`.
pub fn run(root: &Path, selected: &[String]) -> Result<ExitCode> {
    let steps = select_steps(selected)?;
    let mut outcomes = Vec::with_capacity(steps.len());
    let mut test_counts: Option<Option<TestCounts>> = None;

    for &name in &steps {
        println!("==> {name}");
        flush_stdout();
        let (result, elapsed) = timed(|| run_step(root, name));
        let ok = match result {
            Ok(StepResult { ok, counts }) => {
                if name == "test" {
                    test_counts = Some(counts);
                }
                ok
            }
            Err(error) => {
                eprintln!("error: step `{name}` could not run: {error:#}");
                if name == "test" {
                    test_counts = Some(None);
                }
                false
            }
        };
        println!(
            "==> {name}: {} in {:.1}s",
            if ok { "ok" } else { "FAILED" },
            elapsed.as_secs_f64()
        );
        println!();
        flush_stdout();
        outcomes.push(StepOutcome { name, ok, elapsed });
    }

    print_summary(&outcomes);
    let failed: Vec<&str> = outcomes.iter().filter(|o| !o.ok).map(|o| o.name).collect();
    if failed.is_empty() {
        println!("ci: all {} step(s) passed", outcomes.len());
    } else {
        println!(
            "ci: {} of {} step(s) failed: {}",
            failed.len(),
            outcomes.len(),
            failed.join(", ")
        );
    }
    // This line must stay last: CI reads it as the test count of the run.
    if let Some(counts) = test_counts {
        let counts = counts.unwrap_or_else(|| {
            println!("note: the test step printed no test summary, so no tests are counted");
            TestCounts::default()
        });
        println!("tests: {} passed, {} failed", counts.passed, counts.failed);
    }
    flush_stdout();
    Ok(if failed.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// Resolves the command-line step names, keeping the canonical order.
fn select_steps(selected: &[String]) -> Result<Vec<&'static str>> {
    if selected.is_empty() {
        return Ok(STEPS.to_vec());
    }
    for name in selected {
        if !STEPS.contains(&name.as_str()) {
            bail!(
                "unknown CI step `{name}`; the steps are: {}",
                STEPS.join(", ")
            );
        }
    }
    Ok(STEPS
        .iter()
        .copied()
        .filter(|step| selected.iter().any(|s| s == step))
        .collect())
}

/// What a step reports besides its wall time.
struct StepResult {
    /// Whether the step succeeded.
    ok: bool,
    /// Test counts, only for the `test` step and only when its output had a summary.
    counts: Option<TestCounts>,
}

impl StepResult {
    /// A step result without test counts.
    fn status(ok: bool) -> Self {
        Self { ok, counts: None }
    }
}

/// Runs one step by name.
fn run_step(root: &Path, name: &str) -> Result<StepResult> {
    match name {
        "fmt" => run_inherited(cargo(root).args(["fmt", "--all", "--", "--check"])),
        "clippy" => run_inherited(
            cargo(root)
                .args(["clippy", "--workspace", "--all-targets", "--locked"])
                .args(EXTRA_FEATURES)
                .args(["--", "-D", "warnings"]),
        ),
        "test" => run_tests(root),
        "doctest" => run_inherited(
            cargo(root)
                .args(["test", "--workspace", "--doc", "--locked"])
                .args(EXTRA_FEATURES),
        ),
        "rustdoc" => {
            let mut flags = std::env::var_os("RUSTDOCFLAGS").unwrap_or_default();
            if !flags.is_empty() {
                flags.push(" ");
            }
            flags.push("-D warnings");
            run_inherited(
                cargo(root)
                    .args(["doc", "--workspace", "--no-deps", "--locked"])
                    .args(EXTRA_FEATURES)
                    .env("RUSTDOCFLAGS", flags),
            )
        }
        "tidy" => {
            let violations = tidy::run(root)?;
            for violation in &violations {
                println!("{violation}");
            }
            if violations.is_empty() {
                println!("tidy: ok");
            } else {
                println!("tidy: {} violation(s)", violations.len());
            }
            Ok(StepResult::status(violations.is_empty()))
        }
        "readme" => Ok(StepResult::status(crate::readme::run(root)?)),
        other => Err(anyhow!("no such CI step `{other}`")),
    }
}

/// The `test` step: nextest when it is installed, else `cargo test`, without doctests.
fn run_tests(root: &Path) -> Result<StepResult> {
    let nextest = has_nextest(root);
    let mut command = cargo(root);
    if nextest {
        println!("using cargo-nextest");
        command.args([
            "nextest",
            "run",
            "--workspace",
            "--locked",
            "--no-fail-fast",
        ]);
    } else {
        println!("cargo-nextest not found; using cargo test");
        command.args([
            "test",
            "--workspace",
            "--locked",
            "--no-fail-fast",
            "--lib",
            "--bins",
            "--tests",
            "--examples",
        ]);
    }
    command.args(EXTRA_FEATURES);
    if std::env::var_os("PROPTEST_CASES").is_none() {
        command.env("PROPTEST_CASES", DEFAULT_PROPTEST_CASES);
    }
    flush_stdout();
    let (status, output) = run_tee(&mut command)?;
    let counts = if nextest {
        parse_nextest_summary(&output)
    } else {
        parse_cargo_test_results(&output)
    };
    Ok(StepResult {
        ok: status.success(),
        counts,
    })
}

/// Whether `cargo nextest --version` works.
fn has_nextest(root: &Path) -> bool {
    cargo(root)
        .args(["nextest", "--version"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|status| status.success())
}

/// A `cargo` command running in the workspace root, using the cargo that runs xtask.
fn cargo(root: &Path) -> Command {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| OsString::from("cargo"));
    let mut command = Command::new(cargo);
    command.current_dir(root);
    command
}

/// Runs a command with the terminal's stdio and reports whether it succeeded.
fn run_inherited(command: &mut Command) -> Result<StepResult> {
    let status = command
        .status()
        .with_context(|| format!("failed to start {command:?}"))?;
    Ok(StepResult::status(status.success()))
}

/// Runs a command, streaming its stdout and stderr live while also capturing both.
///
/// Returns the exit status and the captured output (stdout, then stderr), lossily decoded.
fn run_tee(command: &mut Command) -> Result<(ExitStatus, String)> {
    let mut child = command
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("failed to start {command:?}"))?;
    let stdout = child.stdout.take().context("child stdout was not piped")?;
    let stderr = child.stderr.take().context("child stderr was not piped")?;
    let stdout_relay = thread::spawn(move || relay(stdout, io::stdout()));
    let stderr_relay = thread::spawn(move || relay(stderr, io::stderr()));
    let status = child
        .wait()
        .with_context(|| format!("failed to wait for {command:?}"))?;
    let mut captured = stdout_relay
        .join()
        .map_err(|_| anyhow!("the stdout relay thread panicked"))?
        .context("failed to read the child's stdout")?;
    let captured_err = stderr_relay
        .join()
        .map_err(|_| anyhow!("the stderr relay thread panicked"))?
        .context("failed to read the child's stderr")?;
    captured.extend_from_slice(&captured_err);
    Ok((status, String::from_utf8_lossy(&captured).into_owned()))
}

/// Copies `from` to `to` as data arrives and returns everything that was read.
fn relay(mut from: impl Read, mut to: impl Write) -> io::Result<Vec<u8>> {
    let mut captured = Vec::new();
    let mut buffer = [0_u8; 8192];
    loop {
        let read = match from.read(&mut buffer) {
            Ok(0) => return Ok(captured),
            Ok(read) => read,
            Err(error) if error.kind() == io::ErrorKind::Interrupted => continue,
            Err(error) => return Err(error),
        };
        // A closed terminal must not stop the capture, or the child would block on a full pipe
        // and the test count would be lost, so echo errors are deliberately ignored.
        let _ = to.write_all(&buffer[..read]).and_then(|()| to.flush());
        captured.extend_from_slice(&buffer[..read]);
    }
}

/// Flushes stdout so headers appear before the child's output; a failed flush only affects
/// ordering on the terminal, so it is ignored.
fn flush_stdout() {
    let _ = io::stdout().flush();
}

/// Runs `f` and measures its wall time.
#[expect(
    clippy::disallowed_methods,
    reason = "xtask reports how long each CI step took; it is tooling, not deterministic kernel code"
)]
fn timed<T>(f: impl FnOnce() -> T) -> (T, Duration) {
    let start = Instant::now();
    let value = f();
    (value, start.elapsed())
}

/// Prints the step / result / seconds table.
fn print_summary(outcomes: &[StepOutcome]) {
    println!("==> summary");
    println!("{:<10} {:<8} {:>9}", "step", "result", "seconds");
    let mut total = Duration::ZERO;
    for outcome in outcomes {
        total += outcome.elapsed;
        println!(
            "{:<10} {:<8} {:>9.1}",
            outcome.name,
            if outcome.ok { "ok" } else { "FAILED" },
            outcome.elapsed.as_secs_f64()
        );
    }
    println!("{:<10} {:<8} {:>9.1}", "total", "", total.as_secs_f64());
}

/// Reads the counts from nextest's final summary line, e.g.
/// `Summary [   1.2s] 120 tests run: 119 passed, 1 failed, 0 skipped`.
pub fn parse_nextest_summary(output: &str) -> Option<TestCounts> {
    let line = output
        .lines()
        .map(strip_ansi)
        .rfind(|line| line.contains("Summary [") && line.contains(" run: "))?;
    let (_, tally) = line.split_once(" run: ")?;
    let mut counts = TestCounts::default();
    for part in tally.split(',') {
        let mut words = part.split_whitespace();
        let Some(Ok(count)) = words.next().map(str::parse::<u64>) else {
            continue;
        };
        let what: Vec<&str> = words.take(2).collect();
        match what.as_slice() {
            ["passed", ..] => counts.passed += count,
            ["failed", ..] | ["exec", "failed"] | ["timed", "out"] => counts.failed += count,
            _ => {}
        }
    }
    Some(counts)
}

/// Sums the counts of every `test result:` line printed by `cargo test`, e.g.
/// `test result: FAILED. 3 passed; 1 failed; 0 ignored; 0 measured; 0 filtered out`.
pub fn parse_cargo_test_results(output: &str) -> Option<TestCounts> {
    let mut found = false;
    let mut counts = TestCounts::default();
    for line in output.lines().map(strip_ansi) {
        let Some((_, tally)) = line.split_once("test result:") else {
            continue;
        };
        found = true;
        let words: Vec<&str> = tally
            .split(|c: char| c.is_whitespace() || c == ';' || c == '.')
            .filter(|word| !word.is_empty())
            .collect();
        for pair in words.windows(2) {
            if let [count, what] = pair
                && let Ok(count) = count.parse::<u64>()
            {
                match *what {
                    "passed" => counts.passed += count,
                    "failed" => counts.failed += count,
                    _ => {}
                }
            }
        }
    }
    found.then_some(counts)
}

/// Removes ANSI escape sequences (colors), in case the runner was told to color piped output.
fn strip_ansi(line: &str) -> String {
    let mut plain = String::with_capacity(line.len());
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            // Skip `ESC [ params final-byte`; the final byte is in `@..=~`.
            if chars.next() == Some('[') {
                for c in chars.by_ref() {
                    if ('@'..='~').contains(&c) {
                        break;
                    }
                }
            }
        } else {
            plain.push(c);
        }
    }
    plain
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nextest_summary_all_passed() {
        let output = "        PASS [   0.004s] baton-run id::tests::a\n\
                      ────────────\n     Summary [  12.345s] 120 tests run: 120 passed, 0 skipped\n";
        assert_eq!(
            parse_nextest_summary(output),
            Some(TestCounts {
                passed: 120,
                failed: 0
            })
        );
    }

    #[test]
    fn nextest_summary_with_failures_and_timeouts() {
        let output = "     Summary [   0.117s] 3/9 tests run: 5 passed (1 slow), 2 failed, \
                      1 exec failed, 1 timed out, 0 skipped\n        FAIL [   0.112s] a bad\n\
                      error: test run failed\n";
        assert_eq!(
            parse_nextest_summary(output),
            Some(TestCounts {
                passed: 5,
                failed: 4
            })
        );
    }

    #[test]
    fn nextest_summary_with_colors() {
        let output = "\u{1b}[32;1m     Summary\u{1b}[0m [   0.1s] \u{1b}[1m1\u{1b}[0m test run: \
                      \u{1b}[1m1\u{1b}[0m \u{1b}[32;1mpassed\u{1b}[0m, 0 skipped";
        assert_eq!(
            parse_nextest_summary(output),
            Some(TestCounts {
                passed: 1,
                failed: 0
            })
        );
    }

    #[test]
    fn nextest_without_summary_has_no_counts() {
        assert_eq!(
            parse_nextest_summary("error: could not compile `baton-run`"),
            None
        );
    }

    #[test]
    fn cargo_test_results_are_summed() {
        let output = "running 3 tests\n\
            test result: ok. 3 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out; finished in 0.00s\n\
            running 2 tests\n\
            test result: FAILED. 1 passed; 1 failed; 0 ignored; 0 measured; 0 filtered out; finished in 0.01s\n";
        assert_eq!(
            parse_cargo_test_results(output),
            Some(TestCounts {
                passed: 4,
                failed: 1
            })
        );
        assert_eq!(parse_cargo_test_results("error: could not compile"), None);
    }

    #[test]
    fn steps_are_selected_in_canonical_order() {
        let selected = vec!["tidy".to_owned(), "fmt".to_owned()];
        assert_eq!(
            select_steps(&selected).expect("known steps"),
            vec!["fmt", "tidy"]
        );
        assert_eq!(select_steps(&[]).expect("all steps"), STEPS.to_vec());
        assert!(select_steps(&["lint".to_owned()]).is_err());
    }
}
