//! The tree page: its status, the process tree, usage, the steer forms
//! (answers, resolutions, cancellation), the verify button and the log;
//! and the live fragment the page's script swaps in as events arrive.

use std::collections::BTreeMap;

use baton::run::{Budget, Dimension, Name, ProcessId, ProcessView, TreeView, Usage, Verification};
use maud::{Markup, html};

use super::auth::Session;
use super::form::{AnswerForm, FieldErrors, Posted};
use super::pages::{age, badge, frame};

/// One row of the log table.
#[derive(Clone, Debug)]
pub(crate) struct LogRow {
    pub(crate) seq: u64,
    pub(crate) kind: String,
    pub(crate) process: Option<String>,
    pub(crate) bytes: usize,
    pub(crate) hash: String,
}

/// A message at the top of the page.
#[derive(Clone, Debug)]
pub(crate) struct Banner {
    pub(crate) error: bool,
    pub(crate) text: String,
}

impl Banner {
    pub(crate) fn info(text: impl Into<String>) -> Banner {
        Banner {
            error: false,
            text: text.into(),
        }
    }

    pub(crate) fn error(text: impl Into<String>) -> Banner {
        Banner {
            error: true,
            text: text.into(),
        }
    }
}

/// A form posted back with its values and errors.
#[derive(Clone, Debug, Default)]
pub(crate) struct Returned {
    /// The wait or effect id the form was for.
    pub(crate) target: String,
    pub(crate) posted: Posted,
    pub(crate) errors: FieldErrors,
}

/// Everything the tree page shows.
pub(crate) struct TreePage<'a> {
    pub(crate) session: &'a Session,
    pub(crate) view: &'a TreeView,
    pub(crate) log: &'a [LogRow],
    pub(crate) log_skipped: usize,
    pub(crate) now_ms: u64,
    pub(crate) banner: Option<Banner>,
    pub(crate) verification: Option<Result<Verification, String>>,
    pub(crate) returned: Option<Returned>,
}

fn short(text: &str) -> &str {
    text.get(..18).unwrap_or(text)
}

/// Dimensions a process has a figure in: steps, effects, signals and every
/// meter its budget, usage or grants name.
fn dimensions(budget: &Budget, usage: &Usage, granted: &Usage) -> Vec<Dimension> {
    let mut meters: Vec<Name> = budget
        .meters
        .keys()
        .chain(usage.meters.keys())
        .chain(granted.meters.keys())
        .cloned()
        .collect();
    meters.sort();
    meters.dedup();
    let mut all = vec![Dimension::Steps, Dimension::Effects, Dimension::Signals];
    all.extend(meters.into_iter().map(Dimension::Meter));
    all
}

fn dimension_name(dimension: &Dimension) -> String {
    match dimension {
        Dimension::Meter(name) => name.as_str().to_owned(),
        other => other.to_string(),
    }
}

fn quota_text(budget: &Budget, dimension: &Dimension) -> String {
    match budget.quota(dimension) {
        baton::run::Quota::Unlimited => "unlimited".to_owned(),
        baton::run::Quota::Finite(max) => max.to_string(),
    }
}

/// Micro-units of cost as dollars.
fn cost(micros: u64) -> String {
    format!("${}.{:06}", micros / 1_000_000, micros % 1_000_000)
}

fn meter(usage: &Usage, name: &str) -> u64 {
    usage
        .meters
        .iter()
        .find(|(key, _)| key.as_str() == name)
        .map_or(0, |(_, amount)| *amount)
}

fn budget_table(process: &ProcessView) -> Markup {
    html! {
        table.budget {
            caption { "Budget" }
            thead { tr { th scope="col" { "Dimension" } th scope="col" { "Used" } th scope="col" { "Granted to children" } th scope="col" { "Limit" } } }
            tbody {
                @for dimension in dimensions(&process.budget, &process.usage, &process.granted) {
                    tr {
                        th scope="row" { (dimension_name(&dimension)) }
                        td { (process.usage.used(&dimension)) }
                        td { (process.granted.used(&dimension)) }
                        td { (quota_text(&process.budget, &dimension)) }
                    }
                }
            }
        }
    }
}

fn process(
    process: &ProcessView,
    children: &BTreeMap<ProcessId, Vec<&ProcessView>>,
    now_ms: u64,
) -> Markup {
    let id = process.id.to_string();
    let status = process.status.view_name();
    html! {
        details.process open data-process=(id) id={ "process-" (id) } {
            summary {
                span.key { @if let Some(key) = &process.key { (key.as_str()) } @else { "root" } }
                " " code { (process.program.as_str()) } " " (badge(status, None))
                @if meter(&process.usage, "tokens") > 0 { " " span.hint { (meter(&process.usage, "tokens")) " tokens" } }
            }
            div.body {
                dl.facts {
                    dt { "Process" } dd { code { (id) } }
                    @if let Some(wait) = &process.waiting_on { dt { "Waiting on" } dd { code { (wait) } } }
                    dt { "Mailbox" } dd { (process.mailbox) }
                    @if let Some(end) = &process.termination {
                        dt { "Ended" } dd {
                            (end.status().view_name())
                            @if let Some(failure) = end.failure() { ": " (failure.to_string()) }
                            @if let Some(output) = end.output() { ": " code.output { (output.as_str()) } }
                        }
                    }
                }
                (budget_table(process))
                @if !process.effects.is_empty() {
                    ul.effects aria-label="Effects in flight" {
                        @for effect in &process.effects {
                            li {
                                code { (short(&effect.id.to_string())) } " " (effect.kind) " " (badge(&effect.phase, None))
                                @if effect.failed_attempts > 0 { " " (effect.failed_attempts) " failed attempts" }
                                @if let Some(at) = effect.retry_at { " retry in " (age(at.millis(), now_ms)) }
                            }
                        }
                    }
                }
                div.live {
                    span.hint { "Live output" }
                    pre.deltas id={ "deltas-" (id) } aria-live="polite" {}
                }
                @if let Some(kids) = children.get(&process.id) {
                    @for child in kids { (self::process(child, children, now_ms)) }
                }
            }
        }
    }
}

/// The process tree, nested under the root.
pub(crate) fn processes(view: &TreeView, now_ms: u64) -> Markup {
    let mut children: BTreeMap<ProcessId, Vec<&ProcessView>> = BTreeMap::new();
    for view in &view.processes {
        if let Some(parent) = view.parent {
            children.entry(parent).or_default().push(view);
        }
    }
    html! {
        section id="processes" aria-labelledby="processes-title" {
            h2 id="processes-title" { "Processes" }
            (process(view.root(), &children, now_ms))
        }
    }
}

/// Usage by program and in total (tokens and cost from the model meters).
pub(crate) fn usage(view: &TreeView) -> Markup {
    let report = view.usage();
    html! {
        section id="usage" aria-labelledby="usage-title" {
            h2 id="usage-title" { "Usage" }
            table.usage {
                thead { tr { th scope="col" { "Program" } th scope="col" { "Processes" } th scope="col" { "Steps" } th scope="col" { "Tokens in" } th scope="col" { "Tokens out" } th scope="col" { "Tokens" } th scope="col" { "Cost" } } }
                tbody {
                    @for (name, program) in &report.programs {
                        tr {
                            th scope="row" { code { (name.as_str()) } }
                            td { (program.processes) }
                            td { (program.usage.steps) }
                            td { (meter(&program.usage, "tokens_in")) }
                            td { (meter(&program.usage, "tokens_out")) }
                            td { (meter(&program.usage, "tokens")) }
                            td { (cost(meter(&program.usage, "cost_micros"))) }
                        }
                    }
                }
                tfoot {
                    tr {
                        th scope="row" { "Total" }
                        td { (report.processes.len()) }
                        td { (report.total.steps) }
                        td { (meter(&report.total, "tokens_in")) }
                        td { (meter(&report.total, "tokens_out")) }
                        td id="total-tokens" { (meter(&report.total, "tokens")) }
                        td id="total-cost" { (cost(meter(&report.total, "cost_micros"))) }
                    }
                }
            }
        }
    }
}

/// What needs the caller: open waits and unknown effects. `data-key` names
/// them, so the script replaces the section only when they change (and
/// never under a person's typing otherwise).
pub(crate) fn steer(page: &TreePage<'_>) -> Markup {
    let view = page.view;
    let tree = view.tree.to_string();
    let mut key = String::new();
    for process in &view.processes {
        for wait in &process.open_waits {
            key.push_str(&wait.id.to_string());
            key.push(' ');
        }
        for effect in &process.unknown_effects {
            key.push_str(&effect.to_string());
            key.push(' ');
        }
    }
    let none = Returned::default();
    let returned_for = |target: &str| match &page.returned {
        Some(returned) if returned.target == target => returned,
        _ => &none,
    };
    html! {
        section id="steer" data-key=(key) aria-labelledby="steer-title" {
            h2 id="steer-title" { "Needs you" }
            @if key.is_empty() { p.hint { "Nothing waits for an answer or a resolution." } }
            @for process in &view.processes {
                @for wait in &process.open_waits {
                    @let wait_id = wait.id.to_string();
                    @let form_id = format!("answer-{wait_id}");
                    @let returned = returned_for(&wait_id);
                    @let form = AnswerForm::of(&wait.answer_schema.to_value());
                    article.wait id={ "wait-" (wait_id) } {
                        h3 { "Answer " code { (wait.key.as_str()) } " for " code { (process.program.as_str()) } }
                        @if let Some(request) = &wait.request {
                            p.question { @match request.to_value() { serde_json::Value::String(text) => (text), other => code { (other.to_string()) } } }
                        }
                        form.answer id=(form_id) method="post" action={ "/trees/" (tree) "/waits/" (wait_id) } data-validate {
                            input type="hidden" name="csrf" value=(page.session.csrf);
                            (form.fields(&form_id, &returned.posted, &returned.errors))
                            p.field-error.answer-error id={ (form_id) "-error" } role="alert" {
                                @if let Some(error) = returned.errors.get("") { (error) }
                            }
                            button type="submit" { "Send answer" }
                        }
                        details.json-answer open[returned.posted.contains_key("json")] {
                            summary { "Answer as JSON" }
                            form method="post" action={ "/trees/" (tree) "/waits/" (wait_id) } data-validate {
                                input type="hidden" name="csrf" value=(page.session.csrf);
                                div.field {
                                    label for={ (form_id) "-json" } { "Answer (JSON)" }
                                    textarea id={ (form_id) "-json" } name="json" rows="3" required data-json
                                        aria-describedby={ (form_id) "-json-error" } {
                                        (returned.posted.get("json").map(String::as_str).unwrap_or(""))
                                    }
                                    span.field-error id={ (form_id) "-json-error" } role="alert" {
                                        @if let Some(error) = returned.errors.get("json") { (error) }
                                    }
                                }
                                p.hint { "Schema: " code { (wait.answer_schema.as_str()) } }
                                button type="submit" { "Send JSON answer" }
                            }
                        }
                    }
                }
                @for effect in &process.unknown_effects {
                    @let effect_id = effect.to_string();
                    @let form_id = format!("resolve-{effect_id}");
                    @let returned = returned_for(&effect_id);
                    @let request = process.effects.iter().find(|slot| slot.id == *effect).and_then(|slot| slot.request.as_ref());
                    article.unknown id={ "effect-" (effect_id) } {
                        h3 { "Unknown effect " code { (short(&effect_id)) } " of " code { (process.program.as_str()) } }
                        p { "The call may or may not have happened. Find out what it did, then settle it." }
                        @if let Some(request) = request {
                            div { span.hint { "Its request" } pre.request { (request.as_str()) } }
                        }
                        form.resolve id=(form_id) method="post" action={ "/trees/" (tree) "/effects/" (effect_id) "/resolve" } data-validate {
                            input type="hidden" name="csrf" value=(page.session.csrf);
                            fieldset {
                                legend { "What happened" }
                                div.field.checkbox {
                                    input type="radio" id={ (form_id) "-ok" } name="outcome" value="output" required
                                        checked[returned.posted.get("outcome").is_none_or(|o| o == "output")];
                                    label for={ (form_id) "-ok" } { "It succeeded with the output below" }
                                }
                                div.field.checkbox {
                                    input type="radio" id={ (form_id) "-failed" } name="outcome" value="failure"
                                        checked[returned.posted.get("outcome").is_some_and(|o| o == "failure")];
                                    label for={ (form_id) "-failed" } { "It failed with the code and message below" }
                                }
                            }
                            div.field {
                                label for={ (form_id) "-output" } { "Output (JSON)" }
                                textarea id={ (form_id) "-output" } name="output" rows="2" data-json { (returned.posted.get("output").map(String::as_str).unwrap_or("")) }
                            }
                            div.field {
                                label for={ (form_id) "-code" } { "Failure code" }
                                input type="text" id={ (form_id) "-code" } name="code" pattern="[a-z0-9][a-z0-9._-]*" placeholder="payments.refund.declined"
                                    value=(returned.posted.get("code").map(String::as_str).unwrap_or(""));
                            }
                            div.field {
                                label for={ (form_id) "-message" } { "Failure message" }
                                input type="text" id={ (form_id) "-message" } name="message"
                                    value=(returned.posted.get("message").map(String::as_str).unwrap_or(""));
                            }
                            p.field-error id={ (form_id) "-error" } role="alert" {
                                @if let Some(error) = returned.errors.get("") { (error) }
                            }
                            button type="submit" { "Resolve" }
                        }
                    }
                }
            }
        }
    }
}

/// The cancel form, while the tree runs.
pub(crate) fn cancel(page: &TreePage<'_>) -> Markup {
    let done = page.view.status.as_str() == "done";
    html! {
        section id="cancel" data-key=(if done { "done" } else { "open" }) aria-labelledby="cancel-title" {
            @if !done {
                h2 id="cancel-title" { "Cancel" }
                form.cancel method="post" action={ "/trees/" (page.view.tree) "/cancel" } data-validate {
                    input type="hidden" name="csrf" value=(page.session.csrf);
                    div.field {
                        label for="cancel-reason" { "Reason (kept in the log)" }
                        input type="text" id="cancel-reason" name="reason" required minlength="1"
                            aria-describedby="cancel-reason-error"
                            value=(page.returned.as_ref().filter(|r| r.target == "cancel").and_then(|r| r.posted.get("reason")).map(String::as_str).unwrap_or(""));
                        span.field-error id="cancel-reason-error" role="alert" {}
                    }
                    button.danger type="submit" { "Cancel the tree" }
                }
            } @else {
                h2 id="cancel-title" hidden { "Cancel" }
            }
        }
    }
}

/// Log rows (for the table and for the live fragment).
pub(crate) fn log_rows(rows: &[LogRow]) -> Markup {
    html! {
        @for row in rows {
            tr data-seq=(row.seq) {
                td.num { (row.seq) }
                td { (row.kind) }
                td { @if let Some(process) = &row.process { code { (short(process)) } } }
                td.num { (row.bytes) }
                td { code title=(row.hash) { (short(&row.hash)) } }
            }
        }
    }
}

fn verification(result: &Result<Verification, String>) -> Markup {
    html! {
        @match result {
            Ok(verified) => p.banner.ok id="verify-result" role="status" {
                "Log verified: records " (verified.first) "–" (verified.head_seq) " chain to head "
                code { (short(&verified.head.to_string())) }
                @if let Some(snapshot) = verified.snapshot_matched { ", the snapshot at " (snapshot) " matches" }
                @if verified.head_recorded { ", and the store's recorded head is the log's" }
                "."
            },
            Err(error) => p.banner.error id="verify-result" role="alert" { "The log does not verify: " (error) },
        }
    }
}

/// The status line (swapped live).
pub(crate) fn status(view: &TreeView) -> Markup {
    html! {
        span id="tree-status-wrap" { (badge(view.status.as_str(), Some("tree-status"))) }
    }
}

/// The whole tree page.
pub(crate) fn page(page: &TreePage<'_>) -> Markup {
    let view = page.view;
    let tree = view.tree.to_string();
    frame(
        &format!("Tree {}", short(&tree)),
        Some(page.session),
        html! {
            div id="tree" data-tree=(tree) data-head=(view.head_seq) data-done=(view.status.as_str() == "done") {
                p { a href="/" { "← Trees" } }
                h1 { "Tree " code { (tree) } }
                @if let Some(banner) = &page.banner {
                    p.banner.error[banner.error].ok[!banner.error] id="banner" role=(if banner.error { "alert" } else { "status" }) { (banner.text) }
                }
                dl.summary {
                    dt { "Status" } dd { (status(view)) }
                    dt { "Program" } dd { code { (view.program.name.as_str()) } " " span.hint { (short(&view.program.digest.to_string())) } }
                    dt { "Scope" } dd { (view.scope.as_str()) }
                    @if let Some(created) = view.created { dt { "Started" } dd { (age(page.now_ms, created.millis())) " ago" } }
                    @if !view.labels.is_empty() {
                        dt { "Labels" } dd { @for (key, value) in view.labels.iter() { code.label { (key.as_str()) "=" (value) } " " } }
                    }
                    dt { "Log head" } dd id="head-seq" { (view.head_seq) }
                }
                (steer(page))
                (processes(view, page.now_ms))
                (usage(view))
                section id="verify" aria-labelledby="verify-title" {
                    h2 id="verify-title" { "Verify" }
                    form method="get" action={ "/trees/" (tree) } {
                        input type="hidden" name="verify" value="1";
                        button.secondary type="submit" id="verify-button" { "Verify the log" }
                    }
                    @if let Some(result) = &page.verification { (verification(result)) }
                }
                (cancel(page))
                section id="log" aria-labelledby="log-title" {
                    h2 id="log-title" { "Log" }
                    @if page.log_skipped > 0 { p.hint { (page.log_skipped) " earlier records are not shown (GET /v1/trees/" (tree) "/log has them all)." } }
                    table.log {
                        thead { tr { th scope="col" { "Seq" } th scope="col" { "Kind" } th scope="col" { "Process" } th scope="col" { "Bytes" } th scope="col" { "Hash" } } }
                        tbody id="log-rows" { (log_rows(page.log)) }
                    }
                }
            }
        },
    )
}

/// What the page's script swaps in after an event: the status, the steer
/// forms, the process tree, usage, the cancel form and the log rows after
/// the page's last one.
pub(crate) fn live(page: &TreePage<'_>) -> Markup {
    html! {
        div id="live" data-head=(page.view.head_seq) data-done=(page.view.status.as_str() == "done") {
            (status(page.view))
            span id="head-seq" { (page.view.head_seq) }
            (steer(page))
            (processes(page.view, page.now_ms))
            (usage(page.view))
            (cancel(page))
            table { tbody id="log-rows" { (log_rows(page.log)) } }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn costs_are_dollars_with_six_decimals() {
        assert_eq!(cost(0), "$0.000000");
        assert_eq!(cost(1_234_567), "$1.234567");
    }
}
