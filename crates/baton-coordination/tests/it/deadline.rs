//! Deadline and timer acceptance under a manual clock and tokio's paused time.

use std::sync::Arc;
use std::time::Duration;

use crate::common::{armed, clock, engine_on, request};
use baton_coordination::{Candidate, CandidateError, Deadline, INTERRUPTED};
use baton_run::log::RecordKind;
use baton_run::program::Definition;
use baton_run::{MemoryStore, Payload, RecoverOptions, Scope, Status, Timestamp};
use baton_testkit::{Cut, FaultStore};
use serde_json::Value;

fn bodies(memory: &MemoryStore, tree: baton_run::TreeId, kind: RecordKind) -> Vec<Value> {
    memory
        .records(tree)
        .iter()
        .filter(|record| record.kind == kind)
        .map(|record| serde_json::from_slice(&record.body).expect("json"))
        .collect()
}

#[tokio::test(start_paused = true)]
async fn it_fires_at_the_instant_and_not_before() {
    let time = clock(1_000);
    let program = Deadline::program();
    let engine = engine_on(Arc::new(MemoryStore::new()), &time, &[program.erase()]);
    let handle = engine
        .start(&program, request("at", Timestamp(5_000)))
        .await
        .expect("starts");
    armed(&handle).await;
    time.set(Timestamp(4_999));
    armed(&handle).await;
    assert_eq!(
        handle.inspect().await.expect("inspects").root().termination,
        None
    );
    time.set(Timestamp(5_000));
    assert_eq!(handle.output().await.expect("completes"), Timestamp(5_000));
}

#[tokio::test(start_paused = true)]
async fn a_past_instant_completes_at_once() {
    let time = clock(10_000);
    let program = Deadline::program();
    let engine = engine_on(Arc::new(MemoryStore::new()), &time, &[program.erase()]);
    let handle = engine
        .start(&program, request("past", Timestamp(5_000)))
        .await
        .expect("starts");
    assert_eq!(handle.output().await.expect("completes"), Timestamp(5_000));
    assert_eq!(time.now_ms(), 10_000);
}

trait NowMs {
    fn now_ms(&self) -> u64;
}

impl NowMs for baton_run::ManualClock {
    fn now_ms(&self) -> u64 {
        baton_run::Clock::now(self).millis()
    }
}

#[tokio::test(start_paused = true)]
async fn after_a_crash_the_same_timer_fires_once_at_the_original_instant() {
    let time = clock(1_000);
    let program = Deadline::program();
    let memory = MemoryStore::keeping_history();
    let faulty = FaultStore::new(Arc::new(memory.clone()));
    faulty.arm(RecordKind::EffectPending, Cut::After, 1);
    let first = engine_on(Arc::new(faulty.clone()), &time, &[program.erase()]);
    let handle = first
        .start(&program, request("crash", Timestamp(3_000)))
        .await
        .expect("starts");
    assert!(handle.await_result().await.is_err(), "the writer stopped");
    let tree = handle.tree();
    drop(first);
    let pending = bodies(&memory, tree, RecordKind::EffectPending);
    assert_eq!(pending.len(), 1);

    let second = engine_on(faulty.inner(), &time, &[program.erase()]);
    second
        .recover(RecoverOptions::default())
        .await
        .expect("recovers");
    let handle = second
        .process::<Timestamp>(&Scope::new("acme").expect("valid"), tree)
        .await
        .expect("attached");
    armed(&handle).await;
    time.advance(Duration::from_millis(1_999));
    armed(&handle).await;
    time.advance(Duration::from_millis(1));
    assert_eq!(handle.output().await.expect("completes"), Timestamp(3_000));
    let settled = bodies(&memory, tree, RecordKind::EffectSettled);
    assert_eq!(settled.len(), 1, "the timer settled exactly once");
    assert_eq!(
        settled[0]["effect"], pending[0]["effect"],
        "under the same effect id"
    );
    assert_eq!(bodies(&memory, tree, RecordKind::EffectPending).len(), 1);
}

#[tokio::test(start_paused = true)]
async fn canceling_a_waiting_deadline_interrupts_its_timer() {
    let time = clock(1_000);
    let program = Deadline::program();
    let memory = MemoryStore::keeping_history();
    let engine = engine_on(Arc::new(memory.clone()), &time, &[program.erase()]);
    let handle = engine
        .start(&program, request("cancel", Timestamp(9_000)))
        .await
        .expect("starts");
    armed(&handle).await;
    handle.cancel("no longer needed").await.expect("canceled");
    let ended = handle.await_result().await.expect("ends");
    assert_eq!(ended.status(), Status::Canceled);
    let settled = bodies(&memory, handle.tree(), RecordKind::EffectSettled);
    assert_eq!(
        settled[0]["settlement"]["failure"]["code"],
        Value::from(INTERRUPTED)
    );
}

#[tokio::test]
async fn zero_instants_are_refused_everywhere() {
    let program = Deadline::program();
    let engine = engine_on(Arc::new(MemoryStore::new()), &clock(1), &[program.erase()]);
    let refused = engine
        .start(&program, request("zero", Timestamp(0)))
        .await
        .expect_err("refused");
    assert_eq!(refused.code(), "execution.input.invalid");
    let direct = Deadline::new()
        .start(&Payload::encode(&0).expect("encodes"))
        .err()
        .expect("refused");
    assert_eq!(direct.failure().code(), "coordination.deadline.zero");
    assert!(matches!(
        Candidate::new("timeout", &program, &Timestamp(0)),
        Err(CandidateError::Input(_))
    ));
}
