//! Activities: a program whose one effect runs an async function, alone and
//! as a workflow's `call` stage; replay policies across a crash, timeouts,
//! panics, classified errors and approval.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use baton_run::dispatch::ReplayPolicy;
use baton_run::log::RecordKind;
use baton_run::{
    Engine, EngineConfig, FailureKind, ManualClock, MemoryStore, Payload, Program, RecoverOptions,
    Scope, Settlement, SignalId, SignalRequest, Status, Timestamp, Visibility,
};
use baton_testkit::{Cut, FaultStore};
use baton_workflow::{
    ACTIVITY_DENIED, ACTIVITY_PANICKED, ACTIVITY_TIMED_OUT, Activity, ActivityConfig,
    ActivityContext, ActivityError, Approval, ApprovalRequest, Child, Config, Verdict, Workflow,
    call, transform,
};

use crate::common::{engine, open_wait, request};

/// What a recording activity saw: the idempotency key of every call.
#[derive(Clone, Default)]
struct Calls(Arc<Mutex<Vec<String>>>);

impl Calls {
    fn keys(&self) -> Vec<String> {
        self.0.lock().expect("not poisoned").clone()
    }
}

/// An activity doubling its input, recording each call's idempotency key.
fn doubler(replay: ReplayPolicy, approval: Approval, calls: &Calls) -> Activity<u64, u64> {
    let calls = calls.clone();
    let mut config = ActivityConfig::new("test.double", "Doubles a number.");
    config.replay = replay;
    config.approval = approval;
    Activity::new(config, move |n: u64, context: ActivityContext| {
        let calls = calls.clone();
        async move {
            calls
                .0
                .lock()
                .expect("not poisoned")
                .push(context.idempotency_key().to_string());
            Ok(n * 2)
        }
    })
    .expect("a valid activity")
}

fn scope() -> Scope {
    Scope::new("acme").expect("valid")
}

#[tokio::test]
async fn a_call_stage_runs_an_activity_and_hands_it_the_effect_id_as_idempotency_key() {
    let calls = Calls::default();
    let activity = doubler(ReplayPolicy::Never, Approval::NotRequired, &calls);
    let workflow = Workflow::new(Config {
        name: "test.io".into(),
        description: "Adds one, doubles through I/O.".into(),
        build: "activity tests 1".into(),
        stages: vec![
            transform("inc", |n: u64| Ok(n + 1)),
            call("double", Child::new(&activity.program())),
        ],
    })
    .expect("valid workflow");
    let program = workflow.program::<u64, u64>();
    let engine = engine(&program);
    let handle = engine
        .start(&program, request("io", 20))
        .await
        .expect("starts");
    assert_eq!(handle.output().await.expect("completes"), 42);
    let keys = calls.keys();
    assert_eq!(keys.len(), 1);
    assert!(keys[0].starts_with("e_"), "{keys:?}");
}

#[tokio::test]
async fn an_activity_under_never_lost_in_a_crash_is_an_unknown_effect_the_host_resolves() {
    let calls = Calls::default();
    let activity = doubler(ReplayPolicy::Never, Approval::NotRequired, &calls);
    let program = activity.program();
    let faulty = FaultStore::new(Arc::new(MemoryStore::keeping_history()));
    faulty.arm(RecordKind::EffectPending, Cut::After, 1);
    let first = engine_on(Arc::new(faulty.clone()), &program);
    let handle = first
        .start(&program, request("never", 5))
        .await
        .expect("starts");
    assert!(handle.await_result().await.is_err(), "the writer stopped");
    assert!(faulty.crashed());
    let tree = handle.tree();
    drop(first);

    let second = engine_on(faulty.inner(), &program);
    second
        .recover(RecoverOptions::default())
        .await
        .expect("lists");
    let root = second
        .process::<u64>(&scope(), tree)
        .await
        .expect("attached");
    let view = parked(&root).await;
    assert!(calls.keys().is_empty(), "the uncertain call was never sent");
    second
        .resolve_unknown(
            &scope(),
            tree,
            view,
            Settlement::ok(Payload::encode(&10u64).expect("encodes")),
        )
        .await
        .expect("resolves");
    assert_eq!(root.output().await.expect("completes"), 10);
    assert!(calls.keys().is_empty(), "resolving never runs the function");
}

#[tokio::test]
async fn an_activity_under_same_identity_is_sent_again_with_the_same_idempotency_key() {
    let calls = Calls::default();
    let activity = doubler(ReplayPolicy::SameIdentity, Approval::NotRequired, &calls);
    let program = activity.program();
    let faulty = FaultStore::new(Arc::new(MemoryStore::keeping_history()));
    // The first attempt runs, then its settlement is lost in the crash.
    faulty.arm(RecordKind::EffectSettled, Cut::Before, 1);
    let first = engine_on(Arc::new(faulty.clone()), &program);
    let handle = first
        .start(&program, request("same", 5))
        .await
        .expect("starts");
    assert!(handle.await_result().await.is_err(), "the writer stopped");
    let tree = handle.tree();
    drop(first);
    assert_eq!(calls.keys().len(), 1, "the first attempt ran");

    let second = engine_on(faulty.inner(), &program);
    second
        .recover(RecoverOptions::default())
        .await
        .expect("lists");
    let root = second
        .process::<u64>(&scope(), tree)
        .await
        .expect("attached");
    assert_eq!(root.output().await.expect("completes"), 10);
    let keys = calls.keys();
    assert_eq!(keys.len(), 2, "sent again after the crash");
    assert_eq!(keys[0], keys[1], "with the same idempotency key");
}

#[tokio::test]
async fn a_panicking_function_fails_its_call_with_a_classified_failure() {
    let activity: Activity<u64, u64> = Activity::new(
        ActivityConfig::new("test.panics", "Panics."),
        |n: u64, _context: ActivityContext| async move { explode(n) },
    )
    .expect("valid");
    let program = activity.program();
    let engine = engine(&program);
    let termination = engine
        .start(&program, request("panics", 1))
        .await
        .expect("starts")
        .await_result()
        .await
        .expect("terminates");
    let failure = termination.failure().expect("a failure");
    assert_eq!(failure.code(), ACTIVITY_PANICKED);
    assert_eq!(failure.kind, FailureKind::Panic);
    assert!(failure.message.contains("the disk is on fire"), "{failure}");
    // The engine is alive: another tree runs.
    let again = engine
        .start(&program, request("panics-again", 1))
        .await
        .expect("starts")
        .await_result()
        .await
        .expect("terminates");
    assert_eq!(again.status(), Status::Failed);
}

#[tokio::test]
async fn a_function_error_keeps_its_own_code() {
    let activity: Activity<u64, u64> = Activity::new(
        ActivityConfig::new("test.refuses", "Refuses."),
        |n: u64, _context: ActivityContext| async move {
            Err(ActivityError::coded(
                "test.too_big",
                format!("{n} is too big"),
            ))
        },
    )
    .expect("valid");
    let program = activity.program();
    let termination = engine(&program)
        .start(&program, request("refuses", 7))
        .await
        .expect("starts")
        .await_result()
        .await
        .expect("terminates");
    let failure = termination.failure().expect("a failure");
    assert_eq!(failure.code(), "test.too_big");
    assert_eq!(failure.kind, FailureKind::External);
    assert_eq!(failure.message, "7 is too big");
}

#[tokio::test]
async fn a_call_past_its_timeout_on_the_engine_clock_fails_as_timed_out() {
    let clock = Arc::new(ManualClock::new(Timestamp(1_000)));
    let mut config = ActivityConfig::new("test.hangs", "Never answers.");
    config.timeout = Duration::from_secs(5);
    let activity: Activity<u64, u64> =
        Activity::new(config, |_n: u64, _context: ActivityContext| async move {
            std::future::pending::<()>().await;
            Ok(0)
        })
        .expect("valid");
    let program = activity.program();
    let engine = Engine::new(EngineConfig {
        programs: vec![program.erase()],
        clock: clock.clone(),
        ..EngineConfig::new(Arc::new(MemoryStore::new()))
    })
    .expect("valid engine");
    let handle = engine
        .start(&program, request("hangs", 1))
        .await
        .expect("starts");
    let result = tokio::spawn(async move { handle.await_result().await });
    for _ in 0..100 {
        tokio::task::yield_now().await;
    }
    assert!(!result.is_finished(), "the call is still running");
    clock.advance(Duration::from_secs(5));
    let termination = result.await.expect("joins").expect("terminates");
    let failure = termination.failure().expect("a failure");
    assert_eq!(failure.code(), ACTIVITY_TIMED_OUT);
}

#[tokio::test]
async fn an_approval_gated_activity_runs_only_after_approval_and_a_denial_fails_with_the_reason() {
    let calls = Calls::default();
    let activity = doubler(ReplayPolicy::Never, Approval::Required, &calls);
    let program = activity.program();
    let engine = engine(&program);

    let approved = engine
        .start(&program, request("approved", 4))
        .await
        .expect("starts");
    let wait = open_wait(&approved).await;
    let view = engine
        .inspect(&scope(), approved.tree(), Visibility::Private)
        .await
        .expect("inspects");
    let shown: ApprovalRequest = view.root().open_waits[0]
        .request
        .as_ref()
        .expect("private view shows the request")
        .decode()
        .expect("an approval request");
    assert_eq!(shown.activity.as_str(), "test.double");
    assert_eq!(shown.input, Payload::encode(&4u64).expect("encodes"));
    assert!(calls.keys().is_empty(), "nothing runs before approval");
    approved
        .signal(SignalRequest {
            id: SignalId::new("approve-1").expect("valid"),
            wait: Some(wait),
            payload: Payload::encode(&Verdict::Approve).expect("encodes"),
        })
        .await
        .expect("admitted");
    assert_eq!(approved.output().await.expect("completes"), 8);
    assert_eq!(calls.keys().len(), 1);

    let denied = engine
        .start(&program, request("denied", 4))
        .await
        .expect("starts");
    let wait = open_wait(&denied).await;
    denied
        .signal(SignalRequest {
            id: SignalId::new("deny-1").expect("valid"),
            wait: Some(wait),
            payload: Payload::encode(&Verdict::Deny {
                reason: "not on a Friday".into(),
            })
            .expect("encodes"),
        })
        .await
        .expect("admitted");
    let termination = denied.await_result().await.expect("terminates");
    let failure = termination.failure().expect("a failure");
    assert_eq!(failure.code(), ACTIVITY_DENIED);
    assert_eq!(failure.message, "not on a Friday");
    assert_eq!(calls.keys().len(), 1, "the denied call never ran");
}

#[tokio::test]
async fn an_approval_wait_survives_a_crash_and_is_answered_on_the_next_engine() {
    let calls = Calls::default();
    let activity = doubler(ReplayPolicy::Never, Approval::Required, &calls);
    let program = activity.program();
    let store = Arc::new(MemoryStore::new());
    let first = engine_on(store.clone(), &program);
    let handle = first
        .start(&program, request("durable", 3))
        .await
        .expect("starts");
    let wait = open_wait(&handle).await;
    let tree = handle.tree();
    drop(handle);
    drop(first);

    let second = engine_on(store, &program);
    let root = second
        .process::<u64>(&scope(), tree)
        .await
        .expect("taken up");
    root.signal(SignalRequest {
        id: SignalId::new("approve").expect("valid"),
        wait: Some(wait),
        payload: Payload::encode(&Verdict::Approve).expect("encodes"),
    })
    .await
    .expect("admitted");
    assert_eq!(root.output().await.expect("completes"), 6);
    assert_eq!(calls.keys().len(), 1);
}

#[test]
fn a_zero_timeout_is_refused_when_the_activity_is_built() {
    let mut config = ActivityConfig::new("test.zero", "Zero timeout.");
    config.timeout = Duration::ZERO;
    let error =
        Activity::<u64, u64>::new(
            config,
            |n: u64, _context: ActivityContext| async move { Ok(n) },
        )
        .expect_err("refused");
    assert!(
        matches!(error, baton_workflow::ConfigError::ZeroTimeout { .. }),
        "{error:?}"
    );
}

fn engine_on<I, O>(store: Arc<dyn baton_run::store::Store>, program: &Program<I, O>) -> Engine {
    Engine::new(EngineConfig {
        programs: vec![program.erase()],
        ..EngineConfig::new(store)
    })
    .expect("the engine configuration is valid")
}

/// Waits until the root parks and returns its unknown effect.
async fn parked<O>(root: &baton_run::ProcessHandle<O>) -> baton_run::EffectId {
    for _ in 0..20_000 {
        let view = root.inspect().await.expect("inspects");
        if view.root().status == Status::Parked {
            return view.root().unknown_effects[0];
        }
        tokio::task::yield_now().await;
    }
    panic!("the root never parked");
}

/// Panics for any positive input.
fn explode(n: u64) -> Result<u64, ActivityError> {
    if n > 0 {
        panic!("the disk is on fire");
    }
    Ok(n)
}

#[test]
fn an_activity_definition_passes_definition_conformance() {
    use baton_run::program::{Signal, SignalBody};
    use baton_run::{ChildKey, EffectId, ProcessId, StartId, WaitId};
    use baton_testkit::{ConformanceCase, definition_conformance};

    let root = ProcessId::root(&StartId::new("acme", "conformance").expect("valid"));
    let effect = |step: u64| EffectId::new(root, step, 0);
    let result = |step: u64, body: SignalBody| Signal {
        id: SignalId::for_effect(effect(step)),
        wait: None,
        body,
    };
    let settled = |step: u64, settlement: Settlement| {
        result(
            step,
            SignalBody::Settled {
                effect: effect(step),
                settlement,
            },
        )
    };
    let input = Payload::encode(&4u64).expect("encodes");
    let output = Payload::encode(&8u64).expect("encodes");
    let plain = doubler(
        ReplayPolicy::Never,
        Approval::NotRequired,
        &Calls::default(),
    )
    .program();
    definition_conformance(
        plain.definition().as_ref(),
        &[
            ConformanceCase::new(
                "succeeds",
                input.clone(),
                vec![vec![], vec![settled(0, Settlement::ok(output.clone()))]],
            ),
            ConformanceCase::new(
                "fails",
                input.clone(),
                vec![
                    vec![],
                    vec![settled(
                        0,
                        Settlement::failed(baton_run::Failure::external("test.no", "no")),
                    )],
                ],
            ),
        ],
    );
    let gated = doubler(ReplayPolicy::Never, Approval::Required, &Calls::default()).program();
    let wait = WaitId::for_effect(effect(0));
    let opened = result(
        0,
        SignalBody::WaitOpened {
            effect: effect(0),
            wait,
            key: ChildKey::new("approval").expect("valid"),
            request: Payload::null(),
        },
    );
    let verdict = |verdict: Verdict| Signal {
        id: SignalId::new("verdict").expect("valid"),
        wait: Some(wait),
        body: SignalBody::Input {
            payload: Payload::encode(&verdict).expect("encodes"),
        },
    };
    definition_conformance(
        gated.definition().as_ref(),
        &[
            ConformanceCase::new(
                "approved",
                input.clone(),
                vec![
                    vec![],
                    vec![opened.clone()],
                    vec![verdict(Verdict::Approve)],
                    vec![settled(2, Settlement::ok(output))],
                ],
            ),
            ConformanceCase::new(
                "denied",
                input,
                vec![
                    vec![],
                    vec![opened],
                    vec![verdict(Verdict::Deny {
                        reason: "no".into(),
                    })],
                ],
            ),
        ],
    );
}

#[tokio::test]
async fn a_dynamic_activity_checks_its_run_time_schemas_and_charges_the_usage_it_reports() {
    use baton_run::program::Schema;
    use baton_run::{Budget, Meters, Name};
    use baton_workflow::{ActivityOutput, ActivitySchemas};

    let calls = Name::new("api_calls").expect("valid");
    let mut config = ActivityConfig::new("test.dynamic", "Greets a name.");
    config.reserve = Meters::from([(calls.clone(), 1)]);
    let charged = calls.clone();
    let activity = Activity::dynamic(
        config,
        ActivitySchemas {
            input: Schema::parse(
                r#"{"type":"object","properties":{"name":{"type":"string"}},"required":["name"]}"#,
            )
            .expect("compiles"),
            output: Schema::parse(r#"{"type":"string"}"#).expect("compiles"),
        },
        move |input: Payload, _context: ActivityContext| {
            let charged = charged.clone();
            async move {
                let name = input.to_value()["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned();
                Ok(ActivityOutput {
                    output: Payload::encode(&format!("hello {name}")).expect("encodes"),
                    usage: Meters::from([(charged, 1)]),
                })
            }
        },
    )
    .expect("valid");
    let program = activity.program();
    let engine = engine(&program);
    let refused = engine
        .start(
            &program,
            request(
                "dynamic-bad",
                Payload::parse_str(r#"{"nom":"x"}"#).expect("json"),
            ),
        )
        .await;
    assert!(
        refused.is_err(),
        "an input breaking the run-time schema is refused"
    );
    let mut start = request(
        "dynamic",
        Payload::parse_str(r#"{"name":"ada"}"#).expect("json"),
    );
    start.budget = Budget::unlimited().with_meter(calls.clone(), 5);
    let handle = engine.start(&program, start).await.expect("starts");
    let output = handle.output().await.expect("completes");
    assert_eq!(output.to_value(), serde_json::json!("hello ada"));
    let view = handle.inspect().await.expect("inspects");
    assert_eq!(
        view.root().usage.meters.get(&calls).copied(),
        Some(1),
        "charged what it reported"
    );
}
