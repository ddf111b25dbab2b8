//! The kernel's own workloads, on a program written against `baton::run`
//! directly: `step` (steps with no effects), `dispatch` (one echo dispatch
//! per step) and `children` (child lifecycles, ten at a time).

use std::sync::Arc;

use anyhow::{Context, Result, bail};
use baton::run::dispatch::{DispatchCall, Dispatcher, ReplayPolicy};
use baton::run::log::RecordKind;
use baton::run::program::{
    Boundary, Condition, Definition, Descriptor, Effect, Execution, ExecutionState, Grant,
    ProgramConfig, Schema, Signal, StepError, Transition, configuration_digest,
};
use baton::run::{
    BoxFuture, Budget, ChildKey, Digest, Engine, MemoryStore, Payload, Program, Settlement, Status,
    TreeId,
};
use serde::{Deserialize, Serialize};

use super::{Workload, implementation, request};
use crate::measure::{Phase, Sample};
use crate::store::{BenchStore, StoreKind};

/// Adopted steps among the stored records of `tree`.
fn adopted_steps(store: &MemoryStore, tree: TreeId) -> u64 {
    store
        .records(tree)
        .iter()
        .filter(|r| r.kind == RecordKind::StepAdopted)
        .count() as u64
}

/// `step`: a root that continues with no effects until its budget of
/// `steps` steps ends it (`engine.limit.steps`, the expected ending).
pub async fn step_run(run: usize, kind: StoreKind, steps: u64) -> Result<Sample> {
    let store = BenchStore::fresh(kind)?;
    let program = program(Workload::Step, None)?;
    let engine = Engine::new(store.config(program.erase()))?;
    let mut start = request(format!("step-{run}"), 0)?;
    start.budget = Budget::unlimited().with_steps(steps);

    let phase = Phase::on(&store).await?;
    let handle = engine.start(&program, start).await?;
    let termination = handle.await_result().await?;
    let measured = phase.end(&store).await?;

    let code = termination.failure().map(|f| f.code().to_owned());
    if termination.status() != Status::Failed || code.as_deref() != Some("engine.limit.steps") {
        bail!("the step root ended {termination}, not with engine.limit.steps");
    }
    // The SQLite store compacts the records its snapshots cover, so only
    // the memory store still holds every adopted step.
    if let Some(memory) = store.memory() {
        let adopted = adopted_steps(memory, handle.tree());
        if adopted != steps {
            bail!("the step root adopted {adopted} steps, not {steps}");
        }
    }
    engine.close().await;
    Ok(measured.per(steps, 1e6))
}

/// `dispatch`: a root that dispatches one effect per step to an echo
/// dispatcher, `dispatches` times, then completes.
pub async fn dispatch_run(run: usize, kind: StoreKind, dispatches: u64) -> Result<Sample> {
    counting_run(
        Workload::Dispatch,
        Some(Arc::new(Echo)),
        run,
        kind,
        dispatches,
    )
    .await
}

/// `children`: a root runs `children` child lifecycles, ten at a time.
pub async fn children_run(run: usize, kind: StoreKind, children: u64) -> Result<Sample> {
    counting_run(Workload::Children, None, run, kind, children).await
}

/// One root of the `dispatch` or `children` program, which counts to
/// `count` and completes with the count; the figure is µs per unit.
async fn counting_run(
    workload: Workload,
    dispatcher: Option<Arc<dyn Dispatcher>>,
    run: usize,
    kind: StoreKind,
    count: u64,
) -> Result<Sample> {
    let store = BenchStore::fresh(kind)?;
    let program = program(workload, dispatcher)?;
    let engine = Engine::new(store.config(program.erase()))?;
    let start = request(format!("{}-{run}", workload.name()), count)?;

    let phase = Phase::on(&store).await?;
    let handle = engine.start(&program, start).await?;
    let output = handle.output().await?;
    let measured = phase.end(&store).await?;

    if output != count {
        bail!(
            "the {} root completed with {output}, not {count}",
            workload.name()
        );
    }
    engine.close().await;
    Ok(measured.per(count, 1e6))
}

/// Everything a bench process remembers between steps.
#[derive(Debug, Serialize, Deserialize)]
struct State {
    /// Steps taken (`step`), dispatches declared (`dispatch`) or children
    /// started (`children`).
    count: u64,
    /// How many dispatches or children to run.
    limit: u64,
}

/// The behaviour of the `step`, `dispatch` and `children` programs;
/// `workload` picks the loop.
struct Bench {
    workload: Workload,
    descriptor: Descriptor,
    /// The declared child program (`children` only).
    child: Option<Program>,
}

struct Run {
    workload: Workload,
    child: Option<Digest>,
    state: State,
}

impl Definition for Bench {
    fn descriptor(&self) -> &Descriptor {
        &self.descriptor
    }

    fn start(&self, input: &Payload) -> Result<Box<dyn Execution>, StepError> {
        Ok(Box::new(Run {
            workload: self.workload,
            child: self.child.as_ref().map(|c| c.reference().digest),
            state: State {
                count: 0,
                limit: input.decode()?,
            },
        }))
    }

    fn restore(&self, state: &ExecutionState) -> Result<Box<dyn Execution>, StepError> {
        Ok(Box::new(Run {
            workload: self.workload,
            child: self.child.as_ref().map(|c| c.reference().digest),
            state: state.decode()?,
        }))
    }

    fn children(&self) -> Vec<Program> {
        self.child.iter().cloned().collect()
    }
}

impl Execution for Run {
    fn step(&mut self, window: &[Signal]) -> Result<Transition, StepError> {
        let state = &mut self.state;
        match self.workload {
            Workload::Step => {
                state.count += 1;
                Ok(Transition::Continue {
                    consumed: window.len(),
                    effects: Vec::new(),
                })
            }
            Workload::Dispatch if state.count < state.limit => {
                state.count += 1;
                Ok(Transition::Continue {
                    consumed: window.len(),
                    effects: vec![Effect::dispatch(Payload::encode(&state.count)?)],
                })
            }
            Workload::Dispatch => Ok(Transition::Complete {
                consumed: window.len(),
                output: Payload::encode(&state.count)?,
            }),
            Workload::Children if state.count < state.limit => {
                let child = self
                    .child
                    .context("no child program")
                    .map_err(StepError::other)?;
                let batch = (state.limit - state.count).min(10);
                let keys = (state.count..state.count + batch)
                    .map(|i| ChildKey::new(format!("c{i}")))
                    .collect::<Result<Vec<_>, _>>()?;
                let mut effects = keys
                    .iter()
                    .map(|key| {
                        Ok(Effect::StartChild {
                            key: key.clone(),
                            program: child,
                            input: Payload::encode(&key.as_str())?,
                            budget: Budget::unlimited(),
                            capabilities: Default::default(),
                            grant: Grant::Exact,
                        })
                    })
                    .collect::<Result<Vec<_>, StepError>>()?;
                effects.push(Effect::WaitChildren {
                    keys,
                    boundary: Boundary::Result,
                    condition: Condition::All,
                });
                state.count += batch;
                Ok(Transition::Continue {
                    consumed: window.len(),
                    effects,
                })
            }
            Workload::Children => Ok(Transition::Complete {
                consumed: window.len(),
                output: Payload::encode(&state.count)?,
            }),
            Workload::Idle
            | Workload::Team1000
            | Workload::Resume1000
            | Workload::Chain3
            | Workload::Fanout5
            | Workload::State1k
            | Workload::State30k
            | Workload::State250k => Err(StepError::other("this workload runs another program")),
        }
    }

    fn snapshot(&self) -> Result<ExecutionState, StepError> {
        ExecutionState::encode(&self.state)
    }
}

/// Binds the bench program of a workload.
fn program(
    workload: Workload,
    dispatcher: Option<Arc<dyn Dispatcher>>,
) -> Result<Program<u64, u64>> {
    let definition = Bench {
        workload,
        descriptor: Descriptor::new(
            &format!("bench.{}", workload.name()),
            "A benchmark workload of the Baton kernel.",
            Schema::of::<u64>(),
            Schema::of::<u64>(),
        )?,
        child: (workload == Workload::Children).then(echo_child),
    };
    Ok(Program::new(ProgramConfig {
        definition: Arc::new(definition),
        dispatcher,
        implementation: implementation(),
        configuration: configuration_digest(&workload)?,
    }))
}

/// A child that completes at once with its input.
struct EchoChild(Descriptor);

struct EchoRun(Payload);

impl Definition for EchoChild {
    fn descriptor(&self) -> &Descriptor {
        &self.0
    }

    fn start(&self, input: &Payload) -> Result<Box<dyn Execution>, StepError> {
        Ok(Box::new(EchoRun(input.clone())))
    }

    fn restore(&self, state: &ExecutionState) -> Result<Box<dyn Execution>, StepError> {
        Ok(Box::new(EchoRun(state.0.clone())))
    }
}

impl Execution for EchoRun {
    fn step(&mut self, window: &[Signal]) -> Result<Transition, StepError> {
        Ok(Transition::Complete {
            consumed: window.len(),
            output: self.0.clone(),
        })
    }

    fn snapshot(&self) -> Result<ExecutionState, StepError> {
        Ok(ExecutionState(self.0.clone()))
    }
}

fn echo_child() -> Program {
    let descriptor = Descriptor::new(
        "bench.echo",
        "Completes with its input.",
        Schema::any(),
        Schema::any(),
    )
    .expect("a static descriptor is valid");
    Program::new(ProgramConfig {
        definition: Arc::new(EchoChild(descriptor)),
        dispatcher: None,
        implementation: implementation(),
        configuration: configuration_digest(&()).expect("unit encodes"),
    })
}

/// Settles every dispatch at once with its own request.
struct Echo;

impl Dispatcher for Echo {
    fn replay_policy(&self, _request: &Payload) -> ReplayPolicy {
        ReplayPolicy::Never
    }

    fn dispatch(&self, call: DispatchCall) -> BoxFuture<'static, Settlement> {
        Box::pin(std::future::ready(Settlement::ok(call.request)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workloads::check;

    #[tokio::test(flavor = "multi_thread")]
    async fn kernel_workloads_run_small_on_both_stores() {
        for kind in StoreKind::ALL {
            check(&step_run(0, kind, 50).await.unwrap(), kind, "step");
            check(&dispatch_run(0, kind, 20).await.unwrap(), kind, "dispatch");
            check(&children_run(0, kind, 25).await.unwrap(), kind, "children");
        }
    }
}
