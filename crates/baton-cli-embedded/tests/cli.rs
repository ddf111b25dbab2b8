//! The host's own command line (`acme`, `baton_cli::main` over the host's
//! programs), run as a user runs it: every command a separate process on
//! one SQLite store, checked by what it prints and by what the store holds.
#![allow(missing_docs)]

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::time::Duration;

use baton::run::store::{AcquireRequest, Acquired, ListFilter, Store, TreeStatus};
use baton::run::{Clock, SystemClock, TreeId};
use baton::store::sqlite::SqliteStore;
use serde_json::Value;

struct Host {
    dir: tempfile::TempDir,
}

impl Host {
    fn new() -> Host {
        Host {
            dir: tempfile::tempdir().expect("temp dir"),
        }
    }

    fn command(&self, args: &[&str]) -> Command {
        let mut command = Command::new(env!("CARGO_BIN_EXE_acme"));
        command
            .current_dir(self.dir.path())
            .env_remove("ACME_LEDGER")
            .args(args)
            .stdin(Stdio::null());
        command
    }

    fn run(&self, args: &[&str]) -> Output {
        self.command(args).output().expect("the binary runs")
    }

    fn ok(&self, args: &[&str]) -> String {
        let output = self.run(args);
        assert!(
            output.status.success(),
            "acme {args:?} failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8(output.stdout).expect("utf-8")
    }

    /// A command that must fail with one `error:` line on stderr.
    fn fails(&self, args: &[&str]) -> String {
        let output = self.run(args);
        assert!(!output.status.success(), "acme {args:?} succeeded");
        error_line(&output.stderr)
    }

    fn json(&self, args: &[&str]) -> Value {
        serde_json::from_str(self.ok(args).trim()).expect("one JSON document")
    }

    fn json_lines(&self, args: &[&str]) -> Vec<Value> {
        self.ok(args)
            .lines()
            .map(|line| serde_json::from_str(line).expect("a JSON line"))
            .collect()
    }

    /// Starts `acme ARGS` in the background and returns once its provider
    /// call reported `marker` on stderr (the call is then in flight).
    fn spawn_until(&self, args: &[&str], marker: &str) -> Child {
        let mut child = self
            .command(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawns");
        let stderr = child.stderr.take().expect("stderr");
        let mut lines = BufReader::new(stderr).lines();
        loop {
            let line = lines
                .next()
                .expect("the call reports before the process ends")
                .expect("reads stderr");
            if line.contains(marker) {
                break;
            }
        }
        // Keep draining stderr on a thread, so the child never blocks on it.
        std::thread::spawn(move || lines.for_each(drop));
        child
    }

    fn ledger(&self) -> Vec<String> {
        std::fs::read_to_string(self.dir.path().join("ledger.txt"))
            .unwrap_or_default()
            .lines()
            .map(str::to_owned)
            .collect()
    }

    fn store_path(&self) -> PathBuf {
        self.dir.path().join("baton.db")
    }

    /// The store's own listing of the tree, read without the command line.
    fn stored_status(&self, tree: &str) -> TreeStatus {
        let store = SqliteStore::open(self.store_path()).expect("the store opens");
        let tree: TreeId = tree.parse().expect("a tree id");
        runtime().block_on(async {
            let listing = store.list(ListFilter::default()).await.expect("lists");
            listing
                .trees
                .iter()
                .find(|meta| meta.tree == tree)
                .expect("the tree is stored")
                .status
        })
    }

    /// Whether another engine could take the tree's lease now, without
    /// force. The probe's lease lasts a millisecond, so it is gone again
    /// by the next command.
    fn lease_is_free(&self, tree: &str) -> bool {
        let store = SqliteStore::open(self.store_path()).expect("the store opens");
        let tree: TreeId = tree.parse().expect("a tree id");
        runtime().block_on(async {
            let acquired = store
                .acquire(AcquireRequest {
                    tree,
                    owner: "probe-host/1/engine-1".to_owned(),
                    now: SystemClock.now(),
                    ttl: Duration::from_millis(1),
                    force: false,
                })
                .await
                .expect("the store answers");
            matches!(acquired, Acquired::Granted { .. })
        })
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime")
}

fn error_line(stderr: &[u8]) -> String {
    let stderr = String::from_utf8(stderr.to_vec()).expect("utf-8");
    let errors: Vec<&str> = stderr
        .lines()
        .filter(|line| line.starts_with("error: "))
        .collect();
    assert_eq!(errors.len(), 1, "one error line: {stderr:?}");
    assert!(!stderr.contains("panicked"), "{stderr:?}");
    errors[0].to_owned()
}

fn wait_and_kill(mut child: Child) {
    child.kill().expect("SIGKILL");
    child.wait().expect("reaped");
}

fn interrupt(child: &Child) {
    let status = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .expect("kill runs");
    assert!(status.success());
}

fn exit(mut child: Child) -> (ExitStatus, String) {
    let mut stdout = String::new();
    if let Some(mut out) = child.stdout.take() {
        std::io::Read::read_to_string(&mut out, &mut stdout).expect("reads stdout");
    }
    (child.wait().expect("exits"), stdout)
}

/// The open waits of a tree as `inspect --json` shows them.
fn open_waits(view: &Value) -> Vec<String> {
    view["processes"]
        .as_array()
        .expect("processes")
        .iter()
        .flat_map(|process| {
            process["open_waits"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        })
        .map(|wait| wait["id"].as_str().expect("a wait id").to_owned())
        .collect()
}

fn unknown_effects(view: &Value) -> Vec<String> {
    view["processes"]
        .as_array()
        .expect("processes")
        .iter()
        .flat_map(|process| {
            process["unknown_effects"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        })
        .map(|effect| effect.as_str().expect("an effect id").to_owned())
        .collect()
}

const REFUND: &str = r#"{"order":"o-1","amount_cents":500}"#;

#[test]
fn start_waits_for_approval_and_answer_completes_the_refund() {
    let host = Host::new();
    let programs = host.json_lines(&["programs", "--json"]);
    let names: Vec<&str> = programs
        .iter()
        .map(|program| program["name"].as_str().expect("name"))
        .collect();
    assert_eq!(names, ["acme.refund", "acme.charge"]);

    // The refund opens its approval wait, and the command returns there.
    let view = host.json(&["start", "acme.refund", REFUND, "--id", "refund-1", "--json"]);
    assert_eq!(view["status"], "waiting");
    assert_eq!(view["scope"], "acme", "the registry's default scope");
    let tree = view["tree"].as_str().expect("tree").to_owned();
    let waits = open_waits(&view);
    assert_eq!(waits.len(), 1, "{view}");
    assert_eq!(host.stored_status(&tree), TreeStatus::Waiting);
    assert!(host.ledger().is_empty(), "nothing moves before approval");

    // The same start id is the same tree.
    let again = host.ok(&["start", "acme.refund", REFUND, "--id", "refund-1"]);
    assert!(
        again.starts_with(&format!(
            "(start id refund-1 names an existing tree: {tree})"
        )),
        "{again}"
    );
    let inspect = host.ok(&["inspect", &tree]);
    assert!(
        inspect.contains(&format!(
            "open wait {} (key approval): answer with `acme answer {tree} --wait {} JSON`",
            waits[0], waits[0]
        )),
        "{inspect}"
    );

    let done = host.ok(&[
        "answer",
        &tree,
        "--wait",
        &waits[0],
        r#"{"decision":"approve"}"#,
    ]);
    assert_eq!(done, "{\"receipt\":\"r-o-1\"}\n");
    assert_eq!(host.stored_status(&tree), TreeStatus::Done);
    let ledger = host.ledger();
    assert_eq!(ledger.len(), 1, "{ledger:?}");
    assert!(ledger[0].ends_with(" o-1 500 r-o-1"), "{ledger:?}");
    let listed = host.json_lines(&["ps", "--status", "done", "--json"]);
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0]["tree"], tree.as_str());
    assert!(
        host.ok(&["log", &tree, "--verify"])
            .contains("hash chain intact")
    );
}

#[test]
fn watch_follows_a_tree_answered_by_another_process_until_it_ends() {
    let host = Host::new();
    let view = host.json(&["start", "acme.refund", REFUND, "--json"]);
    let tree = view["tree"].as_str().expect("tree").to_owned();
    let wait = open_waits(&view).remove(0);
    let head = view["head_seq"].as_u64().expect("head_seq");

    let mut watcher = host
        .command(&["watch", &tree, "--json"])
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawns");
    let mut lines = BufReader::new(watcher.stdout.take().expect("stdout")).lines();
    let mut events: Vec<Value> = Vec::new();
    // The facts committed so far come first, from the log.
    while events.len() < usize::try_from(head).expect("small") {
        let line = lines.next().expect("an event").expect("reads");
        events.push(serde_json::from_str(&line).expect("a JSON event"));
    }
    host.ok(&[
        "answer",
        &tree,
        "--wait",
        &wait,
        r#"{"decision":"approve"}"#,
    ]);
    // The rest arrive as the other process commits them; the stream ends
    // with the finished tree.
    for line in lines {
        events.push(serde_json::from_str(&line.expect("reads")).expect("a JSON event"));
    }
    assert!(watcher.wait().expect("exits").success());
    let seqs: Vec<u64> = events
        .iter()
        .filter_map(|event| event["seq"].as_u64())
        .collect();
    let expected: Vec<u64> = (1..=seqs.len() as u64).collect();
    assert_eq!(seqs, expected, "every fact once, in order");
    assert!(seqs.len() as u64 > head, "{events:?}");
    let last = events.last().expect("events");
    assert_eq!(last["kind"], "terminated", "{last}");
    assert_eq!(last["data"]["status"], "completed", "{last}");
    assert!(last["data"]["output"].is_object(), "{last}");
    assert_eq!(host.stored_status(&tree), TreeStatus::Done);
}

#[test]
fn refused_answers_change_nothing_and_name_the_next_command() {
    let host = Host::new();
    let view = host.json(&["start", "acme.refund", REFUND, "--json"]);
    let tree = view["tree"].as_str().expect("tree").to_owned();
    let wait = open_waits(&view).remove(0);
    let before = host.json_lines(&["log", &tree, "--json"]).len();

    let invalid = host.fails(&["answer", &tree, "--wait", &wait, r#"{"decision":"maybe"}"#]);
    assert!(
        invalid.contains("engine.signal.answer.invalid"),
        "{invalid}"
    );
    let unknown = host.fails(&[
        "answer",
        &tree,
        "--wait",
        "w_00000000000000000000000000000000",
        r#"{"decision":"approve"}"#,
    ]);
    assert_eq!(
        unknown,
        format!(
            "error: tree {tree} has no wait w_00000000000000000000000000000000; its open wait is \
             {wait} (key approval): `acme answer {tree} --wait {wait} JSON`"
        )
    );
    let missing = host.fails(&["start", "acme.unknown", "{}"]);
    assert!(missing.contains("engine.program.unknown"), "{missing}");
    assert!(missing.contains("`acme programs`"), "{missing}");
    let other_scope = host.fails(&["--scope", "globex", "inspect", &tree]);
    assert!(
        other_scope.contains("engine.scope.mismatch"),
        "{other_scope}"
    );

    assert_eq!(host.json_lines(&["log", &tree, "--json"]).len(), before);
    assert_eq!(host.stored_status(&tree), TreeStatus::Waiting);
}

#[test]
fn ps_columns_stay_aligned_whatever_the_scope() {
    let host = Host::new();
    host.ok(&["start", "acme.refund", REFUND, "--detach"]);
    host.ok(&[
        "--scope",
        "a-tenant-with-a-long-name/some-user/session-42",
        "start",
        "acme.refund",
        REFUND,
        "--detach",
    ]);
    let ps = host.ok(&["ps"]);
    let lines: Vec<&str> = ps.lines().collect();
    assert_eq!(lines.len(), 3, "{ps}");
    let status_at = lines[0].find("STATUS").expect("a STATUS column");
    let updated_at = lines[0].find("UPDATED").expect("an UPDATED column");
    for row in &lines[1..] {
        assert!(
            row[status_at..].starts_with("waiting") || row[status_at..].starts_with("running"),
            "{ps}"
        );
        assert!(row[updated_at..].starts_with("20"), "{ps}");
    }
}

#[test]
fn cancel_ends_a_tree_waiting_for_approval() {
    let host = Host::new();
    let view = host.json(&["start", "acme.refund", REFUND, "--json"]);
    let tree = view["tree"].as_str().expect("tree").to_owned();
    let canceled = host.ok(&["cancel", &tree, "--reason", "customer withdrew"]);
    assert!(canceled.contains("status done"), "{canceled}");
    assert!(
        canceled.contains("ended canceled (host cancellation)"),
        "{canceled}"
    );
    assert!(canceled.contains("customer withdrew"), "{canceled}");
    assert_eq!(host.stored_status(&tree), TreeStatus::Done);
    let again = host.fails(&["cancel", &tree]);
    assert!(again.contains("engine.control.terminated"), "{again}");
    assert!(host.ledger().is_empty());
}

#[test]
fn a_tree_held_by_a_live_process_is_refused_with_when_and_how_to_take_it() {
    let host = Host::new();
    let child = host.spawn_until(
        &[
            "start",
            "acme.charge",
            r#"{"order":"o-7","amount_cents":100,"delay_ms":600000}"#,
        ],
        "acme: moving money",
    );
    let tree = host.json_lines(&["ps", "--json"])[0]["tree"]
        .as_str()
        .expect("tree")
        .to_owned();
    // A cancellation reaches the live holder through the tree's inbox.
    let cancelled = host.ok(&["cancel", &tree]);
    assert!(cancelled.contains(&format!("tree {tree}")), "{cancelled}");
    // Taking the tree is refused while its lease is live, saying when it
    // expires and how to take it anyway.
    let recovered = host.run(&["recover"]);
    wait_and_kill(child);
    assert!(!recovered.status.success());
    let held = String::from_utf8(recovered.stdout).expect("utf-8");
    assert!(held.contains("engine.lease.held"), "{held}");
    assert!(
        held.contains(" UTC, in "),
        "says when the lease expires: {held}"
    );
    assert!(
        held.trim_end()
            .ends_with("or take the tree now with `acme recover --force`"),
        "{held}"
    );
}

#[test]
fn a_detached_start_is_committed_and_left_to_recover() {
    let host = Host::new();
    let started = host.ok(&["start", "acme.refund", REFUND, "--detach"]);
    assert!(started.contains("(detached: `acme recover`"), "{started}");
    let tree = started
        .split_whitespace()
        .nth(1)
        .expect("the tree id")
        .to_owned();
    assert_eq!(host.json_lines(&["ps", "--json"]).len(), 1);
    let recovered = host.ok(&["recover"]);
    assert_eq!(
        recovered
            .lines()
            .next()
            .map(|line| line.starts_with(&format!("{tree}  recovered, now waiting"))),
        Some(true),
        "{recovered}"
    );
    assert_eq!(host.stored_status(&tree), TreeStatus::Waiting);
}

#[test]
fn sigint_lets_the_call_in_flight_settle_then_releases_the_lease() {
    let host = Host::new();
    let child = host.spawn_until(
        &[
            "start",
            "acme.charge",
            r#"{"order":"o-2","amount_cents":900,"delay_ms":1500}"#,
            "--id",
            "charge-2",
        ],
        "acme: moving money",
    );
    interrupt(&child);
    let (status, _) = exit(child);
    assert_eq!(status.code(), Some(130), "128 + SIGINT");
    // The call in flight settled within the grace: it ran exactly once and
    // its outcome is committed, so nothing is unknown.
    assert_eq!(host.ledger().len(), 1);
    let ps = host.json_lines(&["ps", "--json"]);
    let tree = ps[0]["tree"].as_str().expect("tree").to_owned();
    assert!(host.lease_is_free(&tree), "the lease was released");
    let view = host.json(&["inspect", &tree, "--json"]);
    assert!(unknown_effects(&view).is_empty(), "{view}");

    let recovered = host.ok(&["recover"]);
    assert!(
        recovered.starts_with(&format!("{tree}  recovered, now done")),
        "{recovered}"
    );
    assert_eq!(host.ledger().len(), 1, "never charged twice");
    assert_eq!(host.stored_status(&tree), TreeStatus::Done);
}

#[test]
fn the_sigint_message_says_where_the_tree_continues() {
    let host = Host::new();
    let child = host
        .command(&[
            "start",
            "acme.charge",
            r#"{"order":"o-3","amount_cents":100,"delay_ms":800}"#,
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawns");
    let mut child = child;
    let stderr = child.stderr.take().expect("stderr");
    let mut lines = BufReader::new(stderr).lines();
    for line in lines.by_ref() {
        if line.expect("reads").contains("acme: moving money") {
            break;
        }
    }
    interrupt(&child);
    let rest: Vec<String> = lines.map(|line| line.expect("reads")).collect();
    let (status, _) = exit(child);
    assert_eq!(status.code(), Some(130));
    let error = error_line(rest.join("\n").as_bytes());
    assert!(
        error.starts_with("error: interrupted (SIGINT) before tree p_"),
        "{error}"
    );
    assert!(
        error.ends_with("it continues on the next `acme recover` or in a worker"),
        "{error}"
    );
}

#[test]
fn timeout_stops_waiting_and_the_tree_continues_on_recover() {
    let host = Host::new();
    let output = host.run(&[
        "start",
        "acme.charge",
        r#"{"order":"o-4","amount_cents":100,"delay_ms":2500}"#,
        "--timeout",
        "1s",
    ]);
    assert_eq!(output.status.code(), Some(1));
    let error = error_line(&output.stderr);
    assert!(
        error.starts_with("error: stopped waiting after --timeout 1s before tree p_"),
        "{error}"
    );
    assert_eq!(host.ledger().len(), 1, "the call settled within the grace");
    let recovered = host.ok(&["recover"]);
    assert!(recovered.contains("recovered, now done"), "{recovered}");
    assert_eq!(host.ledger().len(), 1);
}

#[test]
fn a_call_lost_in_a_crash_is_unknown_until_resolved() {
    let host = Host::new();
    let child = host.spawn_until(
        &[
            "start",
            "acme.charge",
            r#"{"order":"o-5","amount_cents":700,"delay_ms":600000}"#,
        ],
        "acme: moving money",
    );
    wait_and_kill(child);
    let tree = host.json_lines(&["ps", "--json"])[0]["tree"]
        .as_str()
        .expect("tree")
        .to_owned();

    // The call may or may not have happened: it is never sent again.
    let recovered = host.ok(&["recover"]);
    assert!(
        recovered.starts_with(&format!("{tree}  recovered, now needs_attention")),
        "{recovered}"
    );
    assert_eq!(host.stored_status(&tree), TreeStatus::NeedsAttention);
    let view = host.json(&["inspect", &tree, "--json"]);
    let unknown = unknown_effects(&view);
    assert_eq!(unknown.len(), 1, "{view}");
    assert!(host.ok(&["inspect", &tree]).contains(&format!(
        "unknown effect {}: resolve with `acme resolve {tree} --effect {} JSON`",
        unknown[0], unknown[0]
    )));
    assert!(host.ledger().is_empty());

    // A wrong effect id names the right one.
    let wrong = host.fails(&[
        "resolve",
        &tree,
        "--effect",
        "e_00000000000000000000000000000000",
        r#"{"receipt":"r-x"}"#,
    ]);
    assert!(wrong.contains("engine.effect.not_unknown"), "{wrong}");
    assert!(
        wrong.contains(&format!("its unknown effect is {}", unknown[0])),
        "{wrong}"
    );

    // The operator checked with the provider: the charge went through.
    let resolved = host.ok(&[
        "resolve",
        &tree,
        "--effect",
        &unknown[0],
        r#"{"receipt":"r-manual"}"#,
    ]);
    assert!(resolved.contains("status done"), "{resolved}");
    assert!(
        resolved.contains(r#"output {"receipt":"r-manual"}"#),
        "{resolved}"
    );
    assert_eq!(host.stored_status(&tree), TreeStatus::Done);
    assert!(host.ledger().is_empty(), "resolving sends nothing");
}

#[test]
fn recover_settles_a_lost_call_the_hosts_ledger_shows() {
    let host = Host::new();
    // The provider moved the money, then the process died before the
    // answer came back.
    let child = host.spawn_until(
        &[
            "start",
            "acme.charge",
            r#"{"order":"o-6","amount_cents":300,"hold_ms":600000}"#,
        ],
        "acme: moved money",
    );
    wait_and_kill(child);
    let recovered = host.ok(&["recover"]);
    let lines: Vec<&str> = recovered.lines().collect();
    assert_eq!(lines.len(), 2, "{recovered}");
    assert!(lines[0].contains("recovered, now done"), "{recovered}");
    assert!(
        lines[1].starts_with("  resolved e_")
            && lines[1].ends_with(", a payment the ledger shows was made"),
        "{recovered}"
    );
    assert_eq!(host.ledger().len(), 1, "never charged twice");
    assert_eq!(
        host.ok(&["recover"]),
        "nothing to recover: every tree in the store has finished\n"
    );
}

#[test]
fn completions_describe_the_host_command_line() {
    let host = Host::new();
    let script = host.ok(&["completions", "bash"]);
    assert!(script.contains("acme"), "{script}");
    assert!(script.contains("recover"), "{script}");
    assert!(!script.contains("demo"), "the host has no demo subcommand");
}
