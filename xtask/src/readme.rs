//! The README check: the README's two commands must work as written.
//!
//! - `.ci/run` must run exactly the README's test command (the command in
//!   the code block under `## Run the tests`).
//! - The README's main-job command (under `## Run the demo`) is run verbatim
//!   in a fresh clone of the repository (with this workspace's target
//!   directory, so nothing is built twice); its first output line must be
//!   the first line of the README's sample output, and the turn and task
//!   counts of its summary must be those of the tree it ran (read back with
//!   `baton inspect --json`). The release profile is built at `opt-level = 0`
//!   for this check (`CARGO_PROFILE_RELEASE_OPT_LEVEL`, unless already set):
//!   it shows that the command works from a fresh clone, not how fast the
//!   optimized binary runs, and optimizing every dependency again was the
//!   largest share of CI's time.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};

/// The environment variable that sets the release profile's `opt-level`
/// (the check builds unoptimized unless it is set).
const RELEASE_OPT_LEVEL: &str = "CARGO_PROFILE_RELEASE_OPT_LEVEL";

/// The code blocks under a level-two heading, in order.
fn blocks_under<'a>(readme: &'a str, heading: &str) -> Vec<Vec<&'a str>> {
    let mut blocks = Vec::new();
    let mut in_section = false;
    let mut current: Option<Vec<&str>> = None;
    for line in readme.lines() {
        if current.is_none() && line.starts_with("## ") {
            in_section = line.trim() == heading;
            continue;
        }
        if !in_section {
            continue;
        }
        if line.starts_with("```") {
            match current.take() {
                Some(block) => blocks.push(block),
                None => current = Some(Vec::new()),
            }
        } else if let Some(block) = current.as_mut() {
            block.push(line);
        }
    }
    blocks
}

/// The single command of the first code block under `heading`.
pub fn command_under(readme: &str, heading: &str) -> Result<String> {
    let blocks = blocks_under(readme, heading);
    let block = blocks
        .first()
        .with_context(|| format!("README has no code block under `{heading}`"))?;
    match block.as_slice() {
        [command] => Ok(command.trim().to_owned()),
        _ => bail!("the first code block under `{heading}` must hold exactly one command"),
    }
}

/// The last command `.ci/run` runs (its last line that is not blank or a comment).
pub fn ci_command(script: &str) -> Option<&str> {
    script
        .lines()
        .map(str::trim)
        .rfind(|line| !line.is_empty() && !line.starts_with('#'))
}

/// Runs the README check; prints what it does and returns whether it passed.
pub fn run(root: &Path) -> Result<bool> {
    let readme =
        std::fs::read_to_string(root.join("README.md")).context("cannot read README.md")?;
    let test_command = command_under(&readme, "## Run the tests")?;
    let script = std::fs::read_to_string(root.join(".ci/run")).context("cannot read .ci/run")?;
    let ci = ci_command(&script).unwrap_or_default();
    if ci != test_command {
        println!(
            "readme: .ci/run ends with `{ci}`, but the README's test command is `{test_command}`"
        );
        return Ok(false);
    }
    println!("readme: .ci/run runs the README's test command `{test_command}`");

    let main_job = command_under(&readme, "## Run the demo")?;
    let sample = blocks_under(&readme, "## Run the demo");
    let expected = sample
        .get(1)
        .and_then(|block| block.first())
        .context("README has no sample output under `## Run the demo`")?
        .trim()
        .to_owned();

    let scratch = std::env::temp_dir().join(format!("baton-readme-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&scratch);
    let clone = scratch.join("repo");
    let status = Command::new("git")
        .args(["clone", "--quiet"])
        .arg(root)
        .arg(&clone)
        .status()
        .context("cannot run git")?;
    if !status.success() {
        bail!("git clone of {} failed", root.display());
    }
    let target =
        std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| root.join("target"), PathBuf::from);
    println!("readme: running `{main_job}` in a fresh clone");
    let mut command = Command::new("sh");
    command
        .arg("-c")
        .arg(&main_job)
        .current_dir(&clone)
        .env("CARGO_TARGET_DIR", &target);
    if std::env::var_os(RELEASE_OPT_LEVEL).is_none() {
        command.env(RELEASE_OPT_LEVEL, "0");
    }
    let output = command
        .output()
        .context("cannot run the main-job command")?;
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    let result = check_demo(&output, &stdout, &expected, &target, &clone);
    let _ = std::fs::remove_dir_all(&scratch);
    result
}

fn check_demo(
    output: &std::process::Output,
    stdout: &str,
    expected: &str,
    target: &Path,
    clone: &Path,
) -> Result<bool> {
    if !output.status.success() {
        println!(
            "readme: the main job failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        return Ok(false);
    }
    print!("{stdout}");
    if stdout.lines().next() != Some(expected) {
        println!("readme: the first output line is not the README's `{expected}`");
        return Ok(false);
    }
    let field = |name: &str| -> Option<String> {
        stdout
            .lines()
            .find_map(|line| line.strip_prefix(name))
            .map(|rest| {
                rest.split_whitespace()
                    .next()
                    .unwrap_or_default()
                    .to_owned()
            })
    };
    let (Some(tree), Some(turns), Some(tasks)) = (field("tree "), field("turns "), field("tasks "))
    else {
        println!("readme: the summary lacks its tree, turns or tasks line");
        return Ok(false);
    };
    let inspect = Command::new(target.join("release").join("baton"))
        .args(["inspect", &tree, "--json"])
        .current_dir(clone)
        .output()
        .context("cannot run baton inspect")?;
    let view: serde_json::Value = serde_json::from_slice(&inspect.stdout)
        .context("baton inspect --json did not print JSON")?;
    let children = view["processes"][0]["children"]
        .as_object()
        .context("the inspected tree has no children map")?;
    let real_turns = children
        .keys()
        .filter(|key| key.starts_with("team.turn."))
        .count();
    let real_tasks = children.len() - real_turns;
    if turns != real_turns.to_string() || tasks != real_tasks.to_string() {
        println!(
            "readme: the summary says {turns} turns and {tasks} tasks, the tree has {real_turns} and {real_tasks}"
        );
        return Ok(false);
    }
    println!(
        "readme: the demo printed the expected line, and its {turns} turns and {tasks} tasks match its tree"
    );
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    const README: &str = "# T\n\n## Run the demo\n\n```sh\ncargo run -p x -- demo\n```\n\n```text\nhello\n\nturns 4\n```\n\n## Run the tests\n\n```sh\ncargo xtask ci\n```\n";

    #[test]
    fn commands_are_read_from_their_sections() {
        assert_eq!(
            command_under(README, "## Run the tests").expect("found"),
            "cargo xtask ci"
        );
        assert_eq!(
            command_under(README, "## Run the demo").expect("found"),
            "cargo run -p x -- demo"
        );
        assert_eq!(blocks_under(README, "## Run the demo")[1][0], "hello");
        assert!(command_under(README, "## Missing").is_err());
    }

    #[test]
    fn the_ci_script_command_is_its_last_line() {
        assert_eq!(
            ci_command("#!/bin/sh\nset -e\n# note\ncargo xtask ci\n\n"),
            Some("cargo xtask ci")
        );
        assert_eq!(ci_command("# only comments\n"), None);
    }
}
