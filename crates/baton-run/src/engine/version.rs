//! Why a stored tree's program is not registered: which part of its
//! identity differs from the versions of its name an engine knows, and
//! what to register to take the tree up.
//!
//! A program's identity ([`ProgramRef`]) is its name, its contract (the
//! descriptor's schemas), its build (the implementation digest), its
//! configuration and its bound children; a tree runs the exact version it
//! started with, resolved by the digest over all of them.

use std::fmt;

use crate::digest::Digest;
use crate::ids::{Name, ProcessId};
use crate::log::RecordBody;
use crate::protocol::{Program, ProgramRef};
use crate::storage::TreeLoad;

use super::config::Registry;
use super::error::TreeError;
use super::state::TreeState;

/// A part of a program's identity.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum IdentityPart {
    /// The built code ([`ProgramRef::implementation`]).
    Build,
    /// The configuration ([`ProgramRef::configuration`]).
    Configuration,
    /// The contract: the descriptor and its schemas ([`ProgramRef::contract`]).
    Contract,
    /// The bound child programs ([`ProgramRef::children`]).
    Children,
}

impl IdentityPart {
    /// The snake_case name.
    pub fn as_str(self) -> &'static str {
        match self {
            IdentityPart::Build => "build",
            IdentityPart::Configuration => "configuration",
            IdentityPart::Contract => "contract",
            IdentityPart::Children => "children",
        }
    }
}

impl fmt::Display for IdentityPart {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How a stored tree's program differs from the registered versions of its
/// name, with what to register (see [`TreeError::ProgramUnavailable`]).
///
/// [`TreeError::ProgramUnavailable`]: super::TreeError::ProgramUnavailable
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum VersionMismatch {
    /// No version of the program's name is registered.
    Name,
    /// Versions of the name are registered; the closest one differs from
    /// the tree's program in these parts.
    Parts {
        /// The closest registered version (the newest among equally close).
        registered: Digest,
        /// The parts that differ, in [`IdentityPart`] order.
        parts: Vec<IdentityPart>,
        /// The build the tree needs.
        build: Digest,
        /// The configuration the tree needs.
        configuration: Digest,
    },
    /// Versions of the name are registered, but the tree keeps only this
    /// program's digest (a child's, or a root whose start record the store
    /// no longer keeps), so which part differs is not known.
    Unknown {
        /// The registered versions of the name, oldest first.
        registered: Vec<Digest>,
    },
}

impl fmt::Display for VersionMismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            VersionMismatch::Name => write!(
                f,
                "no version of that name is registered; register the program the tree was started with in EngineConfig::programs"
            ),
            VersionMismatch::Parts {
                registered,
                parts,
                build,
                configuration,
            } => {
                let parts: Vec<&str> = parts.iter().map(|part| part.as_str()).collect();
                write!(
                    f,
                    "the registered version {registered} differs in its {}; register the version built as {build} with configuration {configuration} beside it in EngineConfig::programs (an engine keeps several versions of a name; new starts take the newest)",
                    parts.join(" and ")
                )
            }
            VersionMismatch::Unknown { registered } => {
                let registered: Vec<String> = registered.iter().map(Digest::to_string).collect();
                write!(
                    f,
                    "other versions of that name are registered ({}); register the exact build and configuration the tree was started with beside them in EngineConfig::programs",
                    registered.join(", ")
                )
            }
        }
    }
}

/// The parts in which two identities differ, in [`IdentityPart`] order.
fn differing(stored: &ProgramRef, registered: &ProgramRef) -> Vec<IdentityPart> {
    let mut parts = Vec::new();
    if stored.implementation != registered.implementation {
        parts.push(IdentityPart::Build);
    }
    if stored.configuration != registered.configuration {
        parts.push(IdentityPart::Configuration);
    }
    if stored.contract != registered.contract {
        parts.push(IdentityPart::Contract);
    }
    if stored.children != registered.children {
        parts.push(IdentityPart::Children);
    }
    parts
}

/// Explains why the program `name` of a stored tree is not registered,
/// given the registered versions of that name (oldest first) and, when
/// known, the tree's full reference of it.
pub(super) fn explain(versions: &[Program], stored: Option<&ProgramRef>) -> VersionMismatch {
    if versions.is_empty() {
        return VersionMismatch::Name;
    }
    let Some(stored) = stored else {
        return VersionMismatch::Unknown {
            registered: versions.iter().map(|p| p.reference().digest).collect(),
        };
    };
    // The closest version: fewest differing parts, the newest among ties.
    let closest = versions
        .iter()
        .rev()
        .map(|program| (differing(stored, program.reference()), program))
        .min_by_key(|(parts, _)| parts.len());
    match closest {
        Some((parts, program)) => VersionMismatch::Parts {
            registered: program.reference().digest,
            parts,
            build: stored.implementation,
            configuration: stored.configuration,
        },
        None => VersionMismatch::Name,
    }
}

/// The full reference of the root's program, from the tree's start record
/// when the load holds it.
pub(super) fn root_reference(load: &TreeLoad) -> Option<ProgramRef> {
    let first = load.records.first().filter(|record| record.seq == 1)?;
    match first.decode() {
        Ok(RecordBody::TreeStarted { program, .. }) => Some(*program),
        _ => None,
    }
}

/// The first live process of `state` whose program is not registered, with
/// its name and digest.
pub(super) fn first_unavailable(
    state: &TreeState,
    registered: impl Fn(&Digest) -> bool,
) -> Option<(ProcessId, Name, Digest)> {
    // The root first: its full identity is known, and when it is missing
    // so are the children it declares.
    let root = state.processes.get(&state.root);
    root.into_iter()
        .map(|process| (state.root, process))
        .chain(state.processes.iter().map(|(id, process)| (*id, process)))
        .filter(|(_, process)| process.termination.is_none())
        .find(|(_, process)| !registered(&process.program.digest))
        .map(|(id, process)| (id, process.program.name.clone(), process.program.digest))
}

/// The error for a tree whose program `name` (`digest`) is not registered.
pub(super) fn unavailable(
    registry: &Registry,
    tree: crate::ids::TreeId,
    name: &Name,
    digest: Digest,
    stored: Option<&ProgramRef>,
) -> TreeError {
    let stored = stored.filter(|reference| reference.digest == digest);
    TreeError::ProgramUnavailable {
        tree,
        name: name.to_string(),
        digest,
        mismatch: Box::new(explain(&registry.versions(name), stored)),
    }
}
