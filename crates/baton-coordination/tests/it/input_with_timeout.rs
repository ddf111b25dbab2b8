//! "Input with timeout": a FirstSuccess racing an InputGate against a Deadline.

use std::sync::Arc;
use std::time::Duration;

use crate::common::{
    answer_child, armed, clock, engine_on, gate, key, race, request, yes_or_timeout,
};
use baton_coordination::{Candidate, Deadline};
use baton_run::{Cause, MemoryStore, Status, Timestamp};

fn candidates(deadline: u64) -> Vec<Candidate> {
    vec![
        Candidate::new("input", &gate(), &"approve the deploy?".to_owned()).expect("valid"),
        Candidate::new("timeout", &Deadline::program(), &Timestamp(deadline)).expect("valid"),
    ]
}

#[tokio::test(start_paused = true)]
async fn an_answer_before_the_deadline_wins_and_cancels_the_timer() {
    let time = clock(1_000);
    let program = race(2, yes_or_timeout()).program();
    let engine = engine_on(Arc::new(MemoryStore::new()), &time, &[program.erase()]);
    let handle = engine
        .start(&program, request("answered", candidates(60_000)))
        .await
        .expect("starts");
    armed(&handle.child::<Timestamp>(&key("timeout"))).await;
    answer_child(&handle, "input", "yes").await;
    let race = handle.output().await.expect("completes");
    let winner = race.winner.expect("a winner");
    assert_eq!(winner.key.as_str(), "input");
    assert_eq!(
        winner.output().expect("output").to_value()["payload"],
        "yes"
    );
    let timer = handle
        .child::<Timestamp>(&key("timeout"))
        .join()
        .await
        .expect("drained");
    assert_eq!(
        (timer.status(), timer.cause()),
        (Status::Canceled, Cause::ParentCancellation)
    );
}

#[tokio::test(start_paused = true)]
async fn the_deadline_wins_when_nobody_answers() {
    let time = clock(1_000);
    let program = race(2, yes_or_timeout()).program();
    let engine = engine_on(Arc::new(MemoryStore::new()), &time, &[program.erase()]);
    let handle = engine
        .start(&program, request("silent", candidates(60_000)))
        .await
        .expect("starts");
    armed(&handle.child::<Timestamp>(&key("timeout"))).await;
    time.advance(Duration::from_secs(59));
    armed(&handle.child::<Timestamp>(&key("timeout"))).await;
    time.advance(Duration::from_secs(1));
    let race = handle.output().await.expect("completes");
    assert_eq!(
        race.winner.map(|w| w.key.to_string()),
        Some("timeout".to_owned())
    );
    let gate_end = handle
        .child::<baton_coordination::Answer>(&key("input"))
        .join()
        .await
        .expect("drained");
    assert_eq!(gate_end.status(), Status::Canceled);
}
