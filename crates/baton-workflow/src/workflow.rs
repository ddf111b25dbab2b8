//! The workflow definition: configuration, validation and program binding.

use std::collections::BTreeSet;
use std::sync::Arc;

use baton_run::program::{
    Definition, Descriptor, DescriptorError, Execution, ExecutionState, ProgramConfig, Schema,
    StepError, configuration_digest, implementation_digest,
};
use baton_run::{Budget, Capabilities, Digest, Payload, Program};
use serde::Serialize;

use crate::execution::{Run, State};
use crate::stage::{Body, Stage, StageKind};

/// Longest stage or case id, in bytes. Child keys are built as
/// `<stage>.<case>` or `<stage>.<index>` and must fit the kernel's 128 bytes.
pub const MAX_ID_LEN: usize = 63;

/// How to build a workflow. Validated once by [`Workflow::new`].
#[derive(Clone, Debug)]
pub struct Config {
    /// The workflow's descriptor name (lowercase dotted).
    pub name: String,
    /// What it does, for people.
    pub description: String,
    /// The identity of the code that built the stages' closures (for
    /// example `"my-app 1.4.2"` or a commit hash). Closures cannot be
    /// hashed, so the caller names their build; change it whenever a
    /// transform, selector, reducer or predicate changes behaviour.
    pub build: String,
    /// The stages, in order: the workflow's input is the first stage's
    /// input and its output the last stage's output.
    pub stages: Vec<Stage>,
}

/// Why a workflow could not be built. Nothing is bound.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The name or description is not a valid descriptor.
    #[error("invalid workflow descriptor: {0}")]
    Descriptor(#[from] DescriptorError),
    /// The build identity is empty.
    #[error("the build identity must not be empty")]
    Build,
    /// There are no stages.
    #[error("a workflow needs at least one stage")]
    NoStages,
    /// A stage id breaks the id rule.
    #[error(
        "invalid stage id {id:?}: expected a lowercase ASCII letter then a-z 0-9 _ -, at most {MAX_ID_LEN} bytes"
    )]
    StageId {
        /// The id.
        id: String,
    },
    /// Two stages share an id.
    #[error("stage id {id:?} is used twice")]
    DuplicateStage {
        /// The id.
        id: String,
    },
    /// A switch has no cases.
    #[error("switch {stage:?} has no cases")]
    NoCases {
        /// The stage.
        stage: String,
    },
    /// A case id breaks the id rule.
    #[error(
        "switch {stage:?}: invalid case id {case:?}: expected a lowercase ASCII letter then a-z 0-9 _ -, at most {MAX_ID_LEN} bytes"
    )]
    CaseId {
        /// The stage.
        stage: String,
        /// The case.
        case: String,
    },
    /// Two cases of a switch share an id.
    #[error("switch {stage:?}: case id {case:?} is used twice")]
    DuplicateCase {
        /// The stage.
        stage: String,
        /// The case.
        case: String,
    },
    /// A fork has no branches.
    #[error("fork {stage:?} has no branches")]
    NoBranches {
        /// The stage.
        stage: String,
    },
    /// A window size is zero.
    #[error("stage {stage:?}: the window size must be at least 1")]
    ZeroWindow {
        /// The stage.
        stage: String,
    },
    /// A fork's window is larger than its branch count.
    #[error("fork {stage:?}: window size {window_size} exceeds its {branches} branches")]
    WindowTooLarge {
        /// The stage.
        stage: String,
        /// The window size.
        window_size: u32,
        /// The branch count.
        branches: usize,
    },
    /// A map's `max_items` is zero.
    #[error("map {stage:?}: max_items must be at least 1")]
    ZeroMaxItems {
        /// The stage.
        stage: String,
    },
    /// A loop's `max_iterations` is zero.
    #[error("loop {stage:?}: max_iterations must be at least 1")]
    ZeroIterations {
        /// The stage.
        stage: String,
    },
    /// A child program's schema differs from the schema the stage's type
    /// parameters derive.
    #[error("stage {stage:?}: the {side} schema of child {child} differs from the stage's")]
    ChildSchema {
        /// The stage.
        stage: String,
        /// The child program's name.
        child: String,
        /// `input` or `output`.
        side: &'static str,
    },
    /// Adjacent stages do not fit: `from`'s output schema is not `to`'s input schema.
    #[error("the output schema of stage {from:?} does not match the input schema of stage {to:?}")]
    SchemaMismatch {
        /// The earlier stage.
        from: String,
        /// The later stage.
        to: String,
    },
    /// An activity's timeout is zero.
    #[error("activity {activity:?}: the timeout must be positive")]
    ZeroTimeout {
        /// The activity's name.
        activity: String,
    },
    /// The configuration could not be digested (a schema too large to encode).
    #[error("the configuration does not encode: {message}")]
    Encode {
        /// What the encoder reported.
        message: String,
    },
}

/// Whether `id` is a valid stage or case id.
pub(crate) fn valid_id(id: &str) -> bool {
    id.len() <= MAX_ID_LEN
        && id.bytes().next().is_some_and(|b| b.is_ascii_lowercase())
        && id
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-')
}

/// A validated workflow: a [`Definition`] whose processes run the stages
/// in order. Cheap to clone.
#[derive(Clone)]
pub struct Workflow {
    pub(crate) inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pub(crate) descriptor: Descriptor,
    pub(crate) stages: Vec<Stage>,
    children: Vec<Program>,
    implementation: Digest,
    configuration: Digest,
}

impl std::fmt::Debug for Workflow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Workflow")
            .field("name", self.inner.descriptor.name())
            .field("stages", &self.inner.stages)
            .finish_non_exhaustive()
    }
}

/// Every configuration field that shapes behaviour, for the configuration digest.
#[derive(Serialize)]
struct Digested<'a> {
    name: &'a str,
    description: &'a str,
    stages: Vec<DigestedStage<'a>>,
}

#[derive(Serialize)]
struct DigestedStage<'a> {
    id: &'a str,
    kind: StageKind,
    input: &'a Schema,
    output: &'a Schema,
    #[serde(skip_serializing_if = "Option::is_none")]
    window_size: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    max_items: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    max_iterations: Option<u32>,
    cases: Vec<&'a str>,
    children: Vec<DigestedChild<'a>>,
}

#[derive(Serialize)]
struct DigestedChild<'a> {
    program: Digest,
    budget: &'a Budget,
    capabilities: &'a Capabilities,
}

impl Workflow {
    /// Validates a configuration: a valid descriptor name and description,
    /// a non-empty build identity, at least one stage, unique valid stage
    /// ids, per-stage rules (cases, windows, limits, child schemas), and
    /// adjacent stages whose schemas match byte for byte.
    pub fn new(config: Config) -> Result<Workflow, ConfigError> {
        if config.build.trim().is_empty() {
            return Err(ConfigError::Build);
        }
        let (Some(first), Some(last)) = (config.stages.first(), config.stages.last()) else {
            return Err(ConfigError::NoStages);
        };
        let descriptor = Descriptor::new(
            &config.name,
            config.description.clone(),
            first.input_schema().clone(),
            last.output_schema().clone(),
        )?;
        let mut ids = BTreeSet::new();
        for stage in &config.stages {
            if !valid_id(&stage.id) {
                return Err(ConfigError::StageId {
                    id: stage.id.clone(),
                });
            }
            if !ids.insert(stage.id.as_str()) {
                return Err(ConfigError::DuplicateStage {
                    id: stage.id.clone(),
                });
            }
            check_stage(stage)?;
        }
        for pair in config.stages.windows(2) {
            if pair[0].output_schema() != pair[1].input_schema() {
                return Err(ConfigError::SchemaMismatch {
                    from: pair[0].id.clone(),
                    to: pair[1].id.clone(),
                });
            }
        }
        let mut children: Vec<Program> = Vec::new();
        for stage in &config.stages {
            for child in stage.children() {
                let digest = child.program.reference().digest;
                if children.iter().all(|p| p.reference().digest != digest) {
                    children.push(child.program.clone());
                }
            }
        }
        let digested = Digested {
            name: &config.name,
            description: &config.description,
            stages: config.stages.iter().map(digest_stage).collect(),
        };
        let configuration =
            configuration_digest(&digested).map_err(|error| ConfigError::Encode {
                message: error.to_string(),
            })?;
        let implementation = implementation_digest(
            env!("CARGO_PKG_NAME"),
            &format!("{}+{}", env!("CARGO_PKG_VERSION"), config.build),
        );
        Ok(Workflow {
            inner: Arc::new(Inner {
                descriptor,
                stages: config.stages,
                children,
                implementation,
                configuration,
            }),
        })
    }

    /// Binds the workflow as a program typed by its input and output. The
    /// descriptor's schemas stay authoritative (see [`Program::retype`]).
    pub fn program<I, O>(&self) -> Program<I, O> {
        Program::new(ProgramConfig {
            definition: Arc::new(self.clone()),
            dispatcher: None,
            implementation: self.inner.implementation,
            configuration: self.inner.configuration,
        })
    }

    /// The stages, in order.
    pub fn stages(&self) -> &[Stage] {
        &self.inner.stages
    }
}

fn check_stage(stage: &Stage) -> Result<(), ConfigError> {
    let name = || stage.id.clone();
    let child_schema =
        |child: &crate::stage::Child, input: &Schema, output: &Schema| -> Result<(), ConfigError> {
            let descriptor = child.program.descriptor();
            for (side, expected, actual) in [
                ("input", input, descriptor.input_schema()),
                ("output", output, descriptor.output_schema()),
            ] {
                if expected != actual {
                    return Err(ConfigError::ChildSchema {
                        stage: name(),
                        child: descriptor.name().to_string(),
                        side,
                    });
                }
            }
            Ok(())
        };
    match &stage.body {
        Body::Transform { .. } | Body::Call { .. } => Ok(()),
        Body::Switch { input, cases, .. } => {
            let Some((_, first)) = cases.first() else {
                return Err(ConfigError::NoCases { stage: name() });
            };
            let output = first.program.descriptor().output_schema();
            let mut seen = BTreeSet::new();
            for (case, child) in cases {
                if !valid_id(case) {
                    return Err(ConfigError::CaseId {
                        stage: name(),
                        case: case.clone(),
                    });
                }
                if !seen.insert(case.as_str()) {
                    return Err(ConfigError::DuplicateCase {
                        stage: name(),
                        case: case.clone(),
                    });
                }
                child_schema(child, input, output)?;
            }
            Ok(())
        }
        Body::Fork {
            input,
            branch_output,
            branches,
            window_size,
            ..
        } => {
            if branches.is_empty() {
                return Err(ConfigError::NoBranches { stage: name() });
            }
            if *window_size == 0 {
                return Err(ConfigError::ZeroWindow { stage: name() });
            }
            if *window_size as usize > branches.len() {
                return Err(ConfigError::WindowTooLarge {
                    stage: name(),
                    window_size: *window_size,
                    branches: branches.len(),
                });
            }
            branches
                .iter()
                .try_for_each(|child| child_schema(child, input, branch_output))
        }
        Body::Map {
            item_input,
            item_output,
            item,
            window_size,
            max_items,
            ..
        } => {
            if *window_size == 0 {
                return Err(ConfigError::ZeroWindow { stage: name() });
            }
            if *max_items == 0 {
                return Err(ConfigError::ZeroMaxItems { stage: name() });
            }
            child_schema(item, item_input, item_output)
        }
        Body::Loop {
            value,
            body,
            max_iterations,
            ..
        } => {
            if *max_iterations == 0 {
                return Err(ConfigError::ZeroIterations { stage: name() });
            }
            child_schema(body, value, value)
        }
    }
}

fn digest_stage(stage: &Stage) -> DigestedStage<'_> {
    let (window_size, max_items, max_iterations, cases) = match &stage.body {
        Body::Fork { window_size, .. } => (Some(*window_size), None, None, Vec::new()),
        Body::Map {
            window_size,
            max_items,
            ..
        } => (Some(*window_size), Some(*max_items), None, Vec::new()),
        Body::Loop { max_iterations, .. } => (None, None, Some(*max_iterations), Vec::new()),
        Body::Switch { cases, .. } => (
            None,
            None,
            None,
            cases.iter().map(|(case, _)| case.as_str()).collect(),
        ),
        Body::Transform { .. } | Body::Call { .. } => (None, None, None, Vec::new()),
    };
    DigestedStage {
        id: &stage.id,
        kind: stage.kind(),
        input: stage.input_schema(),
        output: stage.output_schema(),
        window_size,
        max_items,
        max_iterations,
        cases,
        children: stage
            .children()
            .into_iter()
            .map(|child| DigestedChild {
                program: child.program.reference().digest,
                budget: &child.budget,
                capabilities: &child.capabilities,
            })
            .collect(),
    }
}

impl Definition for Workflow {
    fn descriptor(&self) -> &Descriptor {
        &self.inner.descriptor
    }

    fn start(&self, input: &Payload) -> Result<Box<dyn Execution>, StepError> {
        Ok(Box::new(Run::new(self.inner.clone(), State::start(input))))
    }

    fn restore(&self, state: &ExecutionState) -> Result<Box<dyn Execution>, StepError> {
        let state = State::restore(state)?;
        state.check(&self.inner.stages)?;
        Ok(Box::new(Run::new(self.inner.clone(), state)))
    }

    fn children(&self) -> Vec<Program> {
        self.inner.children.clone()
    }
}
