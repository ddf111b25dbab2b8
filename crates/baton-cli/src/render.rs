//! Tables and trees for people, JSON for machines.

use std::fmt::Write as _;

use baton::run::log::Record;
use baton::run::store::TreeMeta;
use baton::run::{
    Dimension, ProcessView, Program, Quota, TreeView, UsageReport, Verification, WatchEvent,
};
use comfy_table::{CellAlignment, Table};
use serde_json::{Value, json};

use crate::time;

/// A table without borders: a header row, columns two spaces apart, each
/// as wide as its widest value, so long values never misalign; columns
/// listed in `right` are right-aligned.
fn table(header: &[&str], right: &[usize], rows: Vec<Vec<String>>) -> String {
    let mut table = Table::new();
    table.load_preset(comfy_table::presets::NOTHING);
    table.set_header(header.to_vec());
    for row in rows {
        table.add_row(row);
    }
    let last = header.len().saturating_sub(1);
    for (index, column) in table.column_iter_mut().enumerate() {
        column.set_padding((0, if index == last { 0 } else { 2 }));
        if right.contains(&index) {
            column.set_cell_alignment(CellAlignment::Right);
        }
    }
    table
        .lines()
        .map(|line| format!("{}\n", line.trim_end()))
        .collect()
}

/// A digest shortened for a table: `b3:` and its first 12 hex digits.
fn short_digest(digest: &str) -> String {
    digest.chars().take(15).collect()
}

/// `ps`.
pub fn ps(trees: &[TreeMeta], as_json: bool) -> String {
    if as_json {
        return lines(trees.iter().map(|meta| {
            let mut row = json!({
                "tree": meta.tree.to_string(),
                "scope": meta.scope.to_string(),
                "status": meta.status.as_str(),
                "updated": time::rfc3339(meta.updated),
                "updated_ms": meta.updated.millis(),
                "labels": &meta.labels,
            });
            if let Some(program) = &meta.program {
                row["program"] = json!(program.name.to_string());
                row["version"] = json!(program.digest.to_string());
            }
            if let Some(created) = meta.created {
                row["created"] = json!(time::rfc3339(created));
            }
            row
        }));
    }
    if trees.is_empty() {
        return "no trees\n".to_owned();
    }
    let rows = trees
        .iter()
        .map(|meta| {
            vec![
                meta.tree.to_string(),
                meta.scope.to_string(),
                meta.program
                    .as_ref()
                    .map_or_else(|| "?".to_owned(), |program| program.name.to_string()),
                meta.program.as_ref().map_or_else(
                    || "?".to_owned(),
                    |program| short_digest(&program.digest.to_string()),
                ),
                meta.status.as_str().to_owned(),
                time::when(meta.updated),
                meta.labels.to_string(),
            ]
        })
        .collect();
    table(
        &[
            "TREE", "SCOPE", "PROGRAM", "VERSION", "STATUS", "UPDATED", "LABELS",
        ],
        &[],
        rows,
    )
}

/// `inspect --usage`: what each process used, itself and with its
/// subtree, then the totals by program and for the tree; `--json` prints
/// the `UsageReport`.
pub fn usage(report: &UsageReport, as_json: bool) -> String {
    if as_json {
        return format!(
            "{}\n",
            serde_json::to_string(report).expect("a usage report encodes")
        );
    }
    // Every meter any process used is a column, in name order.
    let meters: std::collections::BTreeSet<_> = report.total.meters.keys().cloned().collect();
    let amounts = |usage: &baton::run::Usage| -> Vec<String> {
        let mut cells = vec![
            usage.steps.to_string(),
            usage.effects.to_string(),
            usage.signals.to_string(),
        ];
        cells.extend(
            meters
                .iter()
                .map(|meter| usage.meters.get(meter).copied().unwrap_or(0).to_string()),
        );
        cells
    };
    let mut header = vec!["PROCESS", "PROGRAM", "STEPS", "EFFECTS", "SIGNALS"];
    let names: Vec<String> = meters.iter().map(|m| m.as_str().to_uppercase()).collect();
    header.extend(names.iter().map(String::as_str));
    let right: Vec<usize> = (2..header.len()).collect();
    let mut ordered: Vec<_> = report.processes.iter().collect();
    ordered.sort_by(|a, b| a.path.cmp(&b.path));
    let rows = ordered
        .into_iter()
        .map(|row| {
            let place = if row.path.is_empty() {
                "root".to_owned()
            } else {
                row.path
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join("/")
            };
            let mut cells = vec![place, row.program.to_string()];
            cells.extend(amounts(&row.own));
            cells
        })
        .collect();
    let mut out = format!("usage of tree {} by process (its own use):\n", report.tree);
    out.push_str(&table(&header, &right, rows));
    out.push_str("\nby program:\n");
    let mut header = vec!["PROGRAM", "PROCESSES", "STEPS", "EFFECTS", "SIGNALS"];
    header.extend(names.iter().map(String::as_str));
    let right: Vec<usize> = (1..header.len()).collect();
    let mut rows: Vec<Vec<String>> = report
        .programs
        .iter()
        .map(|(name, program)| {
            let mut cells = vec![name.to_string(), program.processes.to_string()];
            cells.extend(amounts(&program.usage));
            cells
        })
        .collect();
    let mut total = vec!["(tree)".to_owned(), report.processes.len().to_string()];
    total.extend(amounts(&report.total));
    rows.push(total);
    out.push_str(&table(&header, &right, rows));
    out
}

/// `programs`: each registered program, newest version of a name last.
pub fn programs(programs: &[Program], as_json: bool) -> String {
    if as_json {
        return lines(programs.iter().map(|program| {
            let reference = program.reference();
            json!({
                "name": reference.name.to_string(),
                "digest": reference.digest.to_string(),
                "description": program.descriptor().description(),
                "input_schema": program.descriptor().input_schema().json().to_value(),
                "output_schema": program.descriptor().output_schema().json().to_value(),
            })
        }));
    }
    let rows = programs
        .iter()
        .map(|program| {
            let reference = program.reference();
            let digest = reference.digest.to_string();
            vec![
                reference.name.to_string(),
                digest.chars().take(15).collect(),
                program.descriptor().description().to_owned(),
            ]
        })
        .collect();
    table(&["PROGRAM", "VERSION", "DESCRIPTION"], &[], rows)
}

fn lines(values: impl Iterator<Item = Value>) -> String {
    values.map(|value| format!("{value}\n")).collect()
}

fn quota(used: u64, quota: Quota) -> String {
    match quota {
        Quota::Unlimited => format!("{used}"),
        Quota::Finite(max) => format!("{used}/{max}"),
    }
}

fn budget_line(process: &ProcessView) -> String {
    let spent =
        |dimension: &Dimension| process.usage.used(dimension) + process.granted.used(dimension);
    let mut parts = vec![
        format!(
            "steps {}",
            quota(spent(&Dimension::Steps), process.budget.steps)
        ),
        format!(
            "effects {}",
            quota(spent(&Dimension::Effects), process.budget.effects)
        ),
        format!(
            "signals {}",
            quota(spent(&Dimension::Signals), process.budget.signals)
        ),
    ];
    for (meter, used) in &process.usage.meters {
        parts.push(format!(
            "{meter} {}",
            quota(*used, process.budget.meter(meter))
        ));
    }
    parts.join(", ")
}

/// `inspect`: the process tree with statuses, budgets, waits and unknown
/// effects, each with the command (of the command line `bin`) that acts on it.
pub fn tree(view: &TreeView, as_json: bool, bin: &str) -> String {
    if as_json {
        return format!(
            "{}\n",
            serde_json::to_string(view).unwrap_or_else(|_| "{}".to_owned())
        );
    }
    let mut out = format!(
        "tree {}  scope {}  status {}  log {} records\n",
        view.tree, view.scope, view.status, view.head_seq
    );
    let _ = write!(
        out,
        "program {} (version {})",
        view.program.name,
        short_digest(&view.program.digest.to_string())
    );
    if let Some(created) = view.created {
        let _ = write!(out, "  started {}", time::when(created));
    }
    if !view.labels.is_empty() {
        let _ = write!(out, "  labels {}", view.labels);
    }
    out.push('\n');
    render_process(view, view.root(), 0, bin, &mut out);
    out
}

fn render_process(
    view: &TreeView,
    process: &ProcessView,
    depth: usize,
    bin: &str,
    out: &mut String,
) {
    let indent = "  ".repeat(depth);
    let name = process
        .key
        .as_ref()
        .map_or_else(|| "(root)".to_owned(), ToString::to_string);
    let _ = writeln!(
        out,
        "{indent}{name} {} {} [{}]  {}",
        process.program,
        process.id,
        process.status,
        budget_line(process)
    );
    for wait in &process.open_waits {
        let _ = writeln!(
            out,
            "{indent}  open wait {} (key {}): answer with `{bin} answer {} --wait {} JSON`",
            wait.id, wait.key, view.tree, wait.id
        );
    }
    for effect in &process.unknown_effects {
        let _ = writeln!(
            out,
            "{indent}  unknown effect {effect}: resolve with `{bin} resolve {} --effect {effect} JSON`",
            view.tree
        );
    }
    if let Some(termination) = &process.termination {
        let detail = match (termination.output(), termination.failure()) {
            (Some(output), _) => format!("output {output}"),
            (_, Some(failure)) => format!("{}: {}", failure.code, failure.message),
            _ => String::new(),
        };
        let _ = writeln!(
            out,
            "{indent}  ended {} ({}) {detail}",
            termination.status(),
            termination.cause()
        );
    }
    for effect in &process.effects {
        if let Some(retry_at) = effect.retry_at {
            let _ = writeln!(
                out,
                "{indent}  effect {} failed {} time(s), tried again {}",
                effect.id,
                effect.failed_attempts,
                time::when(retry_at)
            );
        }
    }
    for child in process.children.values() {
        if let Some(child) = view.process(*child) {
            render_process(view, child, depth + 1, bin, out);
        }
    }
}

/// One event of `watch`: a JSON line, or `SEQ  KIND  PROCESS  DATA` where
/// PROCESS is the child-key path from the root and the program, and a
/// non-durable event has `-` for its sequence.
pub fn event(event: &WatchEvent, as_json: bool) -> String {
    let value = serde_json::to_value(event).unwrap_or(Value::Null);
    if as_json {
        return format!("{value}\n");
    }
    let seq = event
        .seq
        .map_or_else(|| "-".to_owned(), |seq| seq.to_string());
    let kind = value["kind"].as_str().unwrap_or("event");
    let path = path(&event.path);
    let program = event
        .program
        .as_ref()
        .map_or_else(String::new, |program| format!(" {program}"));
    let data = match &value["data"] {
        Value::Null => String::new(),
        data => format!("  {data}"),
    };
    format!("{seq:>5}  {kind:<18}  {path}{program}{data}\n")
}

/// A process's place: its child keys from the root joined by `/`, or
/// `(root)`.
pub fn path(path: &[baton::run::ChildKey]) -> String {
    if path.is_empty() {
        return "(root)".to_owned();
    }
    path.iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("/")
}

/// One event of `watch --view agents`: a JSON line, or a line for people
/// (`▶ AGENT started`, `■ AGENT completed (USAGE)`, …); a token is its bare
/// text, and the terminal event is left to the summary.
pub fn agent_event(event: &baton::agent::AgentEvent, as_json: bool) -> String {
    use baton::agent::AgentEvent;
    if as_json {
        return format!("{}\n", serde_json::to_value(event).unwrap_or(Value::Null));
    }
    let who = |agent: &baton::agent::AgentRef| match &agent.name {
        Some(name) if agent.path.is_empty() => name.to_string(),
        Some(name) => format!("{} {name}", path(&agent.path)),
        None => path(&agent.path),
    };
    match event {
        AgentEvent::AgentStart { agent } => format!("▶ {} started\n", who(agent)),
        AgentEvent::Token { text, .. } => text.clone(),
        AgentEvent::ToolCallStart { agent, tool, .. } => format!(
            "  {} calls {}\n",
            who(agent),
            tool.as_ref()
                .map_or("a tool".to_owned(), ToString::to_string)
        ),
        AgentEvent::ToolCallEnd { tool, status, .. } => format!(
            "  {} {status}\n",
            tool.as_ref()
                .map_or("the tool".to_owned(), ToString::to_string)
        ),
        AgentEvent::Handoff { from, to } => format!("↪ {} hands off to {to}\n", who(from)),
        AgentEvent::AgentEnd {
            agent,
            status,
            usage,
            ..
        } => format!("■ {} {status} ({})\n", who(agent), usage_line(usage)),
        // How the run ended is the summary's first line.
        _ => String::new(),
    }
}

/// Usage in a few words: steps, effects, then every meter.
pub fn usage_line(usage: &baton::run::Usage) -> String {
    let mut parts = vec![
        format!("{} steps", usage.steps),
        format!("{} effects", usage.effects),
    ];
    for (meter, amount) in &usage.meters {
        parts.push(format!("{meter} {amount}"));
    }
    parts.join(", ")
}

/// The last line of `watch` for people: how the tree ended (its output,
/// shortened, or its failure) and what it used in all.
pub fn watch_summary(
    ended: Option<&(
        baton::run::Status,
        Option<baton::run::Payload>,
        Option<baton::run::Failure>,
    )>,
    usage: Option<&baton::run::Usage>,
) -> String {
    let mut line = match ended {
        Some((status, Some(output), _)) => {
            let text = output.as_str();
            let shown: String = text.chars().take(160).collect();
            let more = if shown.len() < text.len() { "…" } else { "" };
            format!("{status}: {shown}{more}")
        }
        Some((status, None, Some(failure))) => format!("{status}: {failure}"),
        Some((status, None, None)) => status.to_string(),
        None => "the stream ended before the tree did".to_owned(),
    };
    if let Some(usage) = usage {
        line.push_str(&format!("\nused: {}", usage_line(usage)));
    }
    line.push('\n');
    line
}

/// `log`.
pub fn log(records: &[Record], as_json: bool) -> String {
    if as_json {
        return lines(records.iter().map(|record| {
            json!({
                "seq": record.seq,
                "kind": record.kind.as_str(),
                "hash": record.hash.to_string(),
                "prev": record.prev.to_string(),
                "bytes": record.body.len(),
            })
        }));
    }
    let rows = records
        .iter()
        .map(|record| {
            vec![
                record.seq.to_string(),
                record.kind.as_str().to_owned(),
                record.body.len().to_string(),
                record.hash.to_string(),
            ]
        })
        .collect();
    table(&["SEQ", "KIND", "BYTES", "HASH"], &[0, 2], rows)
}

/// What `log --verify` checked, as one line.
pub fn verification(checked: &Verification, as_json: bool) -> String {
    if as_json {
        return json!({
            "verified": true,
            "first": checked.first,
            "head_seq": checked.head_seq,
            "head": checked.head.to_string(),
            "from_snapshot": checked.from_snapshot,
            "snapshot_matched": checked.snapshot_matched,
            "head_recorded": checked.head_recorded,
        })
        .to_string();
    }
    let mut line = format!(
        "log verified: records {} to {}, hash chain intact",
        checked.first, checked.head_seq
    );
    match (checked.from_snapshot, checked.snapshot_matched) {
        (Some(snapshot), _) => line.push_str(&format!(
            "; checked from the snapshot at record {snapshot} (the records before it were compacted, so the snapshot is taken as written)"
        )),
        (None, Some(snapshot)) => line.push_str(&format!(
            "; the snapshot at record {snapshot} matches the log"
        )),
        (None, None) => {}
    }
    if checked.head_recorded {
        line.push_str("; the store's recorded head matches");
    }
    line
}

/// The result of driving a tree: its output when done, else its state.
pub fn outcome(view: &TreeView, as_json: bool, bin: &str) -> String {
    let root = view.root();
    match (&root.termination, as_json) {
        (Some(termination), false) => match termination.output() {
            Some(output) => format!("{}\n", display_output(output.as_str())),
            None => format!(
                "tree {} ended {}: {}\n",
                view.tree,
                termination.status(),
                termination
                    .failure()
                    .map(ToString::to_string)
                    .unwrap_or_default()
            ),
        },
        _ => tree(view, as_json, bin),
    }
}

/// A JSON string output is printed as its text; anything else as JSON.
pub fn display_output(json_text: &str) -> String {
    match serde_json::from_str::<Value>(json_text) {
        Ok(Value::String(text)) => text,
        _ => json_text.to_owned(),
    }
}

/// One line per recovered tree.
pub fn recovered(view: &TreeView, as_json: bool) -> String {
    if as_json {
        return format!(
            "{}\n",
            json!({ "tree": view.tree.to_string(), "status": view.status.as_str(), "head_seq": view.head_seq })
        );
    }
    format!(
        "{}  recovered, now {} ({} records)\n",
        view.tree, view.status, view.head_seq
    )
}
