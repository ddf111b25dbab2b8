//! `Pure`: a deterministic function a strategy calls inside its
//! coordinator's step, with the build identity that stands for its code.

use std::sync::Arc;

use baton_run::Failure;

use crate::ConfigError;

type Function<A, B> = dyn Fn(&A) -> Result<B, Failure> + Send + Sync;

/// A pure, deterministic function (an input mapping, a merge, a route, a
/// delegation) and the identity of its code.
///
/// Closures cannot be hashed, so `build` stands for the code in the
/// strategy's identity: change it whenever the function changes behaviour,
/// and put any configuration the function reads into the strategy's own
/// settings or into the code `build` names. A returned failure fails the
/// strategy with that failure's kind, code and message.
pub struct Pure<A, B> {
    build: String,
    function: Arc<Function<A, B>>,
}

impl<A, B> Pure<A, B> {
    /// A function with the identity `build` (non-empty, checked when the
    /// strategy is built).
    pub fn new(
        build: impl Into<String>,
        function: impl Fn(&A) -> Result<B, Failure> + Send + Sync + 'static,
    ) -> Pure<A, B> {
        Pure {
            build: build.into(),
            function: Arc::new(function),
        }
    }

    /// The identity of its code.
    pub fn build(&self) -> &str {
        &self.build
    }

    pub(crate) fn call(&self, input: &A) -> Result<B, Failure> {
        (self.function)(input)
    }

    pub(crate) fn checked(&self, what: &'static str) -> Result<&str, ConfigError> {
        if self.build.trim().is_empty() {
            return Err(ConfigError::Build { what });
        }
        Ok(&self.build)
    }
}

impl<A, B> Clone for Pure<A, B> {
    fn clone(&self) -> Self {
        Pure {
            build: self.build.clone(),
            function: self.function.clone(),
        }
    }
}

impl<A, B> std::fmt::Debug for Pure<A, B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pure")
            .field("build", &self.build)
            .finish_non_exhaustive()
    }
}
