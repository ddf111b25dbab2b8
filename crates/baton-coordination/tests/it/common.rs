//! Helpers shared by the coordination tests.

use std::sync::Arc;

use baton_coordination::{
    Accept, Answer, Deadline, FirstSuccess, FirstSuccessConfig, InputGate, Outcome,
};
use baton_run::store::Store;
use baton_run::{
    ChildKey, Engine, EngineConfig, ManualClock, Payload, ProcessHandle, Program, SignalId,
    SignalRequest, StartId, StartRequest, Status, Timestamp, WaitId,
};

pub fn key(text: &str) -> ChildKey {
    ChildKey::new(text).expect("valid key")
}

pub fn request<I>(key: &str, input: I) -> StartRequest<I> {
    StartRequest::new(StartId::new("acme", key).expect("valid"), input)
}

/// A gate asking a question (a string) for a string answer.
pub fn gate() -> Program<String, Answer> {
    InputGate::typed::<String, String>("test.question", "Asks a question.")
        .expect("valid gate")
        .program()
}

pub fn engine_on(store: Arc<dyn Store>, clock: &ManualClock, programs: &[Program]) -> Engine {
    let mut config = EngineConfig {
        clock: Arc::new(clock.clone()),
        ..EngineConfig::new(store)
    };
    for program in programs {
        config.programs.push(program.erase());
    }
    Engine::new(config).expect("the engine configuration is valid")
}

pub fn clock(at: u64) -> ManualClock {
    ManualClock::new(Timestamp(at))
}

/// A race over gates and deadlines that accepts completed outcomes passing `accept`.
pub fn race(max_candidates: u32, accept: Accept) -> FirstSuccess {
    FirstSuccess::new(FirstSuccessConfig {
        name: "test.race".into(),
        description: "Races candidates.".into(),
        build: "coordination-tests 1".into(),
        candidates: vec![gate().erase(), Deadline::program().erase()],
        max_candidates,
        accept,
    })
    .expect("valid race")
}

/// Accepts completed gates answered "yes" and reached deadlines.
pub fn yes_or_timeout() -> Accept {
    Arc::new(|outcome: &Outcome| {
        if !outcome.completed() {
            return Ok(false);
        }
        let output = outcome.output().expect("completed").to_value();
        Ok(output.is_number() || output["payload"] == "yes")
    })
}

/// Polls until the process has an open wait and is waiting on it.
pub async fn open_wait<O>(handle: &ProcessHandle<O>) -> WaitId {
    for _ in 0..10_000 {
        let view = handle.inspect().await.expect("inspects");
        if let Some(process) = view.process(handle.id())
            && let Some(wait) = process.open_waits.first()
            && process.status == Status::Waiting
        {
            return wait.id;
        }
        tokio::task::yield_now().await;
    }
    panic!("no wait opened");
}

/// Polls until the process has a pending dispatch.
pub async fn armed<O>(handle: &ProcessHandle<O>) {
    for _ in 0..10_000 {
        let view = handle.inspect().await.expect("inspects");
        if let Some(process) = view.process(handle.id())
            && process.effects.iter().any(|e| e.phase == "pending")
        {
            return;
        }
        tokio::task::yield_now().await;
    }
    panic!("the timer never became pending");
}

pub fn answer_to(id: &str, wait: WaitId, text: &str) -> SignalRequest {
    SignalRequest {
        id: SignalId::new(id).expect("valid"),
        wait: Some(wait),
        payload: Payload::encode(&text).expect("encodes"),
    }
}

/// Answers a child gate of `root`.
pub async fn answer_child<O>(root: &ProcessHandle<O>, child: &str, text: &str) {
    let child = root.child::<Answer>(&key(child));
    let wait = open_wait(&child).await;
    child
        .signal(answer_to(&format!("answer-{}", child.id()), wait, text))
        .await
        .expect("admitted");
}
