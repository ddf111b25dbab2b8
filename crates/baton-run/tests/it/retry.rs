//! Retries as durable kernel policy: a dispatch's `RetryPolicy` tries an
//! attempt that failed with a `RetryHint` again after a backoff on the
//! engine's clock, every attempt and backoff a fact in the log, the backoff
//! a durable timer, and every attempt charged before it starts.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use baton_run::dispatch::{DispatchCall, Dispatcher, ReplayPolicy, RetryHint, RetryPolicy};
use baton_run::log::{RecordBody, RecordKind};
use baton_run::program::{
    Definition, Descriptor, Effect, Execution, ExecutionState, ProgramConfig, Schema, Signal,
    SignalBody, StepError, Transition, configuration_digest, implementation_digest,
};
use baton_run::{
    BoxFuture, Budget, Engine, EngineConfig, Failure, ManualClock, MemoryStore, Meters, Name,
    Payload, Program, Quota, RecoverOptions, Scope, Settlement, StartId, StartRequest, Status,
    Termination, Timestamp, TreeId,
};
use baton_testkit::{Cut, FaultStore};
use serde_json::{Value, json};

/// What the dispatcher answers to each attempt, in order; the last answer
/// repeats. Records the attempt numbers it was called with.
#[derive(Clone)]
struct Flaky {
    replay: ReplayPolicy,
    answers: Arc<Vec<Settlement>>,
    calls: Arc<Mutex<Vec<u32>>>,
}

impl Flaky {
    fn new(replay: ReplayPolicy, answers: Vec<Settlement>) -> Flaky {
        Flaky {
            replay,
            answers: Arc::new(answers),
            calls: Arc::default(),
        }
    }

    fn attempts(&self) -> Vec<u32> {
        self.calls.lock().expect("lock").clone()
    }
}

impl Dispatcher for Flaky {
    fn replay_policy(&self, _request: &Payload) -> ReplayPolicy {
        self.replay
    }

    fn dispatch(&self, call: DispatchCall) -> BoxFuture<'static, Settlement> {
        let index = {
            let mut calls = self.calls.lock().expect("lock");
            calls.push(call.attempt);
            calls.len() - 1
        };
        let answer = self.answers[index.min(self.answers.len() - 1)].clone();
        Box::pin(std::future::ready(answer))
    }
}

/// A program whose one step declares one dispatch (`retry`, reserving
/// `tokens`) and which completes with the settlement.
struct Once {
    descriptor: Descriptor,
    retry: RetryPolicy,
    tokens: u64,
}

struct OnceRun {
    retry: RetryPolicy,
    tokens: u64,
    asked: bool,
}

impl Definition for Once {
    fn descriptor(&self) -> &Descriptor {
        &self.descriptor
    }

    fn start(&self, _input: &Payload) -> Result<Box<dyn Execution>, StepError> {
        Ok(Box::new(OnceRun {
            retry: self.retry,
            tokens: self.tokens,
            asked: false,
        }))
    }

    fn restore(&self, state: &ExecutionState) -> Result<Box<dyn Execution>, StepError> {
        Ok(Box::new(OnceRun {
            retry: self.retry,
            tokens: self.tokens,
            asked: state.decode()?,
        }))
    }
}

impl Execution for OnceRun {
    fn step(&mut self, window: &[Signal]) -> Result<Transition, StepError> {
        if !self.asked {
            self.asked = true;
            let mut reserve = Meters::new();
            if self.tokens > 0 {
                reserve.insert(Name::new("tokens").expect("valid"), self.tokens);
            }
            return Ok(Transition::Continue {
                consumed: 0,
                effects: vec![Effect::Dispatch {
                    request: Payload::encode(&"call")?,
                    reserve,
                    retry: self.retry,
                }],
            });
        }
        let settled = window
            .iter()
            .find_map(|signal| match &signal.body {
                SignalBody::Settled { settlement, .. } => Some(settlement.clone()),
                _ => None,
            })
            .ok_or_else(|| StepError::other("no settlement"))?;
        Ok(Transition::Complete {
            consumed: window.len(),
            output: Payload::encode(&settled)?,
        })
    }

    fn snapshot(&self) -> Result<ExecutionState, StepError> {
        ExecutionState::encode(&self.asked)
    }
}

fn program(retry: RetryPolicy, tokens: u64, dispatcher: &Flaky) -> Program<Value, Value> {
    let descriptor = Descriptor::new(
        "test.once",
        "One dispatch under a retry policy.",
        Schema::any(),
        Schema::any(),
    )
    .expect("valid");
    Program::new(ProgramConfig {
        definition: Arc::new(Once {
            descriptor,
            retry,
            tokens,
        }),
        dispatcher: Some(Arc::new(dispatcher.clone())),
        implementation: implementation_digest("retry", "1"),
        configuration: configuration_digest(&(retry, tokens)).expect("encodes"),
    })
}

fn rate_limited(after: Option<Duration>) -> Settlement {
    Settlement::failed_retryable(
        Failure::external("test.rate_limited", "slow down"),
        RetryHint::definite(after),
    )
}

fn timed_out() -> Settlement {
    Settlement::failed_retryable(
        Failure::external("test.timeout", "no answer in time"),
        RetryHint::uncertain(),
    )
}

fn answered() -> Settlement {
    Settlement::ok(Payload::encode(&"done").expect("encodes"))
}

fn policy() -> RetryPolicy {
    RetryPolicy::exponential(3, Duration::from_secs(1), Duration::from_secs(30))
}

struct Run {
    engine: Engine,
    store: MemoryStore,
    clock: ManualClock,
    tree: TreeId,
}

async fn start(program: &Program<Value, Value>, budget: Budget) -> Run {
    let store = MemoryStore::keeping_history();
    let clock = ManualClock::new(Timestamp(1_000_000));
    let engine = Engine::new(EngineConfig {
        programs: vec![program.erase()],
        clock: Arc::new(clock.clone()),
        ..EngineConfig::new(Arc::new(store.clone()))
    })
    .expect("the engine configuration is valid");
    let request = StartRequest {
        budget,
        ..StartRequest::new(StartId::new("acme", "retry").expect("valid"), json!(null))
    };
    let tree = engine.start(program, request).await.expect("starts").tree();
    Run {
        engine,
        store,
        clock,
        tree,
    }
}

fn kinds(store: &MemoryStore, tree: TreeId) -> Vec<RecordKind> {
    store.records(tree).iter().map(|r| r.kind).collect()
}

/// Waits (yielding) until the tree's log holds `count` records of `kind`.
async fn until_logged(store: &MemoryStore, tree: TreeId, kind: RecordKind, count: usize) {
    for _ in 0..100_000 {
        if kinds(store, tree).iter().filter(|k| **k == kind).count() >= count {
            return;
        }
        tokio::task::yield_now().await;
    }
    panic!(
        "{count} {kind} records never appeared: {:?}",
        kinds(store, tree)
    );
}

/// The times the log's retry records set for the next attempts.
fn backoffs(store: &MemoryStore, tree: TreeId) -> Vec<Timestamp> {
    store
        .records(tree)
        .iter()
        .filter_map(|record| match record.decode().expect("decodes") {
            RecordBody::EffectRetrying { at, .. } => Some(at),
            _ => None,
        })
        .collect()
}

async fn outcome(run: &Run) -> Termination {
    run.engine
        .process::<Payload>(&Scope::new("acme").expect("valid"), run.tree)
        .await
        .expect("attached")
        .await_result()
        .await
        .expect("terminates")
}

#[tokio::test]
async fn definite_failures_are_tried_again_after_their_backoff_and_the_third_attempt_completes() {
    let dispatcher = Flaky::new(
        ReplayPolicy::Never,
        vec![
            rate_limited(Some(Duration::from_secs(20))),
            rate_limited(None),
            answered(),
        ],
    );
    let program = program(policy(), 0, &dispatcher);
    let run = start(&program, Budget::unlimited()).await;
    until_logged(&run.store, run.tree, RecordKind::EffectRetrying, 1).await;
    assert_eq!(
        dispatcher.attempts(),
        vec![1],
        "nothing before the backoff ends"
    );
    // Retry-After asked for 20 s: the policy's 1 s backoff waits for it.
    assert_eq!(
        backoffs(&run.store, run.tree),
        vec![Timestamp(1_000_000 + 20_000)]
    );
    run.clock.advance(Duration::from_millis(19_999));
    tokio::task::yield_now().await;
    assert_eq!(dispatcher.attempts(), vec![1], "still backing off");
    run.clock.advance(Duration::from_millis(1));
    until_logged(&run.store, run.tree, RecordKind::EffectRetrying, 2).await;
    let second = backoffs(&run.store, run.tree)[1];
    // Twice the initial delay, less at most half of it (the jitter).
    let waited = second.0 - (1_000_000 + 20_000);
    assert!(
        (1_000..=2_000).contains(&waited),
        "second backoff {waited} ms"
    );
    run.clock.advance(Duration::from_millis(waited));
    let termination = outcome(&run).await;
    assert_eq!(termination.status(), Status::Completed);
    assert_eq!(dispatcher.attempts(), vec![1, 2, 3]);
    let log = kinds(&run.store, run.tree);
    assert_eq!(
        log.iter()
            .filter(|k| **k == RecordKind::EffectPending)
            .count(),
        3,
        "three attempts, each pending before its I/O: {log:?}"
    );
    let view = run
        .engine
        .verify(&Scope::new("acme").expect("valid"), run.tree)
        .await
        .expect("the log verifies");
    assert!(view.head_seq > 0);
}

#[tokio::test]
async fn a_crash_during_a_backoff_resumes_the_same_timer() {
    let dispatcher = Flaky::new(
        ReplayPolicy::Never,
        vec![rate_limited(Some(Duration::from_secs(10))), answered()],
    );
    let program = program(policy(), 0, &dispatcher);
    let clock = ManualClock::new(Timestamp(5_000));
    let faulty = FaultStore::new(Arc::new(MemoryStore::keeping_history()));
    // The commit right after the retry record is cut: the writer stops
    // mid-backoff, as a crash would.
    faulty.arm(RecordKind::EffectRetrying, Cut::After, 1);
    let config = |store: Arc<dyn baton_run::store::Store>| EngineConfig {
        programs: vec![program.erase()],
        clock: Arc::new(clock.clone()),
        ..EngineConfig::new(store)
    };
    let first = Engine::new(config(Arc::new(faulty.clone()))).expect("valid");
    let handle = first
        .start(
            &program,
            StartRequest::new(StartId::new("acme", "crash").expect("valid"), json!(null)),
        )
        .await
        .expect("starts");
    assert!(handle.await_result().await.is_err(), "the writer crashed");
    let tree = handle.tree();
    drop(handle);
    drop(first);
    assert_eq!(dispatcher.attempts(), vec![1]);

    let second = Engine::new(config(faulty.inner())).expect("valid");
    let report = second
        .recover(RecoverOptions::default())
        .await
        .expect("lists");
    assert!(
        report.iter().all(|(_, result)| result.is_ok()),
        "{report:?}"
    );
    clock.advance(Duration::from_millis(9_999));
    for _ in 0..100 {
        tokio::task::yield_now().await;
    }
    assert_eq!(
        dispatcher.attempts(),
        vec![1],
        "the recovered tree still waits for the same timer"
    );
    clock.advance(Duration::from_millis(1));
    let termination = second
        .process::<Payload>(&Scope::new("acme").expect("valid"), tree)
        .await
        .expect("attached")
        .await_result()
        .await
        .expect("terminates");
    assert_eq!(termination.status(), Status::Completed);
    assert_eq!(dispatcher.attempts(), vec![1, 2]);
}

#[tokio::test]
async fn an_uncertain_failure_of_a_never_dispatch_parks_instead_of_retrying() {
    let dispatcher = Flaky::new(ReplayPolicy::Never, vec![timed_out(), answered()]);
    let program = program(policy(), 0, &dispatcher);
    let run = start(&program, Budget::unlimited()).await;
    until_logged(&run.store, run.tree, RecordKind::EffectSettled, 1).await;
    let view = run
        .engine
        .inspect(
            &Scope::new("acme").expect("valid"),
            run.tree,
            baton_run::Visibility::Public,
        )
        .await
        .expect("inspects");
    assert_eq!(view.root().status, Status::Parked, "needs a person");
    assert_eq!(view.root().unknown_effects.len(), 1);
    assert_eq!(dispatcher.attempts(), vec![1], "never sent again");
}

#[tokio::test]
async fn an_uncertain_failure_of_a_same_identity_dispatch_is_tried_again() {
    let dispatcher = Flaky::new(ReplayPolicy::SameIdentity, vec![timed_out(), answered()]);
    let program = program(policy(), 0, &dispatcher);
    let run = start(&program, Budget::unlimited()).await;
    until_logged(&run.store, run.tree, RecordKind::EffectRetrying, 1).await;
    run.clock.advance(Duration::from_secs(1));
    assert_eq!(outcome(&run).await.status(), Status::Completed);
    assert_eq!(dispatcher.attempts(), vec![1, 2]);
}

#[tokio::test]
async fn the_last_attempt_s_failure_is_the_settlement() {
    let dispatcher = Flaky::new(ReplayPolicy::Never, vec![rate_limited(None)]);
    let program = program(
        RetryPolicy::exponential(2, Duration::from_millis(10), Duration::from_millis(10)),
        0,
        &dispatcher,
    );
    let run = start(&program, Budget::unlimited()).await;
    until_logged(&run.store, run.tree, RecordKind::EffectRetrying, 1).await;
    run.clock.advance(Duration::from_millis(10));
    let termination = outcome(&run).await;
    let settled: Settlement = termination
        .output()
        .expect("completed with the settlement")
        .decode()
        .expect("decodes");
    assert!(
        matches!(&settled, Settlement::Failed { failure, .. } if failure.code() == "test.rate_limited"),
        "{settled:?}"
    );
    assert_eq!(dispatcher.attempts(), vec![1, 2]);
}

#[tokio::test]
async fn every_attempt_is_charged_before_it_starts() {
    // Each failed attempt used its whole reservation; the budget holds two
    // attempts' worth, for a policy of three.
    let spent = Settlement::Failed {
        failure: Failure::external("test.rate_limited", "slow down"),
        usage: [(Name::new("tokens").expect("valid"), 100)]
            .into_iter()
            .collect(),
        retry: Some(RetryHint::definite(None)),
    };
    let dispatcher = Flaky::new(ReplayPolicy::Never, vec![spent]);
    let program = program(policy(), 100, &dispatcher);
    let budget = Budget {
        meters: [(Name::new("tokens").expect("valid"), Quota::Finite(200))]
            .into_iter()
            .collect(),
        ..Budget::unlimited()
    };
    let run = start(&program, budget).await;
    until_logged(&run.store, run.tree, RecordKind::EffectRetrying, 1).await;
    run.clock.advance(Duration::from_secs(1));
    until_logged(&run.store, run.tree, RecordKind::EffectRetrying, 2).await;
    run.clock.advance(Duration::from_secs(2));
    let termination = outcome(&run).await;
    let settled: Settlement = termination
        .output()
        .expect("completed with the settlement")
        .decode()
        .expect("decodes");
    assert!(
        matches!(&settled, Settlement::Failed { failure, .. } if failure.code() == "engine.limit.meter"),
        "the third attempt is refused before any I/O: {settled:?}"
    );
    assert_eq!(dispatcher.attempts(), vec![1, 2]);
}

#[tokio::test]
async fn a_retry_policy_that_cannot_be_followed_is_refused_when_declared() {
    let dispatcher = Flaky::new(ReplayPolicy::Never, vec![answered()]);
    let bad = RetryPolicy {
        attempts: 3,
        initial_delay_ms: 10_000,
        max_delay_ms: 10,
    };
    let program = program(bad, 0, &dispatcher);
    let run = start(&program, Budget::unlimited()).await;
    let termination = outcome(&run).await;
    assert_eq!(
        termination.failure().map(|f| f.code()),
        Some("execution.effect.invalid")
    );
    assert!(dispatcher.attempts().is_empty());
}
