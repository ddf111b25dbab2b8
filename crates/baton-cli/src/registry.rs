//! The programs a command line runs: [`Registry`], built and validated once
//! by [`RegistryBuilder::build`], and the optional [`HostHooks`] a host
//! adds to recovery.

use std::fmt;
use std::sync::Arc;

use baton::run::{
    EffectId, IdError, Payload, ProcessView, Program, Scope, Settlement, TreeLimits, TreeView,
};

/// The scope a command line operates on when `--scope` is not given and the
/// registry names none.
pub const DEFAULT_SCOPE: &str = "default";

/// The programs a command line may start, drive and take up again, the
/// limits of the trees it starts, the scope it works in by default, and
/// the host's hooks.
///
/// A stored tree is resolved by the exact digest of its program, so a
/// registry must hold every version of a program that trees in the store
/// still run; `start` takes the version of a name registered last.
///
/// ```
/// use baton_cli::Registry;
/// # fn program() -> baton::run::Program { unimplemented!() }
/// # fn build() -> Result<Registry, baton_cli::RegistryError> {
/// let registry = Registry::builder()
///     .program(&program())
///     .default_scope("acme")
///     .build()?;
/// # Ok(registry) }
/// ```
#[derive(Clone)]
pub struct Registry {
    programs: Vec<Program>,
    limits: TreeLimits,
    scope: Scope,
    hooks: Option<Arc<dyn HostHooks>>,
}

impl fmt::Debug for Registry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<String> = self
            .programs
            .iter()
            .map(|program| program.reference().name.to_string())
            .collect();
        f.debug_struct("Registry")
            .field("programs", &names)
            .field("limits", &self.limits)
            .field("scope", &self.scope)
            .field("hooks", &self.hooks.is_some())
            .finish()
    }
}

impl Registry {
    /// An empty builder: default tree limits, scope [`DEFAULT_SCOPE`], no
    /// hooks. Add at least one program.
    pub fn builder() -> RegistryBuilder {
        RegistryBuilder {
            programs: Vec::new(),
            limits: TreeLimits::default(),
            scope: DEFAULT_SCOPE.to_owned(),
            hooks: None,
        }
    }

    /// The registered programs, in the order they were added (each name's
    /// newest version last).
    pub fn programs(&self) -> &[Program] {
        &self.programs
    }

    /// The limits every tree the command line starts gets (recorded with
    /// the tree, so a recovered tree keeps the limits it started with).
    pub fn limits(&self) -> &TreeLimits {
        &self.limits
    }

    /// The scope commands use when `--scope` is not given.
    pub fn default_scope(&self) -> &Scope {
        &self.scope
    }

    /// The host's hooks, if it gave any.
    pub fn hooks(&self) -> Option<&dyn HostHooks> {
        self.hooks.as_deref()
    }
}

/// Builds a [`Registry`]; [`RegistryBuilder::build`] validates it.
#[must_use = "a builder does nothing until `build` is called"]
pub struct RegistryBuilder {
    programs: Vec<Program>,
    limits: TreeLimits,
    scope: String,
    hooks: Option<Arc<dyn HostHooks>>,
}

impl RegistryBuilder {
    /// Adds a program (its bound children come with it). Adding the exact
    /// same program twice keeps one; a program with the name of an earlier
    /// one is its newer version.
    pub fn program<I, O>(mut self, program: &Program<I, O>) -> RegistryBuilder {
        let program = program.erase();
        let digest = program.reference().digest;
        if !self
            .programs
            .iter()
            .any(|known| known.reference().digest == digest)
        {
            self.programs.push(program);
        }
        self
    }

    /// Adds programs in order; see [`RegistryBuilder::program`].
    pub fn programs<'a>(self, programs: impl IntoIterator<Item = &'a Program>) -> RegistryBuilder {
        programs
            .into_iter()
            .fold(self, |builder, program| builder.program(program))
    }

    /// The limits of every tree the command line starts (default:
    /// [`TreeLimits::default`]).
    pub fn limits(mut self, limits: TreeLimits) -> RegistryBuilder {
        self.limits = limits;
        self
    }

    /// The scope commands use when `--scope` is not given (default:
    /// [`DEFAULT_SCOPE`]).
    pub fn default_scope(mut self, scope: impl Into<String>) -> RegistryBuilder {
        self.scope = scope.into();
        self
    }

    /// The host's hooks into recovery.
    pub fn hooks(mut self, hooks: impl HostHooks) -> RegistryBuilder {
        self.hooks = Some(Arc::new(hooks));
        self
    }

    /// Validates the registry: at least one program, a valid default scope,
    /// and tree limits an engine accepts.
    pub fn build(self) -> Result<Registry, RegistryError> {
        if self.programs.is_empty() {
            return Err(RegistryError::Empty);
        }
        let scope = Scope::new(&self.scope).map_err(|source| RegistryError::Scope {
            scope: self.scope.clone(),
            source,
        })?;
        for (field, value) in [
            ("max_processes", self.limits.max_processes),
            ("max_state_bytes", self.limits.max_state_bytes),
            ("max_history_bytes", self.limits.max_history_bytes),
            ("max_depth", u64::from(self.limits.max_depth)),
        ] {
            if value == 0 {
                return Err(RegistryError::Limit { field });
            }
        }
        Ok(Registry {
            programs: self.programs,
            limits: self.limits,
            scope,
            hooks: self.hooks,
        })
    }
}

/// Why a registry was refused.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RegistryError {
    /// No program was added.
    #[error(
        "cli.registry.empty: the registry holds no program; add one with `Registry::builder().program(&program)`"
    )]
    Empty,
    /// The default scope is not a valid scope.
    #[error("cli.registry.scope: invalid default scope {scope:?}: {source}")]
    Scope {
        /// The scope given.
        scope: String,
        /// Why it is invalid.
        source: IdError,
    },
    /// A tree limit that must be positive is zero.
    #[error("cli.registry.limits: the tree limit {field} must be greater than zero")]
    Limit {
        /// The field of [`TreeLimits`].
        field: &'static str,
    },
}

impl RegistryError {
    /// Stable code.
    pub fn code(&self) -> &'static str {
        match self {
            RegistryError::Empty => "cli.registry.empty",
            RegistryError::Scope { .. } => "cli.registry.scope",
            RegistryError::Limit { .. } => "cli.registry.limits",
        }
    }
}

/// What a host adds to the command line: decisions only it can make, such
/// as settling an effect a crash left unknown when the host can find out
/// what happened, and a line describing a tree it knows. Every method has a
/// default that does nothing.
pub trait HostHooks: Send + Sync + 'static {
    /// Asked by `recover` about each unknown effect of a tree it recovered:
    /// settle it (never as unknown) with what the host knows happened, or
    /// leave it (`None`) for the operator's `resolve`. Decide from the
    /// recorded request and the host's own records; this runs on the
    /// command's runtime, so keep it quick.
    fn resolve_lost(&self, lost: &LostEffect<'_>) -> Option<Resolution> {
        let _ = lost;
        None
    }

    /// A line `recover` prints under a tree it recovered (for example the
    /// result of a finished tree the host knows how to read).
    fn describe(&self, tree: &TreeView) -> Option<String> {
        let _ = tree;
        None
    }
}

/// An unknown effect `recover` found, as the host hooks see it.
#[derive(Clone, Copy, Debug)]
#[non_exhaustive]
pub struct LostEffect<'a> {
    /// The tree, with private payloads (requests) visible.
    pub tree: &'a TreeView,
    /// The process that declared the effect.
    pub process: &'a ProcessView,
    /// The effect.
    pub effect: EffectId,
    /// The request it was dispatched with, when the log holds it.
    pub request: Option<&'a Payload>,
}

/// How a host settles a lost effect.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Resolution {
    /// The effect's real outcome (succeeded or failed).
    pub settlement: Settlement,
    /// Why, printed under the tree (`resolved e_…, NOTE`).
    pub note: String,
}

#[cfg(test)]
mod tests {
    use baton::workflow::{Config, TransformError, Workflow, transform};

    use super::*;

    fn program(build: &str) -> Program<String, String> {
        Workflow::new(Config {
            name: "test.upper".into(),
            description: "Upper-case a text.".into(),
            build: build.into(),
            stages: vec![transform("upper", |text: String| {
                Ok::<_, TransformError>(text.to_uppercase())
            })],
        })
        .expect("a valid workflow")
        .program::<String, String>()
    }

    #[test]
    fn a_registry_needs_a_program_a_valid_scope_and_positive_limits() {
        let empty = Registry::builder().build().expect_err("no program");
        assert_eq!(empty.code(), "cli.registry.empty");
        let scope = Registry::builder()
            .program(&program("1"))
            .default_scope("Not A Scope")
            .build()
            .expect_err("a bad scope");
        assert_eq!(scope.code(), "cli.registry.scope");
        let limits = Registry::builder()
            .program(&program("1"))
            .limits(TreeLimits {
                max_processes: 0,
                ..TreeLimits::default()
            })
            .build()
            .expect_err("a zero limit");
        assert_eq!(limits.code(), "cli.registry.limits");
        assert!(limits.to_string().contains("max_processes"), "{limits}");
    }

    #[test]
    fn versions_are_kept_in_order_and_a_program_added_twice_once() {
        let (first, second) = (program("1"), program("2"));
        let registry = Registry::builder()
            .program(&first)
            .program(&second)
            .program(&first)
            .build()
            .expect("a valid registry");
        let digests: Vec<_> = registry
            .programs()
            .iter()
            .map(|program| program.reference().digest)
            .collect();
        assert_eq!(
            digests,
            [first.reference().digest, second.reference().digest]
        );
        assert_eq!(registry.default_scope().as_str(), DEFAULT_SCOPE);
        assert!(registry.hooks().is_none());
    }
}
