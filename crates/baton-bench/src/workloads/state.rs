//! `state-1k`, `state-30k` and `state-250k` (W4): a kernel program that
//! takes one step per stage carrying a large random state, and the
//! marginal bytes of one more stage, from a longer chain on a fresh store.

use std::fmt::Write as _;
use std::sync::Arc;

use anyhow::Result;
use baton::run::program::{
    Definition, Descriptor, Execution, ExecutionState, ProgramConfig, Signal, StepError,
    Transition, configuration_digest,
};
use baton::run::{Payload, Program};
use serde::{Deserialize, Serialize};

use super::{implementation, per_root};
use crate::measure::{Measured, Sample};
use crate::store::{BenchStore, StoreKind};

/// Stages of the measured `state-*` chains.
pub const STATE_STAGES: u64 = 10;

/// Stages of the longer `state-*` chain that `marginal_bytes` compares with.
const MARGINAL_STAGES: u64 = 20;

/// Roots per `state-*` run.
pub const STATE_ROOTS: u64 = 5;

/// The state carried by the `state-*` chains.
#[derive(Clone, Debug, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Carried {
    /// Seeded random bytes, hex encoded (incompressible as bytes).
    blob: String,
    /// The small field each stage changes.
    pub stage: u64,
}

/// The input of run `run` of a `state-*` workload carrying `size` bytes:
/// seeded random hex and stage 0.
pub fn carried_state(size: usize, run: usize) -> Carried {
    Carried {
        blob: random_hex(size, 0x5eed + run as u64),
        stage: 0,
    }
}

/// Deterministic pseudo-random hex of `len` characters (xorshift64*).
fn random_hex(len: usize, seed: u64) -> String {
    let mut state = seed.max(1);
    let mut out = String::with_capacity(len + 16);
    while out.len() < len {
        state ^= state >> 12;
        state ^= state << 25;
        state ^= state >> 27;
        let _ = write!(out, "{:016x}", state.wrapping_mul(0x2545_f491_4f6c_dd1d));
    }
    out.truncate(len);
    out
}

/// The `state-*` program: one step per stage, each incrementing `stage`;
/// `Continue` with no effects until the last stage, which completes with
/// the stage count.
struct StateChain {
    descriptor: Descriptor,
    stages: u64,
}

struct StateRun {
    stages: u64,
    state: Carried,
}

impl Definition for StateChain {
    fn descriptor(&self) -> &Descriptor {
        &self.descriptor
    }

    fn start(&self, input: &Payload) -> Result<Box<dyn Execution>, StepError> {
        Ok(Box::new(StateRun {
            stages: self.stages,
            state: input.decode()?,
        }))
    }

    fn restore(&self, state: &ExecutionState) -> Result<Box<dyn Execution>, StepError> {
        Ok(Box::new(StateRun {
            stages: self.stages,
            state: state.decode()?,
        }))
    }
}

impl Execution for StateRun {
    fn step(&mut self, window: &[Signal]) -> Result<Transition, StepError> {
        self.state.stage += 1;
        if self.state.stage < self.stages {
            Ok(Transition::Continue {
                consumed: window.len(),
                effects: Vec::new(),
            })
        } else {
            Ok(Transition::Complete {
                consumed: window.len(),
                output: Payload::encode(&self.state.stage)?,
            })
        }
    }

    fn snapshot(&self) -> Result<ExecutionState, StepError> {
        ExecutionState::encode(&self.state)
    }
}

/// Binds the `state-*` program with `stages` stages.
fn state_program(stages: u64) -> Result<Program<Carried, u64>> {
    let definition = StateChain {
        descriptor: Descriptor::typed::<Carried, u64>(
            "bench.state",
            "One step per stage, carrying a large state.",
        )?,
        stages,
    };
    Ok(Program::new(ProgramConfig {
        definition: Arc::new(definition),
        dispatcher: None,
        implementation: implementation(),
        configuration: configuration_digest(&("bench.state", stages))?,
    }))
}

/// `state-*` (W4): `roots` roots each run a ten-stage chain (one kernel step
/// per stage) whose state carries `size` bytes of random hex and changes
/// one small field per stage. The figure is ms per stage; bytes are per
/// stage; `marginal_bytes` compares with a 20-stage chain on a fresh store.
pub async fn state_run(run: usize, kind: StoreKind, size: usize, roots: u64) -> Result<Sample> {
    let input = carried_state(size, run);
    let prefix = format!("state-{size}-{run}");
    let ten = {
        let store = BenchStore::fresh(kind)?;
        let program = state_program(STATE_STAGES)?;
        let expected = Payload::encode(&STATE_STAGES)?;
        per_root(&program, &store, &prefix, input.clone(), roots, &expected).await?
    };
    let twenty = {
        let store = BenchStore::fresh(kind)?;
        let program = state_program(MARGINAL_STAGES)?;
        let expected = Payload::encode(&MARGINAL_STAGES)?;
        per_root(&program, &store, &prefix, input, roots, &expected).await?
    };
    let per_root_bytes = |m: &Measured| m.bytes as f64 / roots as f64;
    let marginal =
        (per_root_bytes(&twenty) - per_root_bytes(&ten)) / (MARGINAL_STAGES - STATE_STAGES) as f64;
    Ok(Sample {
        marginal_bytes: Some(marginal),
        ..ten.per(roots * STATE_STAGES, 1e3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workloads::check;

    #[tokio::test(flavor = "multi_thread")]
    async fn state_chains_run_small_and_each_step_writes_its_change_not_the_state() {
        let size = 250_000;
        for kind in StoreKind::ALL {
            let state = state_run(0, kind, size, 1).await.unwrap();
            check(&state, kind, "state");
            assert!(
                state.bytes_written * STATE_STAGES as f64 > size as f64,
                "the run records its input at least once: {state:?}"
            );
            let marginal = state
                .marginal_bytes
                .expect("a state run measures marginal bytes");
            // Every step record carries the state's change (a counter), not
            // the state, on every store.
            assert!(marginal > 0.0 && marginal < 1_000.0, "{kind:?}: {state:?}");
        }
    }
}
