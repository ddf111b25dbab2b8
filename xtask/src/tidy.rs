//! Tidy checks: the architecture and hygiene rules of the workspace, as executable code.
//!
//! The rules (STYLE "Layering is executable"):
//! - every dependency edge between workspace crates is one [`ARCHITECTURE`] allows;
//! - every library crate starts its root file with a `//!` crate doc comment;
//! - no `.rs` file of a workspace member carries the attribute that skips a test;
//! - no `.rs` file of a workspace member includes a file outside its own crate's directory with a
//!   `path` attribute (share code through a crate, so this table sees the edge);
//! - the kernel ([`SMALL_FUNCTIONS_AND_FILES`]) allows no `clippy::too_many_arguments` and keeps
//!   every file under `src/` within [`MAX_SOURCE_LINES`] lines;
//! - every member manifest takes each dependency from the workspace (`workspace = true`) and
//!   inherits the workspace lints (`[lints]` with `workspace = true`);
//! - no code under [`SLEEP_FREE`] (the command line, the examples and the guides' code blocks)
//!   calls `sleep` or `yield_now`, tests excepted: they await what the engine offers instead of
//!   polling.
//!
//! `cargo xtask tidy` and the `tidy` step of `cargo xtask ci` call [`run`]; so does the test
//! `workspace_is_tidy` below, which makes plain `cargo test` enforce the same rules.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};
use serde_json::Value;

/// Allowed normal (and build) dependency edges between workspace crates.
///
/// This is the table of ARCHITECTURE §1 (the design brief) as recorded in `docs/architecture.md`;
/// change both together. Each entry is `(crate, workspace crates it may depend on)`. A workspace
/// crate missing here is a tidy failure. Dev-dependencies may add [`TESTKIT`] and nothing else.
pub const ARCHITECTURE: &[(&str, &[&str])] = &[
    // The kernel knows nothing of any other crate.
    ("baton-run", &[]),
    // Strategy crates, store backends and the testkit build on the kernel only.
    ("baton-workflow", &["baton-run"]),
    ("baton-coordination", &["baton-run"]),
    ("baton-team", &["baton-run"]),
    ("baton-testkit", &["baton-run"]),
    ("baton-store-sqlite", &["baton-run"]),
    ("baton-store-postgres", &["baton-run"]),
    // The agent adapter is a three-stage workflow.
    ("baton-agent", &["baton-run", "baton-workflow"]),
    // Team strategies coordinate teams, some of them with model-backed parts (adapters).
    (
        "baton-strategy",
        &["baton-run", "baton-team", "baton-agent", "baton-workflow"],
    ),
    // The facade re-exports every library and nothing else.
    (
        "baton",
        &[
            "baton-run",
            "baton-workflow",
            "baton-coordination",
            "baton-team",
            "baton-agent",
            "baton-strategy",
            "baton-store-sqlite",
            "baton-store-postgres",
        ],
    ),
    // The examples are an application of the facade, shared as a library.
    ("baton-examples", &["baton"]),
    // The worker host and its HTTP API are an application of the facade, shared as a library
    // (the command line's `serve` calls it).
    ("baton-server", &["baton"]),
    // Applications and workspace scenarios go through the facade (plus the testkit and the
    // shared examples).
    (
        "baton-cli",
        &["baton", "baton-testkit", "baton-examples", "baton-server"],
    ),
    // A host crate as a user writes one: its programs behind the embedded command line (the
    // library of `baton-cli`, without the demos), and the tests that drive it.
    ("baton-cli-embedded", &["baton", "baton-cli"]),
    ("baton-bench", &["baton", "baton-testkit", "baton-examples"]),
    ("baton-tests", &["baton", "baton-testkit", "baton-examples"]),
    // Tooling depends on no workspace crate.
    ("xtask", &[]),
];

/// The one crate any workspace crate may add as a dev-dependency beyond its normal edges.
pub const TESTKIT: &str = "baton-testkit";

/// Dev-dependency edges allowed beyond the normal ones and [`TESTKIT`]: `(crate, crates its
/// tests may use)`. The worker host's tests drive the shared example programs, which its
/// library must not know.
pub const DEV_ONLY: &[(&str, &[&str])] = &[("baton-server", &["baton-examples"])];

/// The attribute that skips a test, built at compile time from pieces so this file does not
/// contain it and trip its own check.
const IGNORE_ATTRIBUTE: &str = concat!("#[", "ignore");

/// The attribute that sets a module's file, built from pieces for the same reason.
const PATH_ATTRIBUTE: &str = concat!("#[", "path");

/// The lint a crate of [`SMALL_FUNCTIONS_AND_FILES`] may not allow or expect: pass the request
/// whole instead of seven arguments (STYLE "avoid those").
const TOO_MANY_ARGUMENTS: &str = "clippy::too_many_arguments";

/// Crates held to small functions and small files: no [`TOO_MANY_ARGUMENTS`] allowance anywhere
/// and no file under `src/` longer than [`MAX_SOURCE_LINES`].
pub const SMALL_FUNCTIONS_AND_FILES: &[&str] = &["baton-run"];

/// The most lines a source file of a crate in [`SMALL_FUNCTIONS_AND_FILES`] may have.
pub const MAX_SOURCE_LINES: usize = 1_000;

/// Where code may not sleep (paths from the workspace root; a missing one is skipped): the
/// command line, the examples and the code blocks of the guides, which users copy. Waiting for a
/// tree is awaiting one of the engine's conditions, never a loop around `sleep`. Test modules
/// (from a `#[cfg(test)]` line on) are exempt.
pub const SLEEP_FREE: &[&str] = &[
    "crates/baton-cli/src",
    "crates/baton-examples/src",
    "crates/baton-examples/examples",
    "examples",
    "docs/guides",
];

/// Manifest sections that list dependencies.
const DEPENDENCY_SECTIONS: &[&str] = &["dependencies", "dev-dependencies", "build-dependencies"];

/// One broken rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    /// The crate or file that breaks the rule.
    pub subject: String,
    /// Short name of the rule.
    pub rule: &'static str,
    /// What is wrong and how to fix it.
    pub detail: String,
}

impl Violation {
    /// Builds a violation.
    fn new(subject: impl Into<String>, rule: &'static str, detail: impl Into<String>) -> Self {
        Self {
            subject: subject.into(),
            rule,
            detail: detail.into(),
        }
    }
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "tidy [{}] {}: {}", self.rule, self.subject, self.detail)
    }
}

/// Kind of a dependency as `cargo metadata` reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DepKind {
    /// A normal or build dependency; both are bound by [`ARCHITECTURE`].
    Normal,
    /// A dev-dependency.
    Dev,
}

/// A dependency of a workspace member on another workspace member.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Edge {
    /// Package name of the dependency.
    pub to: String,
    /// How it is depended on.
    pub kind: DepKind,
}

/// A workspace member, as far as tidy cares.
#[derive(Debug, Clone)]
pub struct Member {
    /// Package name.
    pub name: String,
    /// Path of its `Cargo.toml`.
    pub manifest_path: PathBuf,
    /// Root source file of its library target, if it has one.
    pub lib_root: Option<PathBuf>,
    /// Its dependencies on other workspace members.
    pub edges: Vec<Edge>,
}

impl Member {
    /// Directory holding the member's manifest.
    fn dir(&self) -> Result<&Path> {
        self.manifest_path.parent().with_context(|| {
            format!(
                "manifest path {} has no parent",
                self.manifest_path.display()
            )
        })
    }
}

/// Runs every tidy check on the workspace at `root` and returns the violations, sorted.
pub fn run(root: &Path) -> Result<Vec<Violation>> {
    let metadata = cargo_metadata(root)?;
    let members = members(&metadata)?;
    let mut violations = check_edges(&members);
    for member in &members {
        let manifest = read(&member.manifest_path)?;
        violations.extend(check_manifest(
            &display_path(root, &member.manifest_path),
            &manifest,
        ));
        if let Some(lib_root) = &member.lib_root {
            let source = read(lib_root)?;
            violations.extend(check_crate_doc(
                &member.name,
                &display_path(root, lib_root),
                &source,
            ));
        }
    }
    for member in &members {
        let dir = member.dir()?;
        let small = SMALL_FUNCTIONS_AND_FILES.contains(&member.name.as_str());
        let mut files = BTreeSet::new();
        collect_rust_files(dir, &mut files)?;
        for file in files {
            let source = read(&file)?;
            let shown = display_path(root, &file);
            violations.extend(check_no_ignore(&shown, &source));
            violations.extend(check_path_includes(&shown, dir, &file, &source));
            if small {
                violations.extend(check_too_many_arguments(&shown, &source));
                if file.starts_with(dir.join("src")) {
                    violations.extend(check_file_length(&shown, &source));
                }
            }
        }
    }
    for dir in SLEEP_FREE {
        let dir = root.join(dir);
        if !dir.is_dir() {
            continue;
        }
        let mut files = BTreeSet::new();
        collect_files(&dir, &["rs", "md"], &mut files)?;
        for file in files {
            let source = read(&file)?;
            let shown = display_path(root, &file);
            if file.extension().is_some_and(|ext| ext == "md") {
                violations.extend(check_no_sleep_in_code_blocks(&shown, &source));
            } else {
                violations.extend(check_no_sleep(&shown, &source));
            }
        }
    }
    Ok(violations)
}

/// Runs `cargo metadata --format-version 1 --no-deps` in `root`.
fn cargo_metadata(root: &Path) -> Result<Value> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let output = Command::new(&cargo)
        .args(["metadata", "--format-version", "1", "--no-deps"])
        .current_dir(root)
        .output()
        .with_context(|| format!("failed to run `{} metadata`", cargo.to_string_lossy()))?;
    if !output.status.success() {
        bail!(
            "`cargo metadata` failed ({}):\n{}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        );
    }
    serde_json::from_slice(&output.stdout).context("`cargo metadata` printed invalid JSON")
}

/// Extracts the workspace members, sorted by name, from `cargo metadata --no-deps` output.
pub fn members(metadata: &Value) -> Result<Vec<Member>> {
    let packages = metadata["packages"]
        .as_array()
        .context("cargo metadata has no `packages` array")?;
    let names: BTreeSet<&str> = packages
        .iter()
        .map(|package| package["name"].as_str().context("a package has no name"))
        .collect::<Result<_>>()?;
    let mut members = Vec::with_capacity(packages.len());
    for package in packages {
        let name = package["name"].as_str().context("a package has no name")?;
        let manifest_path = package["manifest_path"]
            .as_str()
            .with_context(|| format!("package `{name}` has no manifest_path"))?;
        let mut edges = Vec::new();
        for dependency in package["dependencies"].as_array().into_iter().flatten() {
            let to = dependency["name"]
                .as_str()
                .with_context(|| format!("a dependency of `{name}` has no name"))?;
            if !names.contains(to) {
                continue;
            }
            let kind = match dependency["kind"].as_str() {
                None | Some("normal" | "build") => DepKind::Normal,
                Some("dev") => DepKind::Dev,
                Some(other) => {
                    bail!("dependency `{to}` of `{name}` has unknown kind `{other}`")
                }
            };
            edges.push(Edge {
                to: to.to_owned(),
                kind,
            });
        }
        let lib_root = package["targets"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|target| {
                target["kind"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(|kind| kind.as_str().is_some_and(is_library_kind))
            })
            .and_then(|target| target["src_path"].as_str())
            .map(PathBuf::from);
        members.push(Member {
            name: name.to_owned(),
            manifest_path: PathBuf::from(manifest_path),
            lib_root,
            edges,
        });
    }
    members.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(members)
}

/// Whether a cargo target kind is a library.
fn is_library_kind(kind: &str) -> bool {
    matches!(
        kind,
        "lib" | "rlib" | "dylib" | "cdylib" | "staticlib" | "proc-macro"
    )
}

/// The architecture table as a map from crate to its allowed normal dependencies.
fn architecture() -> BTreeMap<&'static str, &'static [&'static str]> {
    ARCHITECTURE.iter().copied().collect()
}

/// Checks every edge between workspace crates against [`ARCHITECTURE`].
pub fn check_edges(members: &[Member]) -> Vec<Violation> {
    let table = architecture();
    let mut violations = Vec::new();
    for member in members {
        let Some(allowed) = table.get(member.name.as_str()) else {
            violations.push(Violation::new(
                &member.name,
                "architecture",
                "unknown crate: add it to the architecture table (`ARCHITECTURE` in \
                 xtask/src/tidy.rs and docs/architecture.md)",
            ));
            continue;
        };
        for edge in &member.edges {
            let normally_allowed = allowed.contains(&edge.to.as_str());
            match edge.kind {
                DepKind::Normal if !normally_allowed => violations.push(Violation::new(
                    &member.name,
                    "architecture",
                    format!(
                        "depends on `{}`, which ARCHITECTURE §1 does not allow; allowed: {}",
                        edge.to,
                        describe(allowed)
                    ),
                )),
                DepKind::Dev
                    if !normally_allowed
                        && edge.to != TESTKIT
                        && !dev_only_allowed(&member.name, &edge.to) =>
                {
                    violations.push(Violation::new(
                        &member.name,
                        "architecture",
                        format!(
                            "dev-depends on `{}`; dev-dependencies may add only `{TESTKIT}` to \
                             the allowed edges ({})",
                            edge.to,
                            describe(allowed)
                        ),
                    ));
                }
                DepKind::Normal | DepKind::Dev => {}
            }
        }
    }
    violations
}

/// Whether [`DEV_ONLY`] lets `from`'s tests use `to`.
fn dev_only_allowed(from: &str, to: &str) -> bool {
    DEV_ONLY
        .iter()
        .any(|(name, allowed)| *name == from && allowed.contains(&to))
}

/// Lists allowed crates for a message.
fn describe(allowed: &[&str]) -> String {
    if allowed.is_empty() {
        "no workspace crate".to_owned()
    } else {
        allowed
            .iter()
            .map(|name| format!("`{name}`"))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// Checks that a library's root file starts with a `//!` crate doc comment.
pub fn check_crate_doc(name: &str, path: &str, source: &str) -> Vec<Violation> {
    let first = source.lines().map(str::trim).find(|line| !line.is_empty());
    if first.is_some_and(|line| line.starts_with("//!")) {
        return Vec::new();
    }
    vec![Violation::new(
        format!("{name} ({path})"),
        "crate-doc",
        "a library must start with a `//!` crate doc comment: what it owns, who depends on it, \
         what it knows nothing about",
    )]
}

/// Checks that a Rust source file has no attribute that skips a test.
pub fn check_no_ignore(path: &str, source: &str) -> Vec<Violation> {
    source
        .lines()
        .enumerate()
        .filter(|(_, line)| line.contains(IGNORE_ATTRIBUTE))
        .map(|(index, _)| {
            Violation::new(
                format!("{path}:{}", index + 1),
                "no-ignore",
                format!(
                    "`{IGNORE_ATTRIBUTE}]` hides a test from CI; fix the test, gate it on a \
                     feature or delete it"
                ),
            )
        })
        .collect()
}

/// Checks that every `path` attribute of a Rust file names a file inside `crate_dir`.
///
/// The target is resolved against the directory of `file`, which is where the compiler looks for
/// a module declared outside an inline module; inside an inline module the compiler looks deeper,
/// so this resolution never lets an escaping include through. The path is normalized lexically
/// (the target need not exist).
pub fn check_path_includes(
    shown: &str,
    crate_dir: &Path,
    file: &Path,
    source: &str,
) -> Vec<Violation> {
    let base = file.parent().unwrap_or(Path::new(""));
    attributes(source)
        .into_iter()
        .filter_map(|(line, attribute)| {
            let target = path_attribute_target(&attribute)?;
            let resolved = normalize(&base.join(target));
            (!resolved.starts_with(normalize(crate_dir))).then(|| {
                Violation::new(
                    format!("{shown}:{line}"),
                    "path-include",
                    format!(
                        "`{PATH_ATTRIBUTE} = \"{target}\"]` includes a file outside the crate; \
                         share the code through a crate (a dependency the architecture table sees)"
                    ),
                )
            })
        })
        .collect()
}

/// The target of a `path = "..."` attribute, or `None` for any other attribute.
fn path_attribute_target(attribute: &str) -> Option<&str> {
    let rest = attribute.strip_prefix(PATH_ATTRIBUTE)?;
    let rest = rest.trim_start().strip_prefix('=')?.trim_start();
    let rest = rest.strip_prefix('"')?;
    rest.split_once('"').map(|(target, _)| target)
}

/// Resolves `.` and `..` components without touching the file system.
fn normalize(path: &Path) -> PathBuf {
    let mut normal = PathBuf::new();
    for component in path.components() {
        match component {
            std::path::Component::CurDir => {}
            std::path::Component::ParentDir => {
                if !normal.pop() {
                    normal.push("..");
                }
            }
            other => normal.push(other),
        }
    }
    normal
}

/// Checks that a Rust file neither allows nor expects `clippy::too_many_arguments`.
pub fn check_too_many_arguments(shown: &str, source: &str) -> Vec<Violation> {
    attributes(source)
        .into_iter()
        .filter(|(_, attribute)| {
            let compact: String = attribute.chars().filter(|c| !c.is_whitespace()).collect();
            (compact.contains("allow(") || compact.contains("expect("))
                && compact.contains(TOO_MANY_ARGUMENTS)
        })
        .map(|(line, _)| {
            Violation::new(
                format!("{shown}:{line}"),
                "too-many-arguments",
                format!(
                    "`{TOO_MANY_ARGUMENTS}` may not be allowed or expected in this crate; pass the \
                     request whole (a struct of the arguments) instead"
                ),
            )
        })
        .collect()
}

/// Checks that a source file has at most [`MAX_SOURCE_LINES`] lines.
pub fn check_file_length(shown: &str, source: &str) -> Vec<Violation> {
    let lines = source.lines().count();
    if lines <= MAX_SOURCE_LINES {
        return Vec::new();
    }
    vec![Violation::new(
        shown,
        "file-length",
        format!(
            "{lines} lines, over the {MAX_SOURCE_LINES} this crate allows per file; split it so \
             each decision has its own module"
        ),
    )]
}

/// Checks that a Rust source of [`SLEEP_FREE`] calls no `sleep` (`thread::sleep`,
/// `tokio::time::sleep`, `sleep_until`, any `sleep(`) and no `yield_now` (the other half of a
/// polling loop) before its first `#[cfg(test)]` line.
pub fn check_no_sleep(shown: &str, source: &str) -> Vec<Violation> {
    source
        .lines()
        .enumerate()
        .take_while(|(_, line)| !line.trim_start().starts_with("#[cfg(test)]"))
        .filter(|(_, line)| sleeps(line))
        .map(|(index, _)| sleep_violation(shown, index + 1))
        .collect()
}

/// Checks the fenced code blocks of a Markdown file of [`SLEEP_FREE`] like
/// [`check_no_sleep`] checks a source.
pub fn check_no_sleep_in_code_blocks(shown: &str, text: &str) -> Vec<Violation> {
    let mut in_block = false;
    let mut violations = Vec::new();
    for (index, line) in text.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            in_block = !in_block;
        } else if in_block && sleeps(line) {
            violations.push(sleep_violation(shown, index + 1));
        }
    }
    violations
}

fn sleep_violation(shown: &str, line: usize) -> Violation {
    Violation::new(
        format!("{shown}:{line}"),
        "no-sleep",
        "a sleep or a yield here is polling: await the engine's condition instead \
         (`ProcessHandle::until`, `Engine::until`), or a channel, `Engine::watch` or the engine's \
         events",
    )
}

/// Whether a line's code (before any `//` comment) calls or names a sleep: `thread::sleep`,
/// `time::sleep`, the word `sleep` or `sleep_until` followed by `(`, or `yield_now`.
fn sleeps(line: &str) -> bool {
    let code = line.split("//").next().unwrap_or_default();
    if code.contains("thread::sleep") || code.contains("time::sleep") || code.contains("yield_now")
    {
        return true;
    }
    let is_ident = |c: char| c.is_alphanumeric() || c == '_';
    code.match_indices("sleep").any(|(at, _)| {
        let before = code[..at].chars().next_back();
        let after = code[at + "sleep".len()..].trim_start_matches("_until");
        !before.is_some_and(is_ident) && after.trim_start().starts_with('(')
    })
}

/// The attributes of a Rust source, each as `(line of its `#`, its text from `#[` to the closing
/// bracket)`, with `#![` written `#[` and line breaks as spaces. A light lexer skips comments,
/// string literals and character literals, so an attribute mentioned in them is not one; an
/// attribute may span lines.
fn attributes(source: &str) -> Vec<(usize, String)> {
    let chars: Vec<char> = source.chars().collect();
    let at = |index: usize| chars.get(index).copied();
    let mut found = Vec::new();
    let mut line = 1;
    // The attribute being read: its line, its text so far and how many brackets are open.
    let mut open: Option<(usize, String, usize)> = None;
    let mut index = 0;
    while let Some(c) = at(index) {
        match c {
            '/' if at(index + 1) == Some('/') => {
                while at(index).is_some_and(|c| c != '\n') {
                    index += 1;
                }
                continue;
            }
            '/' if at(index + 1) == Some('*') => {
                index += 2;
                while at(index).is_some() && !(at(index) == Some('*') && at(index + 1) == Some('/'))
                {
                    line += usize::from(at(index) == Some('\n'));
                    index += 1;
                }
                index += 2;
                continue;
            }
            'r' if !index
                .checked_sub(1)
                .and_then(at)
                .is_some_and(|c| c.is_alphanumeric() || c == '_')
                && raw_string_hashes(&chars[index + 1..]).is_some() =>
            {
                // A raw string `r#"..."#`: it ends at a quote followed by as many hashes.
                let hashes = raw_string_hashes(&chars[index + 1..]).unwrap_or(0);
                let start = index;
                index += hashes + 2;
                while at(index).is_some()
                    && !(at(index) == Some('"')
                        && (1..=hashes).all(|offset| at(index + offset) == Some('#')))
                {
                    index += 1;
                }
                index = (index + hashes + 1).min(chars.len());
                let literal: String = chars[start..index].iter().collect();
                line += literal.matches('\n').count();
                if let Some((_, text, _)) = open.as_mut() {
                    text.push_str(&literal.replace('\n', " "));
                }
                continue;
            }
            '"' => {
                let start = index;
                index += 1;
                while let Some(c) = at(index) {
                    index += 1;
                    match c {
                        '\\' => index += 1,
                        '"' => break,
                        _ => {}
                    }
                }
                let literal: String = chars[start..index.min(chars.len())].iter().collect();
                line += literal.matches('\n').count();
                if let Some((_, text, _)) = open.as_mut() {
                    text.push_str(&literal.replace('\n', " "));
                }
                continue;
            }
            '\'' if at(index + 1) == Some('\\') => {
                let start = index;
                index += 2;
                while at(index).is_some_and(|c| c != '\'') {
                    index += 1;
                }
                index += 1;
                if let Some((_, text, _)) = open.as_mut() {
                    text.extend(&chars[start..index.min(chars.len())]);
                }
                continue;
            }
            '\'' if at(index + 2) == Some('\'') => {
                if let Some((_, text, _)) = open.as_mut() {
                    text.extend(&chars[index..index + 3]);
                }
                index += 3;
                continue;
            }
            '#' if open.is_none()
                && (at(index + 1) == Some('[')
                    || (at(index + 1) == Some('!') && at(index + 2) == Some('['))) =>
            {
                open = Some((line, "#[".to_owned(), 1));
                index += if at(index + 1) == Some('!') { 3 } else { 2 };
                continue;
            }
            _ => {}
        }
        if c == '\n' {
            line += 1;
        }
        if let Some((start, mut text, depth)) = open.take() {
            text.push(if c == '\n' { ' ' } else { c });
            let depth = match c {
                '[' => depth + 1,
                ']' => depth - 1,
                _ => depth,
            };
            if depth == 0 {
                found.push((start, text));
            } else {
                open = Some((start, text, depth));
            }
        }
        index += 1;
    }
    found
}

/// How many hashes open a raw string at the start of `rest` (just after its `r`), or `None` if
/// no raw string starts there.
fn raw_string_hashes(rest: &[char]) -> Option<usize> {
    let hashes = rest.iter().take_while(|c| **c == '#').count();
    (rest.get(hashes) == Some(&'"')).then_some(hashes)
}

/// What the line scanner is inside of.
enum Section {
    /// A dependency list such as `[dependencies]`: dependency name → (first line, inherits).
    Dependencies(BTreeMap<String, (usize, bool)>),
    /// One dependency as its own table, such as `[dependencies.foo]`.
    DependencyTable {
        /// Dependency name.
        name: String,
        /// Line of the section header.
        line: usize,
        /// Whether `workspace = true` was seen.
        inherits: bool,
    },
    /// The `[lints]` section.
    Lints,
    /// Any other section.
    Other,
}

/// Checks a member manifest: dependencies come from the workspace and lints are inherited.
///
/// TOML is scanned line by line, which is enough for manifests in this workspace's style.
pub fn check_manifest(path: &str, text: &str) -> Vec<Violation> {
    let mut violations = Vec::new();
    let mut section = Section::Other;
    let mut lints_inherited = false;
    for (index, raw) in text.lines().enumerate() {
        let line = strip_comment(raw).trim();
        if line.is_empty() {
            continue;
        }
        if line.starts_with('[') {
            close_section(path, section, &mut violations);
            section = open_section(line, index + 1);
            continue;
        }
        let Some((key, value)) = line.split_once('=') else {
            // Continuation of a multi-line array value.
            continue;
        };
        let key = key.trim().trim_matches('"');
        let value = value.trim();
        match &mut section {
            Section::Dependencies(dependencies) => {
                let (name, inherits) = match key.split_once('.') {
                    Some((name, "workspace")) => (name, value == "true"),
                    Some((name, _)) => (name, false),
                    None => (key, inline_table_inherits(value)),
                };
                let entry = dependencies
                    .entry(name.trim_matches('"').to_owned())
                    .or_insert((index + 1, false));
                entry.1 |= inherits;
            }
            Section::DependencyTable { inherits, .. } => {
                if key == "workspace" && value == "true" {
                    *inherits = true;
                }
            }
            Section::Lints => {
                if key == "workspace" && value == "true" {
                    lints_inherited = true;
                }
            }
            Section::Other => {}
        }
    }
    close_section(path, section, &mut violations);
    if !lints_inherited {
        violations.push(Violation::new(
            path,
            "workspace-lints",
            "the manifest must contain `[lints]` with `workspace = true`",
        ));
    }
    violations
}

/// Classifies a section header line such as `[dev-dependencies]` or `[dependencies.foo]`.
fn open_section(header: &str, line: usize) -> Section {
    if header.starts_with("[[") {
        return Section::Other;
    }
    let name = header.trim_start_matches('[').trim_end_matches(']').trim();
    if name == "lints" {
        return Section::Lints;
    }
    for section in DEPENDENCY_SECTIONS {
        // `[dependencies]` or `[target.'cfg(unix)'.dependencies]`.
        if name == *section || name.ends_with(&format!(".{section}")) {
            return Section::Dependencies(BTreeMap::new());
        }
        // `[dependencies.foo]` or `[target.'cfg(unix)'.dependencies.foo]`.
        let prefix = format!("{section}.");
        let dependency = name.strip_prefix(&prefix).or_else(|| {
            name.split_once(&format!(".{prefix}"))
                .map(|(_, dependency)| dependency)
        });
        if let Some(dependency) = dependency {
            return Section::DependencyTable {
                name: dependency.trim_matches('"').to_owned(),
                line,
                inherits: false,
            };
        }
    }
    Section::Other
}

/// Reports dependencies of a finished section that do not inherit from the workspace.
fn close_section(path: &str, section: Section, violations: &mut Vec<Violation>) {
    let pinned: Vec<(String, usize)> = match section {
        Section::Dependencies(dependencies) => dependencies
            .into_iter()
            .filter(|(_, (_, inherits))| !inherits)
            .map(|(name, (line, _))| (name, line))
            .collect(),
        Section::DependencyTable {
            name,
            line,
            inherits: false,
        } => vec![(name, line)],
        Section::DependencyTable { .. } | Section::Lints | Section::Other => Vec::new(),
    };
    for (name, line) in pinned {
        violations.push(Violation::new(
            format!("{path}:{line}"),
            "workspace-dependency",
            format!(
                "dependency `{name}` must use `workspace = true` (declare the version once in \
                 the root `[workspace.dependencies]`)"
            ),
        ));
    }
}

/// Whether an inline-table value such as `{ workspace = true, features = ["x"] }` inherits.
fn inline_table_inherits(value: &str) -> bool {
    let compact: String = value.chars().filter(|c| !c.is_whitespace()).collect();
    compact.starts_with('{')
        && compact
            .trim_start_matches('{')
            .trim_end_matches('}')
            .split(',')
            .any(|pair| pair == "workspace=true")
}

/// Cuts a `#` comment off a TOML line, leaving `#` inside strings alone.
fn strip_comment(line: &str) -> &str {
    let mut quote = None;
    for (index, c) in line.char_indices() {
        match (quote, c) {
            (None, '#') => return &line[..index],
            (None, '"' | '\'') => quote = Some(c),
            (Some(open), _) if c == open => quote = None,
            _ => {}
        }
    }
    line
}

/// Adds the `.rs` files under `dir` to `files`, skipping `target` and hidden directories.
fn collect_rust_files(dir: &Path, files: &mut BTreeSet<PathBuf>) -> Result<()> {
    collect_files(dir, &["rs"], files)
}

/// Adds the files under `dir` with one of `extensions` to `files`, skipping `target` and hidden
/// directories.
fn collect_files(dir: &Path, extensions: &[&str], files: &mut BTreeSet<PathBuf>) -> Result<()> {
    let entries = fs::read_dir(dir).with_context(|| format!("failed to list {}", dir.display()))?;
    for entry in entries {
        let entry = entry.with_context(|| format!("failed to list {}", dir.display()))?;
        let path = entry.path();
        let file_type = entry
            .file_type()
            .with_context(|| format!("failed to stat {}", path.display()))?;
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if file_type.is_dir() {
            if name != "target" && !name.starts_with('.') {
                collect_files(&path, extensions, files)?;
            }
        } else if file_type.is_file()
            && path
                .extension()
                .is_some_and(|ext| extensions.iter().any(|wanted| ext == *wanted))
        {
            files.insert(path);
        }
    }
    Ok(())
}

/// Reads a text file.
fn read(path: &Path) -> Result<String> {
    fs::read_to_string(path).with_context(|| format!("failed to read {}", path.display()))
}

/// A path relative to the workspace root, for messages.
fn display_path(root: &Path, path: &Path) -> String {
    path.strip_prefix(root)
        .unwrap_or(path)
        .display()
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The real workspace passes every tidy rule; this is what makes plain `cargo test`
    /// enforce them.
    #[test]
    fn workspace_is_tidy() {
        let root = crate::workspace_root().expect("the workspace root is found");
        let violations = run(&root).expect("tidy can inspect the workspace");
        let report: Vec<String> = violations.iter().map(ToString::to_string).collect();
        assert!(
            violations.is_empty(),
            "tidy found violations:\n{}",
            report.join("\n")
        );
    }

    /// A synthetic package: its name and its dependencies as `(name, kind)`.
    type Package<'a> = (&'a str, &'a [(&'a str, Option<&'a str>)]);

    /// Builds synthetic `cargo metadata --no-deps` output.
    fn metadata(packages: &[Package<'_>]) -> Value {
        let packages: Vec<Value> = packages
            .iter()
            .map(|(name, dependencies)| {
                let dependencies: Vec<Value> = dependencies
                    .iter()
                    .map(|(dependency, kind)| {
                        serde_json::json!({ "name": dependency, "kind": kind, "req": "*" })
                    })
                    .collect();
                serde_json::json!({
                    "name": name,
                    "manifest_path": format!("/ws/crates/{name}/Cargo.toml"),
                    "dependencies": dependencies,
                    "targets": [{
                        "kind": ["lib"],
                        "name": name,
                        "src_path": format!("/ws/crates/{name}/src/lib.rs"),
                    }],
                })
            })
            .collect();
        serde_json::json!({ "packages": packages, "workspace_root": "/ws" })
    }

    fn edge_violations(packages: &[Package<'_>]) -> Vec<Violation> {
        let members = members(&metadata(packages)).expect("synthetic metadata parses");
        check_edges(&members)
    }

    #[test]
    fn allowed_edges_pass() {
        let violations = edge_violations(&[
            (
                "baton-run",
                &[("serde", None), ("baton-testkit", Some("dev"))],
            ),
            ("baton-testkit", &[("baton-run", None)]),
            ("baton", &[("baton-run", None)]),
            (
                "baton-tests",
                &[("baton", None), ("baton-testkit", None), ("tokio", None)],
            ),
            ("xtask", &[("anyhow", None)]),
        ]);
        assert_eq!(violations, Vec::new());
    }

    #[test]
    fn forbidden_normal_edge_fails() {
        let violations = edge_violations(&[
            ("baton-run", &[("baton", None)]),
            ("baton", &[("baton-run", None)]),
        ]);
        assert_eq!(violations.len(), 1, "{violations:?}");
        assert_eq!(violations[0].subject, "baton-run");
        assert!(violations[0].detail.contains("depends on `baton`"));
    }

    #[test]
    fn build_dependency_is_bound_like_a_normal_one() {
        let violations = edge_violations(&[
            ("baton-run", &[]),
            ("baton-tests", &[("baton-run", Some("build"))]),
        ]);
        assert_eq!(violations.len(), 1, "{violations:?}");
        assert_eq!(violations[0].subject, "baton-tests");
    }

    #[test]
    fn dev_dependencies_may_add_only_the_testkit() {
        let violations = edge_violations(&[
            ("baton-run", &[]),
            ("baton-testkit", &[("baton-run", None)]),
            ("baton", &[("baton-run", None)]),
            (
                "baton-workflow",
                &[
                    ("baton-run", Some("dev")),
                    ("baton-testkit", Some("dev")),
                    ("baton", Some("dev")),
                ],
            ),
        ]);
        assert_eq!(violations.len(), 1, "{violations:?}");
        assert_eq!(violations[0].subject, "baton-workflow");
        assert!(violations[0].detail.contains("dev-depends on `baton`"));
    }

    #[test]
    fn unknown_crate_fails() {
        let violations = edge_violations(&[("baton-magic", &[])]);
        assert_eq!(violations.len(), 1, "{violations:?}");
        assert!(violations[0].detail.starts_with("unknown crate"));
    }

    #[test]
    fn crate_doc_is_required() {
        assert!(check_crate_doc("a", "a/src/lib.rs", "\n//! Owns things.\n").is_empty());
        assert_eq!(
            check_crate_doc("a", "a/src/lib.rs", "// not a doc\n//! late\n").len(),
            1
        );
        assert_eq!(check_crate_doc("a", "a/src/lib.rs", "").len(), 1);
    }

    #[test]
    fn skipped_tests_are_found() {
        let source = format!("#[test]\n{IGNORE_ATTRIBUTE} = \"slow\"]\nfn slow() {{}}\n");
        let violations = check_no_ignore("t.rs", &source);
        assert_eq!(violations.len(), 1, "{violations:?}");
        assert_eq!(violations[0].subject, "t.rs:2");
        assert!(check_no_ignore("t.rs", "#[test]\nfn fast() {}\n").is_empty());
    }

    #[test]
    fn path_includes_outside_the_crate_fail() {
        let dir = Path::new("/ws/crates/a");
        let include = |target: &str| format!("{PATH_ATTRIBUTE} = \"{target}\"]\nmod shared;\n");
        let check =
            |file: &str, source: &str| check_path_includes(file, dir, &dir.join(file), source);
        assert_eq!(
            check("src/lib.rs", &include("generated/table.rs")),
            Vec::new()
        );
        assert_eq!(
            check("tests/it/main.rs", &include("../data/common.rs")),
            Vec::new()
        );
        let escaping = format!("//! Tests.\n\n{}", include("../../../b/tests/common.rs"));
        let violations = check("tests/it/engine.rs", &escaping);
        assert_eq!(violations.len(), 1, "{violations:?}");
        assert_eq!(violations[0].subject, "tests/it/engine.rs:3");
        assert_eq!(violations[0].rule, "path-include");
        assert_eq!(check("src/lib.rs", &include("../../b/src/x.rs")).len(), 1);
        assert_eq!(check("src/lib.rs", &include("/elsewhere/x.rs")).len(), 1);
        // Mentioned in a comment or a string, it is no attribute.
        let mentions = format!(
            "// {}const S: &str = \"{PATH_ATTRIBUTE} = \\\"../../x.rs\\\"]\";\n",
            include("../../x.rs")
        );
        assert_eq!(check("src/lib.rs", &mentions), Vec::new());
    }

    #[test]
    fn too_many_arguments_allowances_are_found() {
        let lint = TOO_MANY_ARGUMENTS;
        let source = format!(
            "#[allow({lint})]\nfn a() {{}}\n#[expect(\n    {lint},\n    reason = \"x\"\n)]\n\
             fn b() {{}}\n#![allow(dead_code, {lint})]\n#[cfg_attr(test, allow({lint}))]\n\
             // #[allow({lint})]\nconst S: &str = \"#[allow({lint})]\";\n\
             const R: &str = r#\"#[allow({lint})] \"quoted\" \"#;\n#[allow(dead_code)]\nfn c() {{}}\n"
        );
        let violations = check_too_many_arguments("f.rs", &source);
        let subjects: Vec<&str> = violations.iter().map(|v| v.subject.as_str()).collect();
        assert_eq!(
            subjects,
            ["f.rs:1", "f.rs:3", "f.rs:8", "f.rs:9"],
            "{violations:?}"
        );
        assert!(violations.iter().all(|v| v.rule == "too-many-arguments"));
    }

    #[test]
    fn long_source_files_are_found() {
        let at_limit = "x\n".repeat(MAX_SOURCE_LINES);
        assert_eq!(check_file_length("f.rs", &at_limit), Vec::new());
        let violations = check_file_length("f.rs", &(at_limit + "x\n"));
        assert_eq!(violations.len(), 1, "{violations:?}");
        assert_eq!(violations[0].rule, "file-length");
        assert!(violations[0].detail.starts_with("1001 lines"));
    }

    #[test]
    fn sleeps_outside_tests_are_found() {
        let nap = concat!("sle", "ep");
        let spin = concat!("yield", "_now");
        let source = format!(
            "fn a() {{\n    std::thread::{nap}(d);\n}}\nasync fn b() {{ tokio::time::{nap}(d).await }}\n\
             async fn c() {{ {nap}_until(t).await }}\nfn d() {{ let {nap}: Sleep = Sleep::Awake; }}\n\
             // we {nap}(nothing) in a comment\nasync fn f() {{ tokio::task::{spin}().await }}\n\
             #[cfg(test)]\nmod tests {{ fn e() {{ {nap}(d) }} }}\n"
        );
        let violations = check_no_sleep("f.rs", &source);
        let lines: Vec<&str> = violations.iter().map(|v| v.subject.as_str()).collect();
        assert_eq!(lines, ["f.rs:2", "f.rs:4", "f.rs:5", "f.rs:8"]);
        assert!(violations.iter().all(|v| v.rule == "no-sleep"));
    }

    #[test]
    fn sleeps_in_guide_code_blocks_are_found() {
        let nap = concat!("sle", "ep");
        let text = format!(
            "Prose may say {nap}(x).\n\n```rust\nfn a() {{ std::thread::{nap}(d) }}\n```\n\n\
             ```sh\nbaton ps\n```\n"
        );
        let violations = check_no_sleep_in_code_blocks("g.md", &text);
        let lines: Vec<&str> = violations.iter().map(|v| v.subject.as_str()).collect();
        assert_eq!(lines, ["g.md:4"]);
    }

    const GOOD_MANIFEST: &str = r#"
[package]
name = "baton-x"
version.workspace = true

[dependencies]
baton-run.workspace = true
serde = { workspace = true, features = ["derive"] } # comment with # inside
tokio.workspace = true
tokio.features = ["time"]

[dev-dependencies]
proptest = { workspace = true }

[target.'cfg(unix)'.dependencies.libc]
workspace = true

[lints]
workspace = true
"#;

    #[test]
    fn inherited_dependencies_and_lints_pass() {
        assert_eq!(check_manifest("Cargo.toml", GOOD_MANIFEST), Vec::new());
    }

    #[test]
    fn pinned_dependencies_fail() {
        let manifest = r#"
[dependencies]
serde = "1"
tokio = { version = "1", features = ["rt"] }
blake3.version = "1"
anyhow.workspace = true

[build-dependencies.cc]
version = "1"

[lints]
workspace = true
"#;
        let violations = check_manifest("Cargo.toml", manifest);
        let subjects: Vec<&str> = violations.iter().map(|v| v.subject.as_str()).collect();
        assert_eq!(
            subjects,
            [
                "Cargo.toml:5",
                "Cargo.toml:3",
                "Cargo.toml:4",
                "Cargo.toml:8"
            ],
            "{violations:?}"
        );
        assert!(violations.iter().all(|v| v.rule == "workspace-dependency"));
    }

    #[test]
    fn missing_workspace_lints_fail() {
        let manifest = "[package]\nname = \"x\"\n\n[lints.rust]\nunsafe_code = \"forbid\"\n";
        let violations = check_manifest("Cargo.toml", manifest);
        assert_eq!(violations.len(), 1, "{violations:?}");
        assert_eq!(violations[0].rule, "workspace-lints");
    }
}
