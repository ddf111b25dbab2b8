//! FirstSuccess acceptance: the first accepted outcome in request order
//! wins, losers are canceled, refused starts and rejections are kept.

use std::sync::Arc;

use crate::common::{
    answer_child, answer_to, clock, engine_on, gate, key, open_wait, race, request, yes_or_timeout,
};
use baton_coordination::{Candidate, ConfigError, FirstSuccess, FirstSuccessConfig, Outcome, Race};
use baton_run::{Capabilities, Cause, MemoryStore, Name, Status};

fn gates(keys: &[&str]) -> Vec<Candidate> {
    keys.iter()
        .map(|k| Candidate::new(k, &gate(), &format!("{k}?")).expect("valid candidate"))
        .collect()
}

fn winner_key(race: &Race) -> Option<&str> {
    race.winner.as_ref().map(|w| w.key.as_str())
}

#[tokio::test]
async fn a_rejected_first_finisher_keeps_the_race_going_and_the_second_wins() {
    let program = race(3, yes_or_timeout()).program();
    let engine = engine_on(Arc::new(MemoryStore::new()), &clock(1), &[program.erase()]);
    let handle = engine
        .start(&program, request("three", gates(&["a", "b", "c"])))
        .await
        .expect("starts");
    answer_child(&handle, "a", "no").await;
    // The rejection is a fact; the race waits again for the others.
    let a = handle.child::<baton_coordination::Answer>(&key("a"));
    a.await_result().await.expect("a ended");
    for _ in 0..1000 {
        let view = handle.inspect().await.expect("inspects");
        if view.root().status == Status::Waiting && view.root().usage.steps >= 2 {
            break;
        }
        tokio::task::yield_now().await;
    }
    let view = handle.inspect().await.expect("inspects");
    assert_eq!(view.root().status, Status::Waiting);
    assert_eq!(view.root().termination, None);
    answer_child(&handle, "b", "yes").await;
    let race = handle.output().await.expect("completes");
    assert_eq!(winner_key(&race), Some("b"));
    assert_eq!(
        race.outcomes
            .iter()
            .map(|o| o.key.as_str())
            .collect::<Vec<_>>(),
        ["a", "b"]
    );
    assert!(race.starts.iter().all(|s| s.process.is_some()));
    let c = handle
        .child::<baton_coordination::Answer>(&key("c"))
        .join()
        .await
        .expect("c drained");
    assert_eq!(
        (c.status(), c.cause()),
        (Status::Canceled, Cause::ParentCancellation)
    );
    handle.join().await.expect("the tree drains");
}

#[tokio::test]
async fn request_order_wins_among_outcomes_that_arrive_together() {
    let program = race(3, yes_or_timeout()).program();
    let engine = engine_on(Arc::new(MemoryStore::new()), &clock(1), &[program.erase()]);
    let handle = engine
        .start(&program, request("order", gates(&["a", "b", "c"])))
        .await
        .expect("starts");
    let b = handle.child::<baton_coordination::Answer>(&key("b"));
    let c = handle.child::<baton_coordination::Answer>(&key("c"));
    let (b_wait, c_wait) = (open_wait(&b).await, open_wait(&c).await);
    // Both answers reach the tree before the race steps again, c's first:
    // the race sees both outcomes in one wake-up and b wins by request order.
    let (c_sent, b_sent) = tokio::join!(
        c.signal(answer_to("c-yes", c_wait, "yes")),
        b.signal(answer_to("b-yes", b_wait, "yes")),
    );
    c_sent.expect("admitted");
    b_sent.expect("admitted");
    let race = handle.output().await.expect("completes");
    assert_eq!(winner_key(&race), Some("b"));
    assert_eq!(
        race.outcomes
            .iter()
            .map(|o| o.key.as_str())
            .collect::<Vec<_>>(),
        ["b", "c"],
        "outcomes are kept in request order"
    );
}

#[tokio::test]
async fn no_winner_is_a_valid_result_and_refused_starts_are_kept() {
    let program = race(3, yes_or_timeout()).program();
    let engine = engine_on(Arc::new(MemoryStore::new()), &clock(1), &[program.erase()]);
    let net = Capabilities::of([Name::new("net").expect("valid")]);
    let mut candidates = gates(&["a", "b"]);
    candidates[0] = candidates[0].clone().with_capabilities(net);
    let handle = engine
        .start(&program, request("none", candidates))
        .await
        .expect("starts");
    answer_child(&handle, "b", "no").await;
    let race = handle.output().await.expect("completes");
    assert_eq!(race.winner, None);
    assert_eq!(
        race.starts[0].failure.as_ref().map(|f| f.code()),
        Some("engine.child.capability_escalation")
    );
    assert!(race.starts[1].process.is_some());
    assert_eq!(race.outcomes.len(), 1);
}

#[tokio::test]
async fn an_accept_error_fails_the_race() {
    let program = race(2, Arc::new(|_: &Outcome| Err("cannot judge".to_owned()))).program();
    let engine = engine_on(Arc::new(MemoryStore::new()), &clock(1), &[program.erase()]);
    let handle = engine
        .start(&program, request("accept-error", gates(&["a"])))
        .await
        .expect("starts");
    answer_child(&handle, "a", "yes").await;
    let ended = handle.await_result().await.expect("ends");
    assert_eq!(
        ended.failure().map(|f| f.code()),
        Some("coordination.first_success.accept_failed")
    );
}

#[tokio::test]
async fn inputs_over_max_candidates_empty_or_with_duplicate_keys_are_refused() {
    let program = race(2, yes_or_timeout()).program();
    let engine = engine_on(Arc::new(MemoryStore::new()), &clock(1), &[program.erase()]);
    let over = engine
        .start(&program, request("over", gates(&["a", "b", "c"])))
        .await
        .expect_err("refused");
    assert_eq!(over.code(), "execution.input.invalid");
    let empty = engine
        .start(&program, request("empty", Vec::new()))
        .await
        .expect_err("refused");
    assert_eq!(empty.code(), "execution.input.invalid");
    let duplicate = engine
        .start(&program, request("duplicate", gates(&["a", "a"])))
        .await
        .expect_err("refused");
    assert_eq!(duplicate.code(), "coordination.first_success.duplicate_key");
}

#[test]
fn zero_max_candidates_and_no_programs_are_configuration_errors() {
    let config = |max_candidates, candidates| FirstSuccessConfig {
        name: "test.race".into(),
        description: "Races.".into(),
        build: "b".into(),
        candidates,
        max_candidates,
        accept: yes_or_timeout(),
    };
    assert_eq!(
        FirstSuccess::new(config(0, vec![gate().erase()])).expect_err("rejected"),
        ConfigError::ZeroMaxCandidates
    );
    assert_eq!(
        FirstSuccess::new(config(1, Vec::new())).expect_err("rejected"),
        ConfigError::NoCandidatePrograms
    );
    let one = FirstSuccess::new(config(1, vec![gate().erase()])).expect("valid");
    let two = FirstSuccess::new(config(2, vec![gate().erase()])).expect("valid");
    assert_ne!(
        one.program().reference().configuration,
        two.program().reference().configuration
    );
}
