//! `engine_conformance`: the engine's behaviour, scenario by scenario, on any
//! store.

mod recovery;
mod reliability;
mod single;
mod trees;

use std::any::Any;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::task::Poll;

use baton_run::log::Record;
use baton_run::store::Store;
use baton_run::{
    Engine, Payload, Scope, SignalId, SignalRequest, Termination, TreeId, TreeView, Visibility,
    WaitId,
};
use tokio::runtime::{Handle, RuntimeFlavor};

use crate::programs::SCOPE;

/// Makes a fresh, empty store for one scenario.
type Fresh<'a> = dyn Fn() -> Arc<dyn Store> + 'a;

/// Runs the engine's behaviour on a store implementation, scenario by
/// scenario, panicking at the first violation with the scenario's name in
/// the message. `factory` makes a fresh, empty store; every scenario gets its
/// own (several, when it needs more than one). The scenarios read stored
/// records only through [`Store::load`], so they hold for a store that
/// compacts the records a snapshot covers and for one that keeps them.
///
/// Call it from a current-thread runtime (`#[tokio::test]`): the races
/// between a host command and a step rely on one thread polling them in
/// order, and the kit refuses any other runtime.
///
/// Scenarios, each named in a failure message as below:
/// - **the step protocol**: three dispatches complete in declaration order
///   and the log verifies; host signals are idempotent by id and validated
///   before commit; a looping program stops exactly at its step quota; a
///   meter reservation over budget is refused before any io; cancel racing
///   an answer wins by priority and a committed completion stands; a
///   panicking step fails with kind panic and other trees keep running;
///   starting the same id is idempotent (a new tree, then the existing one),
///   conflicts with another program or input, refuses an unregistered
///   program, and scopes are enforced; a start whose lease is taken over
///   before its first record is fenced and writes nothing; a host
///   deadline times the tree out and beats a racing answer; events report
///   committed facts in order; tree limits fail definitely and a tree over
///   its history is closed;
/// - **recovery, crashes and leases**: a fresh engine recovers a tree from a
///   dropped engine unless its program is missing; crash before the pending
///   commit dispatches exactly once after recovery; crash after the pending
///   commit with never parks and resolves without redispatch; crash with
///   same identity redispatches under the same effect id (and with never
///   leaves it unknown); crash after the settled commit completes without
///   redispatch; a tree recovers from its latest snapshot and the records
///   after it; a forced takeover stops the old engine without writing; a
///   sleeping tree whose log moved wakes stopped in every sleep mode;
///   closing an engine releases every sleeping tree and tells its handles;
/// - **process trees**: three children complete in declaration order with
///   exact budget accounting; any wakes on the first child and the rest
///   drain canceled; an any wait over quick children settles once with
///   every child of the round; a round of children larger than a commit
///   still settles its wait once; completing with live children cancels
///   them and join waits for their drain; refused starts are facts for the
///   parent; a crash before the child start record starts the child exactly
///   once; a crash after a signal control commit delivers it exactly once; a
///   parked child shows as needs attention and resolving it continues the
///   tree; killing the root kills the subtree and events carry paths; a host
///   deadline times out the whole subtree;
/// - **leases, owners and receipts**: a busy tree keeps its lease while
///   another engine tries to take it; twenty identical starts at once make
///   one tree and nineteen handles on it; a take-up, a resolution and an
///   answer at once share one owner; a fenced engine reports the fencing
///   when asked for the tree; after close another owner takes every tree
///   without force or waiting; a resent answer is a duplicate even after it
///   ended the process; a host signal with a reserved id is refused.
pub async fn engine_conformance<S: Store>(factory: impl Fn() -> S) {
    assert!(
        matches!(
            Handle::current().runtime_flavor(),
            RuntimeFlavor::CurrentThread
        ),
        "engine conformance: run the kit on a current-thread runtime (`#[tokio::test]`)"
    );
    let fresh = || -> Arc<dyn Store> { Arc::new(factory()) };
    let fresh: &Fresh<'_> = &fresh;

    scenario(
        "three dispatches complete in declaration order and the log verifies",
        single::three_dispatches_complete_in_declaration_order_and_the_log_verifies(fresh),
    )
    .await;
    scenario(
        "host signals are idempotent by id and validated before commit",
        single::host_signals_are_idempotent_by_id_and_validated_before_commit(fresh),
    )
    .await;
    scenario(
        "a looping program stops exactly at its step quota",
        single::a_looping_program_stops_exactly_at_its_step_quota(fresh),
    )
    .await;
    scenario(
        "a meter reservation over budget is refused before any io",
        single::a_meter_reservation_over_budget_is_refused_before_any_io(fresh),
    )
    .await;
    scenario(
        "cancel racing an answer wins by priority and a committed completion stands",
        single::cancel_racing_an_answer_wins_by_priority_and_a_committed_completion_stands(fresh),
    )
    .await;
    scenario(
        "a panicking step fails with kind panic and other trees keep running",
        single::a_panicking_step_fails_with_kind_panic_and_other_trees_keep_running(fresh),
    )
    .await;
    scenario(
        "starting the same id is idempotent and scopes are enforced",
        single::starting_the_same_id_is_idempotent_and_scopes_are_enforced(fresh),
    )
    .await;
    scenario(
        "a start whose lease is taken over before its first record is fenced and writes nothing",
        single::a_start_whose_lease_is_taken_over_before_its_first_record_is_fenced_and_writes_nothing(fresh),
    )
    .await;
    scenario(
        "a host deadline times the tree out and beats a racing answer",
        single::a_host_deadline_times_the_tree_out_and_beats_a_racing_answer(fresh),
    )
    .await;
    scenario(
        "events report committed facts in order",
        single::events_report_committed_facts_in_order(fresh),
    )
    .await;
    scenario(
        "tree limits fail definitely and a tree over its history is closed",
        single::tree_limits_fail_definitely_and_a_tree_over_its_history_is_closed(fresh),
    )
    .await;

    scenario(
        "a fresh engine recovers a tree from a dropped engine unless its program is missing",
        recovery::a_fresh_engine_recovers_a_tree_from_a_dropped_engine_unless_its_program_is_missing(
            fresh,
        ),
    )
    .await;
    scenario(
        "crash before the pending commit dispatches exactly once after recovery",
        recovery::crash_before_the_pending_commit_dispatches_exactly_once_after_recovery(fresh),
    )
    .await;
    scenario(
        "crash after the pending commit with never parks and resolves without redispatch",
        recovery::crash_after_the_pending_commit_with_never_parks_and_resolves_without_redispatch(
            fresh,
        ),
    )
    .await;
    scenario(
        "crash with same identity redispatches under the same effect id",
        recovery::crash_with_same_identity_redispatches_under_the_same_effect_id(fresh),
    )
    .await;
    scenario(
        "crash after the settled commit completes without redispatch",
        recovery::crash_after_the_settled_commit_completes_without_redispatch(fresh),
    )
    .await;
    scenario(
        "a tree recovers from its latest snapshot and the records after it",
        recovery::a_tree_recovers_from_its_latest_snapshot_and_the_records_after_it(fresh),
    )
    .await;
    scenario(
        "a large state recorded as its changes is rebuilt by recovery",
        recovery::a_large_state_recorded_as_its_changes_is_rebuilt_by_recovery(fresh),
    )
    .await;
    scenario(
        "a forced takeover stops the old engine without writing",
        recovery::a_forced_takeover_stops_the_old_engine_without_writing(fresh),
    )
    .await;
    scenario(
        "a sleeping tree whose log moved wakes stopped in every sleep mode",
        recovery::a_sleeping_tree_whose_log_moved_wakes_stopped_in_every_sleep_mode(fresh),
    )
    .await;
    scenario(
        "closing an engine releases every sleeping tree and tells its handles",
        recovery::closing_an_engine_releases_every_sleeping_tree_and_tells_its_handles(fresh),
    )
    .await;

    scenario(
        "three children complete in declaration order with exact budget accounting",
        trees::three_children_complete_in_declaration_order_with_exact_budget_accounting(fresh),
    )
    .await;
    scenario(
        "any wakes on the first child and the rest drain canceled",
        trees::any_wakes_on_the_first_child_and_the_rest_drain_canceled(fresh),
    )
    .await;
    scenario(
        "an any wait over quick children settles once with every child of the round",
        trees::an_any_wait_over_quick_children_settles_once_with_every_child_of_the_round(fresh),
    )
    .await;
    scenario(
        "a round of children larger than a commit still settles its wait once",
        trees::a_round_of_children_larger_than_a_commit_still_settles_its_wait_once(fresh),
    )
    .await;
    scenario(
        "completing with live children cancels them and join waits for their drain",
        trees::completing_with_live_children_cancels_them_and_join_waits_for_their_drain(fresh),
    )
    .await;
    scenario(
        "refused starts are facts for the parent",
        trees::refused_starts_are_facts_for_the_parent(fresh),
    )
    .await;
    scenario(
        "a crash before the child start record starts the child exactly once",
        trees::a_crash_before_the_child_start_record_starts_the_child_exactly_once(fresh),
    )
    .await;
    scenario(
        "a crash around a children wait's end recovers its outcomes",
        trees::a_crash_around_a_children_waits_end_recovers_its_outcomes(fresh),
    )
    .await;
    scenario(
        "a crash after a signal control commit delivers it exactly once",
        trees::a_crash_after_a_signal_control_commit_delivers_it_exactly_once(fresh),
    )
    .await;
    scenario(
        "a busy tree keeps its lease while another engine tries to take it",
        reliability::a_busy_tree_keeps_its_lease_while_another_engine_tries_to_take_it(fresh),
    )
    .await;
    scenario(
        "twenty identical starts at once make one tree and nineteen handles on it",
        reliability::twenty_identical_starts_at_once_make_one_tree_and_nineteen_handles_on_it(
            fresh,
        ),
    )
    .await;
    scenario(
        "a take-up, a resolution and an answer at once share one owner",
        reliability::a_take_up_a_resolution_and_an_answer_at_once_share_one_owner(fresh),
    )
    .await;
    scenario(
        "a fenced engine reports the fencing when asked for the tree",
        reliability::a_fenced_engine_reports_the_fencing_when_asked_for_the_tree(fresh),
    )
    .await;
    scenario(
        "after close another owner takes every tree without force or waiting",
        reliability::after_close_another_owner_takes_every_tree_without_force_or_waiting(fresh),
    )
    .await;
    scenario(
        "a resent answer is a duplicate even after it ended the process",
        reliability::a_resent_answer_is_a_duplicate_even_after_it_ended_the_process(fresh),
    )
    .await;
    scenario(
        "a host signal with a reserved id is refused",
        reliability::a_host_signal_with_a_reserved_id_is_refused(fresh),
    )
    .await;
    scenario(
        "a parked child shows as needs attention and resolving it continues the tree",
        trees::a_parked_child_shows_as_needs_attention_and_resolving_it_continues_the_tree(fresh),
    )
    .await;
    scenario(
        "killing the root kills the subtree and events carry paths",
        trees::killing_the_root_kills_the_subtree_and_events_carry_paths(fresh),
    )
    .await;
    scenario(
        "a host deadline times out the whole subtree",
        trees::a_host_deadline_times_out_the_whole_subtree(fresh),
    )
    .await;
}

/// Runs one scenario; a panic inside it is raised again with the
/// scenario's name in front of the original message (whose location the
/// panic hook has already printed).
async fn scenario(name: &str, run: impl Future<Output = ()>) {
    let mut run = Box::pin(run);
    let outcome = std::future::poll_fn(|cx| {
        match std::panic::catch_unwind(AssertUnwindSafe(|| run.as_mut().poll(cx))) {
            Ok(Poll::Ready(())) => Poll::Ready(Ok(())),
            Ok(Poll::Pending) => Poll::Pending,
            Err(panic) => Poll::Ready(Err(panic)),
        }
    })
    .await;
    if let Err(panic) = outcome {
        panic!(
            "engine conformance scenario `{name}` failed: {}",
            panic_message(&*panic)
        );
    }
}

/// The text of a panic payload.
fn panic_message(panic: &(dyn Any + Send)) -> &str {
    panic
        .downcast_ref::<String>()
        .map(String::as_str)
        .or_else(|| panic.downcast_ref::<&str>().copied())
        .unwrap_or("a panic without a message")
}

/// The scope of every tree the scenarios start.
fn scope() -> Scope {
    Scope::new(SCOPE).expect("valid scope")
}

/// A host answer to `wait`.
fn answer(id: &str, wait: WaitId, value: bool) -> SignalRequest {
    SignalRequest {
        id: SignalId::new(id).expect("valid"),
        wait: Some(wait),
        payload: Payload::encode(&value).expect("encodes"),
    }
}

/// The stored records of `tree` after its latest snapshot (every record, for
/// a tree that wrote none).
async fn records(store: &dyn Store, tree: TreeId) -> Vec<Record> {
    store.load(tree).await.expect("loads").records
}

/// Inspects `tree` until `done` holds, and returns that view.
async fn wait_for(engine: &Engine, tree: TreeId, done: impl Fn(&TreeView) -> bool) -> TreeView {
    for _ in 0..10_000 {
        let view = engine
            .inspect(&scope(), tree, Visibility::Public)
            .await
            .expect("inspects");
        if done(&view) {
            return view;
        }
        tokio::task::yield_now().await;
    }
    panic!("condition never held");
}

/// Attaches to `tree` and awaits its termination.
async fn outcome(engine: &Engine, tree: TreeId) -> Termination {
    let handle = engine
        .process::<Payload>(&scope(), tree)
        .await
        .expect("attached");
    handle.await_result().await.expect("terminates")
}

#[cfg(test)]
mod tests {
    use baton_run::MemoryStore;

    use super::{engine_conformance, scenario};

    #[tokio::test]
    #[should_panic(expected = "engine conformance scenario `a named scenario` failed: boom 7")]
    async fn a_failing_scenario_is_named_in_the_panic() {
        scenario("a named scenario", async {
            tokio::task::yield_now().await;
            panic!("boom {}", 7);
        })
        .await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 1)]
    #[should_panic(expected = "run the kit on a current-thread runtime")]
    async fn the_kit_refuses_a_multi_thread_runtime() {
        engine_conformance(MemoryStore::new).await;
    }
}
