//! "Input with timeout": a `FirstSuccess` race between an `InputGate` and a
//! `Deadline`. Whichever finishes first and is accepted wins; the loser is
//! canceled. A manual clock stands in for wall time so the example runs
//! instantly: the first race is answered, the second times out.
//!
//! Run with `cargo run -p baton-examples --example input_with_timeout`; it
//! prints `deploy-1 won by input` and `deploy-2 won by timeout`.

use std::error::Error;
use std::sync::Arc;
use std::time::Duration;

use baton::coordination::{
    Answer, Candidate, Deadline, FirstSuccess, FirstSuccessConfig, InputGate, Outcome,
};
use baton::run::{
    ChildKey, Condition, Engine, EngineConfig, ManualClock, MemoryStore, Payload, ProcessHandle,
    SignalId, SignalRequest, StartId, StartRequest, Timestamp, WaitId,
};

/// Waits until a child has an open wait and returns its id: the engine
/// reports when a wait opens anywhere in the tree (or when none can open
/// any more), so nothing polls.
async fn open_wait(handle: &ProcessHandle<Answer>) -> Result<WaitId, String> {
    let view = handle
        .until(Condition::WaitOpened)
        .await
        .map_err(|e| e.to_string())?;
    view.process(handle.id())
        .and_then(|process| process.open_waits.first())
        .map(|wait| wait.id)
        .ok_or_else(|| "the gate never opened its wait".into())
}

/// Runs both races and returns the line naming each winner.
pub async fn run() -> Result<Vec<String>, Box<dyn Error>> {
    let clock = ManualClock::new(Timestamp(1_000));
    let gate = InputGate::typed::<String, bool>("example.approval", "Asks to approve a deploy.")?
        .program::<String>();
    let deadline = Deadline::program();
    // Accept an approval answered `true`, or a deadline that was reached.
    let accept = Arc::new(|outcome: &Outcome| {
        let Some(output) = outcome.output() else {
            return Ok(false);
        };
        let output = output.to_value();
        Ok(output.is_number() || output["payload"] == true)
    });
    let race = FirstSuccess::new(FirstSuccessConfig {
        name: "example.approval_with_timeout".into(),
        description: "Waits for an approval for at most a minute.".into(),
        build: concat!("example ", env!("CARGO_PKG_VERSION")).into(),
        candidates: vec![gate.erase(), deadline.erase()],
        max_candidates: 2,
        accept,
    })?
    .program();
    let engine = Engine::new(EngineConfig {
        programs: vec![race.erase()],
        clock: Arc::new(clock.clone()),
        ..EngineConfig::new(Arc::new(MemoryStore::new()))
    })?;
    let candidates = |minute_from: u64| -> Result<Vec<Candidate>, Box<dyn Error>> {
        Ok(vec![
            Candidate::new("input", &gate, &"deploy v2?".to_owned())?,
            Candidate::new("timeout", &deadline, &Timestamp(minute_from + 60_000))?,
        ])
    };

    // Someone answers in time.
    let answered = engine
        .start(
            &race,
            StartRequest::new(StartId::new("acme", "deploy-1")?, candidates(1_000)?),
        )
        .await?;
    let input = answered.child::<Answer>(&ChildKey::new("input")?);
    let wait = open_wait(&input).await?;
    input
        .signal(SignalRequest {
            id: SignalId::new("alice-approves")?,
            wait: Some(wait),
            payload: Payload::encode(&true)?,
        })
        .await?;
    let result = answered.output().await?;
    let winner = result.winner.ok_or("the answered race has a winner")?;
    let mut lines = vec![format!("deploy-1 won by {}", winner.key)];

    // Nobody answers: the deadline wins once the clock passes it.
    let silent = engine
        .start(
            &race,
            StartRequest::new(StartId::new("acme", "deploy-2")?, candidates(1_000)?),
        )
        .await?;
    open_wait(&silent.child::<Answer>(&ChildKey::new("input")?)).await?;
    clock.advance(Duration::from_secs(60));
    let result = silent.output().await?;
    let winner = result.winner.ok_or("the silent race has a winner")?;
    lines.push(format!("deploy-2 won by {}", winner.key));
    Ok(lines)
}
