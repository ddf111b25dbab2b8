//! Usage by agent: what each process of a tree used (steps, effects,
//! signals and every meter, such as a model's `tokens_in`, `tokens_out`
//! and `cost_micros`), with its subtree's total, rolled up by program name,
//! from a tree's committed view.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::budget::Usage;
use crate::ids::{ChildKey, Name, ProcessId, TreeId};

use super::view::TreeView;

/// What a tree used, by process and by program ([`TreeView::usage`]).
/// `total` is exactly the sum of every process's own usage, and so of
/// every program's.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct UsageReport {
    /// The tree.
    pub tree: TreeId,
    /// Everything the tree's processes used.
    pub total: Usage,
    /// Each process, root first, in the view's order.
    pub processes: Vec<ProcessUsage>,
    /// By program name: how many processes ran it and what they used.
    pub programs: BTreeMap<Name, ProgramUsage>,
}

/// What one process used ([`UsageReport::processes`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct ProcessUsage {
    /// The process.
    pub process: ProcessId,
    /// Its path of child keys from the root (empty for the root).
    pub path: Vec<ChildKey>,
    /// Its program's name (a worker's or agent's name in a team).
    pub program: Name,
    /// What it used itself.
    pub own: Usage,
    /// What it and every process below it used.
    pub subtree: Usage,
}

/// What the processes of one program used ([`UsageReport::programs`]).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct ProgramUsage {
    /// How many processes ran the program.
    pub processes: u64,
    /// What they used, together.
    pub usage: Usage,
}

impl TreeView {
    /// Usage by agent: what each process used, itself and with its
    /// subtree, and the roll-up by program name.
    pub fn usage(&self) -> UsageReport {
        let index: BTreeMap<ProcessId, usize> = self
            .processes
            .iter()
            .enumerate()
            .map(|(at, view)| (view.id, at))
            .collect();
        let mut rows: Vec<ProcessUsage> = self
            .processes
            .iter()
            .map(|view| ProcessUsage {
                process: view.id,
                path: Vec::new(),
                program: view.program.clone(),
                own: view.usage.clone(),
                subtree: view.usage.clone(),
            })
            .collect();
        // The view lists processes by depth, so children come after their
        // parents: paths go down in order, subtree sums come up in reverse.
        for at in 0..self.processes.len() {
            let view = &self.processes[at];
            if let (Some(parent), Some(key)) = (view.parent, &view.key)
                && let Some(&up) = index.get(&parent)
            {
                let mut path = rows[up].path.clone();
                path.push(key.clone());
                rows[at].path = path;
            }
        }
        for at in (0..self.processes.len()).rev() {
            if let Some(&up) = self.processes[at]
                .parent
                .as_ref()
                .and_then(|p| index.get(p))
            {
                let below = rows[at].subtree.clone();
                rows[up].subtree.add(&below);
            }
        }
        let mut total = Usage::default();
        let mut programs: BTreeMap<Name, ProgramUsage> = BTreeMap::new();
        for row in &rows {
            total.add(&row.own);
            let program = programs.entry(row.program.clone()).or_default();
            program.processes += 1;
            program.usage.add(&row.own);
        }
        UsageReport {
            tree: self.tree,
            total,
            processes: rows,
            programs,
        }
    }
}
