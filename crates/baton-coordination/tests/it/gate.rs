//! InputGate acceptance: answered through the host-signal API, refusals
//! leave the gate unchanged, and its wait survives a crash.

use std::sync::Arc;

use crate::common::{answer_to, clock, engine_on, gate, open_wait, request};
use baton_coordination::{Answer, ConfigError, GateConfig, InputGate};
use baton_run::log::RecordKind;
use baton_run::program::Schema;
use baton_run::{
    EffectId, MemoryStore, Payload, RecoverOptions, SignalError, SignalId, SignalReceipt,
    SignalRequest, Status, WaitId,
};
use baton_testkit::{Cut, FaultStore};

#[tokio::test]
async fn an_answer_addressed_to_the_gate_completes_it_with_the_whole_signal() {
    let program = gate();
    let engine = engine_on(Arc::new(MemoryStore::new()), &clock(1), &[program.erase()]);
    let handle = engine
        .start(&program, request("ask", "ship it?".to_owned()))
        .await
        .expect("starts");
    let wait = open_wait(&handle).await;
    let view = handle.inspect().await.expect("inspects");
    let open = &view.root().open_waits[0];
    assert_eq!(open.key.as_str(), baton_coordination::WAIT_KEY);
    assert_eq!(open.answer_schema, *Schema::of::<String>().json());
    let receipt = handle
        .signal(answer_to("alice-1", wait, "yes"))
        .await
        .expect("admitted");
    assert_eq!(receipt, SignalReceipt::Admitted);
    let answer = handle.output().await.expect("completes");
    assert_eq!(
        answer,
        Answer {
            id: SignalId::new("alice-1").expect("valid"),
            wait,
            payload: Payload::encode(&"yes").expect("encodes"),
        }
    );
}

#[tokio::test]
async fn wrong_invalid_unaddressed_and_duplicate_answers_leave_the_gate_unchanged() {
    let program = gate();
    let engine = engine_on(Arc::new(MemoryStore::new()), &clock(1), &[program.erase()]);
    let handle = engine
        .start(&program, request("refusals", "ship it?".to_owned()))
        .await
        .expect("starts");
    let wait = open_wait(&handle).await;
    let before = handle.inspect().await.expect("inspects");

    let elsewhere = WaitId::for_effect(EffectId::new(handle.id(), 7, 0));
    let wrong = handle
        .signal(answer_to("a-1", elsewhere, "yes"))
        .await
        .expect_err("wrong wait");
    assert_eq!(wrong.code(), "engine.signal.unknown_wait");
    let invalid = handle
        .signal(SignalRequest {
            id: SignalId::new("a-2").expect("valid"),
            wait: Some(wait),
            payload: Payload::encode(&42).expect("encodes"),
        })
        .await
        .expect_err("schema violation");
    assert_eq!(invalid.code(), "engine.signal.answer.invalid");
    let unaddressed = handle
        .signal(SignalRequest {
            id: SignalId::new("a-3").expect("valid"),
            wait: None,
            payload: Payload::encode(&"yes").expect("encodes"),
        })
        .await
        .expect_err("unaddressed");
    assert_eq!(unaddressed.code(), "engine.signal.rejected");
    assert_eq!(handle.inspect().await.expect("inspects"), before);

    // Two answers reach the tree before the gate steps: the first closes
    // the wait, the same signal again is a no-op, another answer is refused.
    let first = answer_to("b-1", wait, "yes");
    let second = answer_to("b-2", wait, "no");
    let (a, b, c) = tokio::join!(
        handle.signal(first.clone()),
        handle.signal(first.clone()),
        handle.signal(second.clone()),
    );
    assert_eq!(a.expect("admitted"), SignalReceipt::Admitted);
    assert_eq!(b.expect("idempotent"), SignalReceipt::Duplicate);
    assert!(matches!(c, Err(SignalError::WaitClosed { .. })), "{c:?}");
    let answer = handle.output().await.expect("completes");
    assert_eq!(answer.payload, Payload::encode(&"yes").expect("encodes"));
    let after = handle.inspect().await.expect("inspects");
    let refused = handle.signal(second).await.expect_err("one-shot");
    assert_eq!(refused.code(), "engine.signal.terminated");
    assert_eq!(
        handle.inspect().await.expect("inspects").head_seq,
        after.head_seq
    );
}

#[tokio::test]
async fn a_crash_after_the_wait_opened_leaves_it_answerable_by_the_same_wait_id() {
    let program = gate();
    let memory = MemoryStore::keeping_history();
    let faulty = FaultStore::new(Arc::new(memory.clone()));
    faulty.arm(RecordKind::StepAdopted, Cut::After, 1);
    let time = clock(1);
    let first = engine_on(Arc::new(faulty.clone()), &time, &[program.erase()]);
    // The root waits in its first round, so its start and its opened wait
    // are one commit: the crash cuts the start itself, after it was stored.
    let start = || request("crash", "ship it?".to_owned());
    let tree = baton_testkit::start_into_crash(&first, &program, start()).await;
    assert!(faulty.crashed());
    drop(first);

    let second = engine_on(faulty.inner(), &time, &[program.erase()]);
    second
        .recover(RecoverOptions::default())
        .await
        .expect("recovers");
    let handle = second.start(&program, start()).await.expect("starts again");
    assert!(!handle.is_new(), "the crashed start was stored");
    assert_eq!(handle.tree(), tree);
    let wait = open_wait(&handle).await;
    // The wait id is derived from the effect that opened it, so it is the
    // one the crashed engine handed out.
    assert_eq!(wait, WaitId::for_effect(EffectId::new(tree, 0, 0)));
    handle
        .signal(answer_to("after-crash", wait, "yes"))
        .await
        .expect("admitted");
    let answer = handle.output().await.expect("completes");
    assert_eq!(answer.wait, wait);
    assert_eq!(answer.id.as_str(), "after-crash");
}

#[tokio::test]
async fn cancellation_while_waiting_ends_the_gate_canceled_without_output() {
    let program = gate();
    let engine = engine_on(Arc::new(MemoryStore::new()), &clock(1), &[program.erase()]);
    let handle = engine
        .start(&program, request("cancel", "ship it?".to_owned()))
        .await
        .expect("starts");
    let wait = open_wait(&handle).await;
    handle.cancel("not needed").await.expect("canceled");
    let ended = handle.await_result().await.expect("ends");
    assert_eq!(ended.status(), Status::Canceled);
    assert!(ended.output().is_none());
    let late = handle
        .signal(answer_to("late", wait, "yes"))
        .await
        .expect_err("terminated");
    assert_eq!(late.code(), "engine.signal.terminated");
}

#[test]
fn a_gate_needs_an_answerable_schema_and_a_valid_name() {
    let config = |name: &str, answer: Schema| GateConfig {
        name: name.into(),
        description: "Asks.".into(),
        request_schema: Schema::of::<String>(),
        answer_schema: answer,
    };
    assert_eq!(
        InputGate::new(config("a.b", Schema::reject_all())).expect_err("rejected"),
        ConfigError::AnswerSchemaRejectsAll
    );
    assert!(matches!(
        InputGate::new(config("Not Valid", Schema::any())).expect_err("rejected"),
        ConfigError::Descriptor(_)
    ));
    let a = InputGate::new(config("a.b", Schema::of::<String>()))
        .expect("valid")
        .program::<String>();
    let b = InputGate::new(config("a.b", Schema::of::<bool>()))
        .expect("valid")
        .program::<String>();
    assert_ne!(
        a.reference().configuration,
        b.reference().configuration,
        "the answer schema is configuration"
    );
}
