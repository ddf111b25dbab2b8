//! The `baton` binary, run as a user would: the demo and the strategy demos,
//! the pause → answer flow across processes, recovery after SIGKILL (also of
//! a strategy demo stopped mid-run), every subcommand, and bad input that
//! must fail with one clear line and change nothing.
#![allow(missing_docs)]

use std::io::{BufRead, BufReader};
use std::process::{Command, Output, Stdio};

use baton_examples::strategies::Scenario;
use serde_json::Value;

#[cfg(feature = "otel")]
mod otel;

const EXPECTED: &str =
    "coordinator continued while input was pending; reviewed: inspect deployment";

struct Dir {
    dir: tempfile::TempDir,
}

impl Dir {
    fn new() -> Dir {
        Dir {
            dir: tempfile::tempdir().expect("temp dir"),
        }
    }

    fn baton(&self, args: &[&str]) -> Output {
        Command::new(env!("CARGO_BIN_EXE_baton"))
            .current_dir(self.dir.path())
            .args(args)
            .stdin(Stdio::null())
            .output()
            .expect("the binary runs")
    }

    fn ok(&self, args: &[&str]) -> String {
        let output = self.baton(args);
        assert!(
            output.status.success(),
            "baton {args:?} failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8(output.stdout).expect("utf-8")
    }

    /// Runs a command that must fail: one line on stderr, non-zero exit.
    fn fails(&self, args: &[&str]) -> String {
        let output = self.baton(args);
        assert!(!output.status.success(), "baton {args:?} succeeded");
        let stderr = String::from_utf8(output.stderr).expect("utf-8");
        assert_eq!(stderr.lines().count(), 1, "one line on stderr: {stderr:?}");
        assert!(stderr.starts_with("error: "), "{stderr:?}");
        assert!(!stderr.contains("panicked"), "{stderr:?}");
        stderr
    }

    fn json_lines(&self, args: &[&str]) -> Vec<Value> {
        self.ok(args)
            .lines()
            .map(|line| serde_json::from_str(line).expect("a JSON line"))
            .collect()
    }

    fn head_seq(&self, tree: &str) -> usize {
        self.json_lines(&["log", tree, "--json"]).len()
    }
}

/// Replaces ids, digests and times so output can be compared.
fn redact(text: &str) -> String {
    let mut out = String::new();
    let mut rest = text;
    while let Some(position) = rest.find(['p', 'w', 'e', 'b']) {
        let (before, candidate) = rest.split_at(position);
        out.push_str(before);
        let prefix_len = if candidate.starts_with("b3:") { 3 } else { 2 };
        let is_id = ["p_", "w_", "e_", "b3:"]
            .iter()
            .any(|p| candidate.starts_with(p))
            && candidate[prefix_len..]
                .chars()
                .take_while(char::is_ascii_hexdigit)
                .count()
                >= 32;
        if is_id {
            let len = prefix_len
                + candidate[prefix_len..]
                    .chars()
                    .take_while(char::is_ascii_hexdigit)
                    .count();
            out.push_str(&candidate[..prefix_len]);
            out.push('…');
            rest = &candidate[len..];
        } else {
            out.push_str(&candidate[..1]);
            rest = &candidate[1..];
        }
    }
    out.push_str(rest);
    out
}

#[test]
fn the_demo_prints_the_worked_example_and_a_summary_from_the_run() {
    let dir = Dir::new();
    let first = dir.ok(&["demo"]);
    assert_eq!(first.lines().next(), Some(EXPECTED));
    assert!(first.contains("\nturns   4\n"), "{first}");
    assert!(
        first.contains("\ntasks   2 (input canceled, review completed)\n"),
        "{first}"
    );
    // A second run is a new collaboration.
    let second = dir.ok(&["demo", "--json"]);
    let summary: Value = serde_json::from_str(second.trim()).expect("json");
    assert_eq!(summary["output"], EXPECTED);
    let trees = dir.json_lines(&["ps", "--json"]);
    assert_eq!(trees.len(), 2);
    assert!(trees.iter().all(|t| t["status"] == "done"));
    // The summary's counts are the tree's.
    let view: Value = serde_json::from_str(&dir.ok(&[
        "inspect",
        summary["tree"].as_str().expect("tree"),
        "--json",
    ]))
    .expect("json");
    let children = view["processes"][0]["children"]
        .as_object()
        .expect("children");
    let turns = children
        .keys()
        .filter(|k| k.starts_with("team.turn."))
        .count();
    assert_eq!(summary["turns"], turns);
    assert_eq!(summary["tasks"], children.len() - turns);
}

#[test]
fn pause_then_answer_in_another_process_completes_with_the_answer() {
    let dir = Dir::new();
    let paused: Value =
        serde_json::from_str(dir.ok(&["demo", "--pause", "--json"]).trim()).expect("json");
    let (tree, wait) = (
        paused["tree"].as_str().expect("tree"),
        paused["wait"].as_str().expect("wait"),
    );
    let waiting = dir.json_lines(&["ps", "--status", "waiting", "--json"]);
    assert_eq!(waiting.len(), 1);
    let inspect = redact(&dir.ok(&["inspect", tree]));
    assert!(
        inspect.contains("open wait w_… (key coordination.input)"),
        "{inspect}"
    );
    let answered = dir.ok(&["answer", tree, "--wait", wait, "\"ship it\""]);
    assert!(
        answered.starts_with("release 1.4: done as instructed (ship it)"),
        "{answered}"
    );
    assert_eq!(
        dir.json_lines(&["ps", "--status", "done", "--json"]).len(),
        1
    );
    // The acknowledgement was lost; the operator answers again: the same
    // answer is a duplicate, another one is refused.
    let again = dir.ok(&["answer", tree, "--wait", wait, "\"ship it\""]);
    assert!(
        again.starts_with("(this answer was already delivered)"),
        "{again}"
    );
    let other = dir.fails(&["answer", tree, "--wait", wait, "\"roll back\""]);
    assert!(other.contains("already answered"), "{other}");
    let verified = dir.ok(&["log", tree, "--verify"]);
    assert!(
        verified.contains("log verified: records 1 to "),
        "{verified}"
    );
}

#[test]
fn inspect_and_ps_output_is_stable() {
    let dir = Dir::new();
    let paused: Value =
        serde_json::from_str(dir.ok(&["demo", "--pause", "--json"]).trim()).expect("json");
    let tree = paused["tree"].as_str().expect("tree");
    // Columns are as wide as their values: the id is 34 characters, so the
    // header's TREE column is 36 wide; the update time is a date in UTC with
    // how long ago it was.
    let ps = dir.ok(&["ps"]);
    let lines: Vec<&str> = ps.lines().collect();
    assert_eq!(lines.len(), 2, "{ps}");
    // (The UPDATED column is as wide as its date and age, so only its
    // start is fixed.)
    assert!(
        lines[0].starts_with(&format!(
            "{:<36}SCOPE  PROGRAM     VERSION          STATUS   UPDATED ",
            "TREE"
        )),
        "{ps}"
    );
    assert!(lines[0].ends_with(" LABELS"), "{ps}");
    let row = redact(lines[1]);
    assert!(row.starts_with("p_…  demo   demo.pause  b3:"), "{row}");
    assert!(row.contains("  waiting  20"), "{row}");
    assert!(
        row.ends_with(" UTC, just now") || row.ends_with("s ago"),
        "{row}"
    );
    let inspect = redact(&dir.ok(&["inspect", tree]));
    // The second line names the root program's exact version and when the
    // tree started.
    let mut inspect_lines: Vec<&str> = inspect.lines().collect();
    let program = inspect_lines.remove(1);
    assert!(
        program.starts_with("program demo.pause (version b3:") && program.contains("  started 20"),
        "{program}"
    );
    let inspect = format!("{}\n", inspect_lines.join("\n"));
    let expected = "\
tree p_…  scope demo  status waiting  log 9 records
(root) demo.pause p_… [waiting]  steps 2, effects 4, signals 4
  instruction demo.instruction p_… [waiting]  steps 2/64, effects 1/32, signals 1/64
    open wait w_… (key coordination.input): answer with `baton answer p_… --wait w_… JSON`
  team.turn.1 demo.pause_coordinator p_… [completed]  steps 1/64, effects 0/32, signals 0/64
    ended completed (completion) output {\"mode\":\"wait\",\"state\":\"release 1.4\",\"tasks\":[{\"input\":\"What should the team deploy?\",\"key\":\"instruction\",\"worker\":\"demo.instruction\"}]}
";
    assert_eq!(inspect, expected);
}

#[test]
fn recover_takes_over_a_tree_whose_process_was_killed_while_the_gate_was_open() {
    let dir = Dir::new();
    let mut child = Command::new(env!("CARGO_BIN_EXE_baton"))
        .current_dir(dir.dir.path())
        .args(["demo", "--pause", "--hold", "--json"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawns");
    let mut line = String::new();
    BufReader::new(child.stdout.take().expect("stdout"))
        .read_line(&mut line)
        .expect("reads");
    let paused: Value = serde_json::from_str(line.trim()).expect("json");
    child.kill().expect("SIGKILL");
    child.wait().expect("reaped");
    let (tree, wait) = (
        paused["tree"].as_str().expect("tree"),
        paused["wait"].as_str().expect("wait"),
    );
    let recovered = dir.ok(&["recover"]);
    assert!(recovered.contains("recovered, now waiting"), "{recovered}");
    let answered = dir.ok(&["answer", tree, "--wait", wait, "\"roll back\""]);
    assert!(answered.contains("(roll back)"), "{answered}");
}

#[test]
fn cancel_and_resolve_report_their_outcome() {
    let dir = Dir::new();
    let paused: Value =
        serde_json::from_str(dir.ok(&["demo", "--pause", "--json"]).trim()).expect("json");
    let tree = paused["tree"].as_str().expect("tree");
    // Nothing is unknown in this tree: resolving a made-up effect is refused.
    let error = dir.fails(&[
        "resolve",
        tree,
        "--effect",
        "e_00000000000000000000000000000000",
        "1",
    ]);
    assert!(error.contains("engine.effect.not_unknown"), "{error}");
    let canceled = dir.ok(&["cancel", tree, "--reason", "not needed"]);
    assert!(canceled.contains("status done"), "{canceled}");
    assert!(
        canceled.contains("ended canceled (host cancellation)"),
        "{canceled}"
    );
}

#[test]
fn bad_input_fails_with_one_clear_line_and_changes_nothing() {
    let dir = Dir::new();
    // A missing store.
    assert!(dir.fails(&["ps"]).contains("no store at"));
    // An unusable path: its parent is a regular file (fails even as root).
    let file = dir.dir.path().join("plain-file");
    std::fs::write(&file, b"not a directory").expect("writes");
    let unusable = file.join("baton.db");
    let unusable = unusable.to_str().expect("utf-8");
    assert!(dir.fails(&["--store", unusable, "demo"]).contains("cannot"));

    let paused: Value =
        serde_json::from_str(dir.ok(&["demo", "--pause", "--json"]).trim()).expect("json");
    let (tree, wait) = (
        paused["tree"].as_str().expect("tree"),
        paused["wait"].as_str().expect("wait"),
    );
    let before = dir.head_seq(tree);

    assert!(
        dir.fails(&["--scope", "other", "inspect", tree])
            .contains("engine.scope.mismatch")
    );
    assert!(
        dir.fails(&["--scope", "other", "answer", tree, "--wait", wait, "\"x\""])
            .contains("engine.scope.mismatch")
    );
    assert!(
        dir.fails(&["inspect", "p_00000000000000000000000000000000"])
            .contains("engine.tree.not_found")
    );
    assert!(
        dir.fails(&["inspect", "not-an-id"])
            .contains("is not a tree id")
    );
    assert!(
        dir.fails(&["answer", tree, "--wait", wait, "{not json"])
            .contains("not valid JSON")
    );
    // Text the shell stripped of its quotes is refused with the way to
    // pass it as a JSON string; an empty answer with an example of one.
    assert!(
        dir.fails(&["answer", tree, "--wait", wait, "ship it"])
            .contains(r#"not valid JSON: malformed JSON: expected value at line 1 column 1; to pass it as a JSON string, keep its quotes: '"ship it"'"#)
    );
    assert!(
        dir.fails(&["answer", tree, "--wait", wait, ""])
            .contains(r#"give a JSON value, for example '"ship it"'"#)
    );
    assert!(
        !dir.fails(&["answer", tree, "--wait", wait, "{not json"])
            .contains("keep its quotes")
    );
    // The gate's answer schema is a string: a number is a schema violation.
    assert!(
        dir.fails(&["answer", tree, "--wait", wait, "42"])
            .contains("engine.signal.answer.invalid")
    );
    assert_eq!(dir.head_seq(tree), before, "nothing was written");

    dir.ok(&["answer", tree, "--wait", wait, "\"ship it\""]);
    let after = dir.head_seq(tree);
    assert!(
        dir.fails(&["answer", tree, "--wait", wait, "\"again\""])
            .contains("already answered")
    );
    assert_eq!(
        dir.head_seq(tree),
        after,
        "answering a closed wait wrote nothing"
    );

    // A corrupt store file is refused, not rewritten.
    let corrupt = dir.dir.path().join("corrupt.db");
    std::fs::write(&corrupt, vec![7u8; 8192]).expect("writes");
    let corrupt_text = corrupt.to_str().expect("utf-8");
    assert!(
        dir.fails(&["--store", corrupt_text, "ps"])
            .contains("cannot open the store")
    );
    assert_eq!(std::fs::read(&corrupt).expect("reads"), vec![7u8; 8192]);
}

#[test]
fn every_strategy_demo_prints_its_result_line() {
    let dir = Dir::new();
    for scenario in Scenario::ALL {
        assert_eq!(
            dir.ok(&["demo", scenario.name()]),
            format!("{}\n", scenario.expected())
        );
    }
    let routed: Value =
        serde_json::from_str(dir.ok(&["demo", "router", "--json"]).trim()).expect("json");
    assert_eq!(routed["scenario"], "router");
    assert_eq!(routed["line"], Scenario::Router.expected());
    assert_eq!(routed["output"]["agent"], "billing");
    let trees = dir.json_lines(&["ps", "--json"]);
    assert_eq!(trees.len(), 7);
    assert!(trees.iter().all(|t| t["status"] == "done"));
}

#[test]
fn recover_finishes_a_strategy_demo_killed_mid_run() {
    let dir = Dir::new();
    let mut child = Command::new(env!("CARGO_BIN_EXE_baton"))
        .current_dir(dir.dir.path())
        .args(["demo", "planner", "--crash-at", "2", "--hold", "--json"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawns");
    let mut line = String::new();
    BufReader::new(child.stdout.take().expect("stdout"))
        .read_line(&mut line)
        .expect("reads");
    let stopped: Value = serde_json::from_str(line.trim()).expect("json");
    assert_eq!(stopped["crashed"], true, "{line}");
    child.kill().expect("SIGKILL");
    child.wait().expect("reaped");
    let tree = stopped["tree"].as_str().expect("tree");
    assert!(
        dir.json_lines(&["ps", "--status", "done", "--json"])
            .is_empty(),
        "the run stopped mid-way"
    );
    let recovered = dir.ok(&["recover"]);
    assert!(
        recovered.starts_with(&format!("{tree}  recovered, now done")),
        "{recovered}"
    );
    assert!(
        recovered.ends_with(&format!("  {}\n", Scenario::Planner.expected())),
        "{recovered}"
    );
    assert!(dir.ok(&["log", tree, "--verify"]).contains("log verified"));
    assert_eq!(
        dir.ok(&["recover"]),
        "nothing to recover: every tree in the store has finished\n"
    );
}

/// A `baton serve` process and the address it serves on.
struct Serving {
    child: std::process::Child,
    base: String,
    stderr: std::sync::mpsc::Receiver<String>,
}

impl Serving {
    fn start(dir: &Dir) -> Serving {
        std::fs::write(
            dir.dir.path().join("tokens.txt"),
            "# scope token\ndemo 0123456789abcdef0123\n",
        )
        .expect("writes the tokens file");
        let mut child = Command::new(env!("CARGO_BIN_EXE_baton"))
            .current_dir(dir.dir.path())
            .args([
                "serve",
                "--listen",
                "127.0.0.1:0",
                "--tokens",
                "tokens.txt",
                "--grace",
                "5s",
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("serve starts");
        let (lines, stderr) = std::sync::mpsc::channel();
        let pipe = child.stderr.take().expect("stderr");
        std::thread::spawn(move || {
            for line in BufReader::new(pipe).lines() {
                let Ok(line) = line else { break };
                if lines.send(line).is_err() {
                    break;
                }
            }
        });
        let mut base = None;
        for line in stderr.iter() {
            if let Some(rest) = line.strip_prefix("serving the HTTP API on ") {
                base = rest.split_whitespace().next().map(str::to_owned);
            }
            if line.starts_with("ready:") {
                break;
            }
        }
        Serving {
            child,
            base: base.expect("serve printed its address"),
            stderr,
        }
    }
}

#[test]
fn serve_with_a_listener_but_no_tokens_says_how_to_give_them_and_creates_nothing() {
    let dir = Dir::new();
    let error = dir.fails(&["serve", "--listen", "127.0.0.1:0"]);
    assert!(error.contains("pass --tokens FILE"), "{error}");
    assert!(!dir.dir.path().join("baton.db").exists());
}

#[test]
fn serve_runs_the_http_api_for_the_pause_flow_and_stops_cleanly_on_sigint() {
    let dir = Dir::new();
    let mut serving = Serving::start(&dir);
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let client = reqwest::Client::new();
    let call = |method: reqwest::Method, path: String, body: Option<&'static str>| {
        let request = client
            .request(method, format!("{}{path}", serving.base))
            .bearer_auth("0123456789abcdef0123");
        let request = match body {
            Some(body) => request
                .header("content-type", "application/json")
                .body(body),
            None => request,
        };
        runtime.block_on(async {
            let response = request.send().await.expect("the host answers");
            let status = response.status().as_u16();
            let text = response.text().await.expect("a body");
            (status, text)
        })
    };
    let (status, text) = call(
        reqwest::Method::POST,
        "/v1/trees?until=wait_opened&timeout_ms=20000".to_owned(),
        Some(
            r#"{"program":"demo.pause","id":"served","input":"release 2.0","labels":{"team":"ops"}}"#,
        ),
    );
    assert_eq!(status, 201, "{text}");
    let started: Value = serde_json::from_str(&text).expect("json");
    let tree = started["tree"].as_str().expect("tree").to_owned();
    let wait = started["view"]["processes"]
        .as_array()
        .expect("processes")
        .iter()
        .find_map(|process| process["open_waits"][0]["id"].as_str())
        .expect("an open wait")
        .to_owned();
    // Another process reads the same store while the host holds the tree.
    let labelled = dir.json_lines(&["ps", "--label", "team=ops", "--json"]);
    assert_eq!(labelled.len(), 1);
    assert_eq!(labelled[0]["tree"], tree.as_str());
    assert_eq!(labelled[0]["program"], "demo.pause");
    assert!(
        dir.json_lines(&["ps", "--label", "team=dev", "--json"])
            .is_empty()
    );

    let (status, text) = call(
        reqwest::Method::POST,
        format!("/v1/trees/{tree}/waits/{wait}?until=terminal&timeout_ms=20000"),
        Some(r#""ship it""#),
    );
    assert_eq!(status, 200, "{text}");
    let answered: Value = serde_json::from_str(&text).expect("json");
    assert_eq!(answered["view"]["status"], "done", "{text}");

    // `watch` in another process and the host's event stream show the same
    // committed facts.
    let watched: Vec<u64> = dir
        .json_lines(&["watch", &tree, "--json"])
        .iter()
        .filter(|event| event["durable"] == true)
        .map(|event| event["seq"].as_u64().expect("seq"))
        .collect();
    let (status, stream) = call(
        reqwest::Method::GET,
        format!("/v1/trees/{tree}/events"),
        None,
    );
    assert_eq!(status, 200);
    let streamed: Vec<u64> = stream
        .lines()
        .filter_map(|line| line.strip_prefix("id: "))
        .map(|id| id.parse().expect("a sequence"))
        .collect();
    assert_eq!(watched, streamed);
    assert_eq!(
        watched,
        (1..=answered["view"]["head_seq"].as_u64().expect("head")).collect::<Vec<_>>()
    );

    let status = Command::new("kill")
        .args(["-INT", &serving.child.id().to_string()])
        .status()
        .expect("kill runs");
    assert!(status.success());
    let exited = serving.child.wait().expect("serve exits");
    assert!(exited.success(), "{exited:?}");
    let rest: Vec<String> = serving.stderr.iter().collect();
    assert!(
        rest.iter().any(|line| line.starts_with("stopped:")),
        "{rest:?}"
    );
}

#[test]
fn answer_from_the_command_line_reaches_a_tree_a_running_serve_holds() {
    let dir = Dir::new();
    let mut serving = Serving::start(&dir);
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let client = reqwest::Client::new();
    let call = |method: reqwest::Method, path: String, body: Option<&'static str>| {
        let request = client
            .request(method, format!("{}{path}", serving.base))
            .bearer_auth("0123456789abcdef0123");
        let request = match body {
            Some(body) => request
                .header("content-type", "application/json")
                .body(body),
            None => request,
        };
        runtime.block_on(async {
            let response = request.send().await.expect("the host answers");
            let status = response.status().as_u16();
            let text = response.text().await.expect("a body");
            (status, text)
        })
    };
    let (status, text) = call(
        reqwest::Method::POST,
        "/v1/trees?until=wait_opened&timeout_ms=20000".to_owned(),
        Some(r#"{"program":"demo.pause","id":"held","input":"release 3.0"}"#),
    );
    assert_eq!(status, 201, "{text}");
    let started: Value = serde_json::from_str(&text).expect("json");
    let tree = started["tree"].as_str().expect("tree").to_owned();
    let wait = started["view"]["processes"]
        .as_array()
        .expect("processes")
        .iter()
        .find_map(|process| process["open_waits"][0]["id"].as_str())
        .expect("an open wait")
        .to_owned();
    // `serve` holds the tree's lease; the command line's engine posts the
    // answer to the tree's inbox and `serve` applies it.
    let answered = dir.ok(&[
        "--scope",
        "demo",
        "answer",
        &tree,
        "--wait",
        &wait,
        "\"ship it\"",
    ]);
    assert!(!answered.contains("error"), "{answered}");
    let (status, text) = call(
        reqwest::Method::GET,
        format!("/v1/trees/{tree}?until=terminal&timeout_ms=20000"),
        None,
    );
    assert_eq!(status, 200, "{text}");
    let finished: Value = serde_json::from_str(&text).expect("json");
    assert_eq!(finished["status"], "done", "{text}");
    let again = dir.ok(&[
        "--scope",
        "demo",
        "answer",
        &tree,
        "--wait",
        &wait,
        "\"ship it\"",
    ]);
    assert!(
        again.starts_with("(this answer was already delivered)"),
        "{again}"
    );
    let status = Command::new("kill")
        .args(["-INT", &serving.child.id().to_string()])
        .status()
        .expect("kill runs");
    assert!(status.success());
    assert!(serving.child.wait().expect("serve exits").success());
}

/// `watch --json` as a snapshot: each event's sequence, kind, process path,
/// program, role and data, ids redacted.
fn watch_snapshot(events: &[Value]) -> String {
    events
        .iter()
        .map(|event| {
            let path = event["path"]
                .as_array()
                .map(|keys| {
                    keys.iter()
                        .filter_map(Value::as_str)
                        .collect::<Vec<_>>()
                        .join("/")
                })
                .unwrap_or_default();
            redact(&format!(
                "{} {} {} {} {} {}\n",
                event["seq"],
                event["kind"].as_str().unwrap_or("?"),
                if path.is_empty() { "(root)" } else { &path },
                event["program"].as_str().unwrap_or("-"),
                event["role"].as_str().unwrap_or("-"),
                event["data"]
            ))
        })
        .collect()
}

#[test]
fn watch_prints_the_same_committed_events_for_a_running_and_a_finished_tree() {
    let dir = Dir::new();
    let paused: Value =
        serde_json::from_str(dir.ok(&["demo", "--pause", "--json"]).trim()).expect("json");
    let (tree, wait) = (
        paused["tree"].as_str().expect("tree").to_owned(),
        paused["wait"].as_str().expect("wait").to_owned(),
    );
    let head = dir.head_seq(&tree);
    let mut watcher = Command::new(env!("CARGO_BIN_EXE_baton"))
        .current_dir(dir.dir.path())
        .args(["watch", &tree, "--json"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawns");
    let mut lines = BufReader::new(watcher.stdout.take().expect("stdout")).lines();
    let mut live: Vec<Value> = Vec::new();
    while live.len() < head {
        let line = lines.next().expect("an event").expect("reads");
        live.push(serde_json::from_str(&line).expect("a JSON event"));
    }
    dir.ok(&["answer", &tree, "--wait", &wait, "\"ship it\""]);
    for line in lines {
        live.push(serde_json::from_str(&line.expect("reads")).expect("a JSON event"));
    }
    assert!(watcher.wait().expect("exits").success());
    let live: Vec<Value> = live
        .into_iter()
        .filter(|event| event["durable"] == true)
        .collect();
    let finished = dir.json_lines(&["watch", &tree, "--json"]);
    assert_eq!(live, finished, "the same committed events, in order");
    assert_eq!(watch_snapshot(&finished), WATCH_SNAPSHOT);
}

/// `watch --json` of the answered pause demo (see [`watch_snapshot`]).
const WATCH_SNAPSHOT: &str = r#"1 process_started (root) demo.pause - null
2 step_adopted (root) demo.pause - {"step":0,"transition":"continue"}
3 child_started team.turn.1 demo.pause_coordinator - {"parent":"p_…"}
4 terminated team.turn.1 demo.pause_coordinator - {"output":{"mode":"wait","state":"release 1.4","tasks":[{"input":"What should the team deploy?","key":"instruction","worker":"demo.instruction"}]},"status":"completed","usage":{"effects":0,"signals":0,"steps":1}}
5 effect_settled (root) demo.pause - {"effect":"e_…","unknown":false}
6 step_adopted (root) demo.pause - {"step":1,"transition":"continue"}
7 child_started instruction demo.instruction - {"parent":"p_…"}
8 step_adopted instruction demo.instruction - {"step":0,"transition":"continue"}
9 step_adopted instruction demo.instruction - {"step":1,"transition":"wait"}
10 signals_admitted instruction demo.instruction - {"count":1}
11 terminated instruction demo.instruction - {"output":{"id":"answer.w_…","payload":"ship it","wait":"w_…"},"status":"completed","usage":{"effects":1,"signals":2,"steps":3}}
12 effect_settled (root) demo.pause - {"effect":"e_…","unknown":false}
13 step_adopted (root) demo.pause - {"step":2,"transition":"continue"}
14 child_started team.turn.2 demo.pause_coordinator - {"parent":"p_…"}
15 terminated team.turn.2 demo.pause_coordinator - {"output":{"output":"release 1.4: done as instructed (ship it), answer answer.w_…","state":"release 1.4"},"status":"completed","usage":{"effects":0,"signals":0,"steps":1}}
16 effect_settled (root) demo.pause - {"effect":"e_…","unknown":false}
17 terminated (root) demo.pause - {"output":"release 1.4: done as instructed (ship it), answer answer.w_…","status":"completed","usage":{"effects":6,"signals":6,"steps":4}}
"#;

#[test]
fn watch_ends_with_a_summary_and_shows_the_agent_view() {
    let dir = Dir::new();
    dir.ok(&["demo"]);
    let tree = dir.json_lines(&["ps", "--json"])[0]["tree"]
        .as_str()
        .expect("tree")
        .to_owned();
    let text = dir.ok(&["watch", &tree]);
    let lines: Vec<&str> = text.lines().collect();
    let (summary, used) = (lines[lines.len() - 2], lines[lines.len() - 1]);
    assert!(summary.starts_with("completed: "), "{text}");
    assert!(summary.contains("reviewed: inspect deployment"), "{text}");
    assert!(
        used.starts_with("used: ") && used.contains(" steps"),
        "{text}"
    );
    // Not a terminal: no status lines, nothing on stderr.
    let output = dir.baton(&["watch", &tree]);
    assert!(
        output.stderr.is_empty(),
        "{:?}",
        String::from_utf8_lossy(&output.stderr)
    );

    // A strategy of model agents, as the agent stream view.
    let swarm: Value =
        serde_json::from_str(dir.ok(&["demo", "swarm", "--json"]).trim()).expect("json");
    let swarm_tree = swarm["tree"].as_str().expect("tree");
    let agents = dir.json_lines(&["watch", swarm_tree, "--view", "agents", "--json"]);
    let types: Vec<&str> = agents
        .iter()
        .map(|event| event["type"].as_str().expect("type"))
        .collect();
    assert_eq!(types.first(), Some(&"agent_start"), "{types:?}");
    assert_eq!(types.last(), Some(&"complete"), "{types:?}");
    assert_eq!(
        types.iter().filter(|t| **t == "agent_start").count(),
        types.iter().filter(|t| **t == "agent_end").count()
    );
    assert!(types.contains(&"handoff"), "{types:?}");
    assert_eq!(
        types
            .iter()
            .filter(|t| **t == "complete" || **t == "error")
            .count(),
        1
    );
}
