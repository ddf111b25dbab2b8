//! `resume1000` (W5): roots park on an input gate, the engine closes, and a
//! fresh engine recovers and answers them all; on SQLite and PostgreSQL
//! that second phase runs in a process of its own (`--resume-phase2`), as a
//! restarted host would.

use std::path::Path;

use anyhow::{Context, Result, bail};
use baton::coordination::Answer;
use baton::run::{
    EffectId, Engine, Payload, Program, RecoverOptions, Scope, SignalId, SignalRequest, WaitId,
};

use super::SCOPE;
use super::gate::{gate_program, start_waiting};
use crate::floor::Floors;
use crate::measure::{Phase, Sample};
use crate::process::{WorkerReport, run_self, self_command};
use crate::store::{BenchStore, StoreKind, kind_of};

/// Where the second phase of `resume1000` runs on SQLite.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase2 {
    /// In a new process of this binary (`--resume-phase2`), as a restarted
    /// host would.
    Process,
    /// In this process, on a new handle of the file (for tests, whose
    /// binary is not the bench).
    #[cfg_attr(
        not(test),
        expect(dead_code, reason = "only the tests run the second phase in process")
    )]
    InProcess,
}

/// `resume1000` (W5): `trees` roots park on an input gate; the engine
/// closes; a fresh engine on the same store recovers and answers them all
/// (on SQLite, in the process `phase2` names). The figure is milliseconds
/// per tree of that second phase.
pub async fn resume_run(
    run: usize,
    kind: StoreKind,
    trees: usize,
    phase2: Phase2,
) -> Result<Sample> {
    let gate = gate_program()?;
    let store = BenchStore::fresh(kind)?;
    {
        let engine = Engine::new(store.config(gate.erase()))?;
        let mut handles = Vec::with_capacity(trees);
        let prefix = format!("resume-{run}");
        start_waiting(&store, &engine, &gate, &prefix, trees, &mut handles).await?;
        // A clean shutdown releases the leases of the trees it reaches, and
        // it reaches the hibernating ones through their handles; a tree
        // nobody holds would keep its lease until it expired.
        engine.close().await;
        drop(handles);
    }
    if store.memory().is_some() {
        // The same process and store, a fresh engine.
        let phase = Phase::on(&store).await?;
        return answer_all(&store, &gate, trees, phase).await;
    }
    let kind = store.kind;
    let place = store
        .close()
        .context("a durable bench store has a file or a database")?;
    let locator = place.locator();
    let sample = match phase2 {
        Phase2::InProcess => resume_phase2(kind, &locator, trees).await?,
        Phase2::Process => {
            let mut command = self_command()?;
            command
                .arg("--resume-phase2")
                .arg(&locator)
                .args(["--resume", &trees.to_string()]);
            let report = tokio::task::spawn_blocking(move || {
                run_self(command, "the second phase of resume1000")
            })
            .await??;
            let [sample] = report.samples[..] else {
                bail!("the second phase of resume1000 reported no single sample");
            };
            Sample {
                peak_rss_bytes: Some(report.peak_rss_bytes),
                ..sample
            }
        }
    };
    drop(place);
    Ok(sample)
}

/// The second phase of `resume1000` on the store at `locator` (a SQLite
/// file's path or PostgreSQL connection settings), timed from opening it.
async fn resume_phase2(kind: StoreKind, locator: &str, trees: usize) -> Result<Sample> {
    let gate = gate_program()?;
    // A new handle's counter starts at zero.
    let phase = Phase::begin(kind, 0);
    let store = BenchStore::open(locator)?;
    answer_all(&store, &gate, trees, phase).await
}

/// The hidden `--resume-phase2` process: runs the second phase and prints
/// its [`WorkerReport`].
pub async fn resume_phase2_main(locator: &Path, trees: usize) -> Result<()> {
    let locator = locator.display().to_string();
    let sample = resume_phase2(kind_of(&locator), &locator, trees).await?;
    WorkerReport::print(vec![sample], Floors::default())
}

/// A fresh engine on `store` recovers the `trees` parked gates and answers
/// every one concurrently, as many hosts would (the answers share the
/// store's group commits); the phase ends when every output has arrived.
async fn answer_all(
    store: &BenchStore,
    gate: &Program<u64, Answer>,
    trees: usize,
    phase: Phase,
) -> Result<Sample> {
    let engine = std::sync::Arc::new(Engine::new(store.config(gate.erase()))?);
    let report = engine.recover(RecoverOptions::default()).await?;
    if let Some((tree, Err(error))) = report.iter().find(|(_, result)| result.is_err()) {
        bail!("tree {tree} did not recover: {error}");
    }
    if report.len() != trees {
        bail!("recovered {} trees, expected {trees}", report.len());
    }
    let scope = Scope::new(SCOPE)?;
    let mut answering = tokio::task::JoinSet::new();
    for (tree, _) in report {
        // Each answer is a host's request of its own: the handle is opened
        // (a sleeping tree is loaded again) inside it, not one at a time.
        let (engine, scope) = (engine.clone(), scope.clone());
        // The gate's first step declares its wait as effect 0.
        let wait = WaitId::for_effect(EffectId::new(tree, 0, 0));
        answering.spawn(async move {
            let handle = engine.process::<Answer>(&scope, tree).await?;
            handle
                .signal(SignalRequest {
                    id: SignalId::new("answer")?,
                    wait: Some(wait),
                    payload: Payload::encode(&true)?,
                })
                .await?;
            let answer = handle.output().await?;
            anyhow::Ok(answer.wait == wait && answer.payload.decode::<bool>()?)
        });
    }
    while let Some(answered) = answering.join_next().await {
        if !answered?? {
            bail!("a resumed gate completed with another answer");
        }
    }
    let measured = phase.end(store).await?;
    // Every answering task has ended, so this is the engine's last holder.
    match std::sync::Arc::try_unwrap(engine) {
        Ok(engine) => engine.close().await,
        Err(_) => bail!("an answering task still holds the engine"),
    }
    Ok(Sample {
        total_seconds: Some(measured.seconds),
        ..measured.per(trees as u64, 1e3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workloads::check;

    #[tokio::test(flavor = "multi_thread")]
    async fn gate_roots_park_and_resume_on_both_stores() {
        for kind in StoreKind::ALL {
            let resume = resume_run(0, kind, 20, Phase2::InProcess).await.unwrap();
            check(&resume, kind, "resume");
            assert!(resume.total_seconds.is_some_and(|s| s > 0.0), "{resume:?}");
        }
    }
}
