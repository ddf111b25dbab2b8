//! Quotas, budgets, usage and capabilities.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::ids::Name;

/// A limit: unlimited, or a finite inclusive maximum where zero denies.
/// JSON: `null` is unlimited, a number is finite (so `0` and unlimited stay
/// distinct).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Quota {
    /// No limit.
    #[default]
    Unlimited,
    /// At most this many.
    Finite(u64),
}

impl Quota {
    /// Whether `used + more` stays within the quota (overflow never does).
    pub fn allows(self, used: u64, more: u64) -> bool {
        match self {
            Quota::Unlimited => true,
            Quota::Finite(max) => used.checked_add(more).is_some_and(|total| total <= max),
        }
    }

    /// What is left after `used`; `None` when unlimited.
    pub fn remaining(self, used: u64) -> Option<u64> {
        match self {
            Quota::Unlimited => None,
            Quota::Finite(max) => Some(max.saturating_sub(used)),
        }
    }

    /// Whether this quota is finite.
    pub fn is_finite(self) -> bool {
        matches!(self, Quota::Finite(_))
    }

    /// Whether this quota is unlimited (an absent budget field means so).
    pub fn is_unlimited(&self) -> bool {
        matches!(self, Quota::Unlimited)
    }
}

impl fmt::Display for Quota {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Quota::Unlimited => f.write_str("unlimited"),
            Quota::Finite(max) => write!(f, "{max}"),
        }
    }
}

impl Serialize for Quota {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            Quota::Unlimited => serializer.serialize_none(),
            Quota::Finite(max) => serializer.serialize_u64(*max),
        }
    }
}

impl<'de> Deserialize<'de> for Quota {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        Ok(match Option::<u64>::deserialize(deserializer)? {
            None => Quota::Unlimited,
            Some(max) => Quota::Finite(max),
        })
    }
}

impl schemars::JsonSchema for Quota {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Quota".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "description": "null is unlimited; a number is a finite inclusive maximum (0 denies)",
            "type": ["integer", "null"],
            "minimum": 0
        })
    }
}

/// The dimension of a budget or usage figure.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Dimension {
    /// Committed steps.
    Steps,
    /// Prepared effects (stable identities; replays are not counted).
    Effects,
    /// Mailbox entries, including engine-generated ones.
    Signals,
    /// A named meter such as `tokens` or `cost_micros`.
    Meter(Name),
}

impl fmt::Display for Dimension {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Dimension::Steps => f.write_str("steps"),
            Dimension::Effects => f.write_str("effects"),
            Dimension::Signals => f.write_str("signals"),
            Dimension::Meter(name) => write!(f, "meter {name}"),
        }
    }
}

/// What a process may consume over its whole life. All dimensions are
/// cumulative and monotone; everything is charged before the work starts.
/// A meter not listed is unlimited.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Budget {
    /// Committed steps.
    #[serde(default, skip_serializing_if = "Quota::is_unlimited")]
    pub steps: Quota,
    /// Prepared effects.
    #[serde(default, skip_serializing_if = "Quota::is_unlimited")]
    pub effects: Quota,
    /// Mailbox entries.
    #[serde(default, skip_serializing_if = "Quota::is_unlimited")]
    pub signals: Quota,
    /// Named meters (e.g. `tokens`, `cost_micros`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub meters: BTreeMap<Name, Quota>,
}

impl Budget {
    /// A budget with every dimension unlimited.
    pub fn unlimited() -> Budget {
        Budget::default()
    }

    /// Sets the step quota.
    pub fn with_steps(mut self, max: u64) -> Budget {
        self.steps = Quota::Finite(max);
        self
    }

    /// Sets the effect quota.
    pub fn with_effects(mut self, max: u64) -> Budget {
        self.effects = Quota::Finite(max);
        self
    }

    /// Sets the signal quota.
    pub fn with_signals(mut self, max: u64) -> Budget {
        self.signals = Quota::Finite(max);
        self
    }

    /// Sets a meter quota.
    pub fn with_meter(mut self, meter: Name, max: u64) -> Budget {
        self.meters.insert(meter, Quota::Finite(max));
        self
    }

    /// The quota of a meter (unlimited when not listed).
    pub fn meter(&self, meter: &Name) -> Quota {
        self.meters.get(meter).copied().unwrap_or(Quota::Unlimited)
    }

    /// The quota of one dimension.
    pub fn quota(&self, dimension: &Dimension) -> Quota {
        match dimension {
            Dimension::Steps => self.steps,
            Dimension::Effects => self.effects,
            Dimension::Signals => self.signals,
            Dimension::Meter(name) => self.meter(name),
        }
    }

    /// Whether `usage` is within this budget in every dimension.
    pub fn covers(&self, usage: &Usage) -> bool {
        self.steps.allows(usage.steps, 0)
            && self.effects.allows(usage.effects, 0)
            && self.signals.allows(usage.signals, 0)
            && usage
                .meters
                .iter()
                .all(|(name, used)| self.meter(name).allows(*used, 0))
    }
}

/// Bounds on one tree, fixed when the tree starts and recorded with it
/// (omitted from the record when they are the defaults).
/// Hitting one is a definite, classified failure, never a hang.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TreeLimits {
    /// Deepest child (the root is depth 0).
    pub max_depth: u32,
    /// Live children one parent may have at once.
    pub max_active_children: u32,
    /// Processes a tree may ever start, root included.
    pub max_processes: u64,
    /// Unconsumed signals one mailbox may hold.
    pub max_pending_signals: u64,
    /// Largest execution state, in bytes.
    pub max_state_bytes: u64,
    /// Total bytes of log records; past it the tree is closed.
    pub max_history_bytes: u64,
}

impl Default for TreeLimits {
    /// Depth 16, 64 active children per parent, 10 000 processes, 10 000
    /// pending signals, 1 MiB of state, 256 MiB of history.
    fn default() -> TreeLimits {
        TreeLimits {
            max_depth: 16,
            max_active_children: 64,
            max_processes: 10_000,
            max_pending_signals: 10_000,
            max_state_bytes: 1024 * 1024,
            max_history_bytes: 256 * 1024 * 1024,
        }
    }
}

/// Meter amounts, e.g. a dispatch's reservation or a settlement's actual use.
pub type Meters = BTreeMap<Name, u64>;

/// What a process has consumed so far.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Usage {
    /// Committed steps.
    pub steps: u64,
    /// Prepared effects.
    pub effects: u64,
    /// Mailbox entries.
    pub signals: u64,
    /// Charged meter amounts.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub meters: Meters,
}

impl Usage {
    /// The amount used in one dimension.
    pub fn used(&self, dimension: &Dimension) -> u64 {
        match dimension {
            Dimension::Steps => self.steps,
            Dimension::Effects => self.effects,
            Dimension::Signals => self.signals,
            Dimension::Meter(name) => self.meters.get(name).copied().unwrap_or(0),
        }
    }

    /// Adds `more` to this usage, dimension by dimension (saturating).
    pub fn add(&mut self, more: &Usage) {
        self.steps = self.steps.saturating_add(more.steps);
        self.effects = self.effects.saturating_add(more.effects);
        self.signals = self.signals.saturating_add(more.signals);
        for (meter, amount) in &more.meters {
            let sum = self.meters.entry(meter.clone()).or_insert(0);
            *sum = sum.saturating_add(*amount);
        }
    }
}

/// A sorted set of capability names; meaningless to the kernel except that
/// a child's set must be a subset of its parent's and effects may require
/// some.
#[derive(
    Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, schemars::JsonSchema,
)]
#[serde(transparent)]
pub struct Capabilities(BTreeSet<Name>);

impl Capabilities {
    /// The empty set.
    pub fn none() -> Capabilities {
        Capabilities::default()
    }

    /// Builds a set from names.
    pub fn of(names: impl IntoIterator<Item = Name>) -> Capabilities {
        Capabilities(names.into_iter().collect())
    }

    /// Whether every capability of `self` is in `other`.
    pub fn is_subset(&self, other: &Capabilities) -> bool {
        self.0.is_subset(&other.0)
    }

    /// Capabilities of `self` missing from `other`.
    pub fn missing_from(&self, other: &Capabilities) -> Vec<Name> {
        self.0.difference(&other.0).cloned().collect()
    }

    /// Iterates in sorted order.
    pub fn iter(&self) -> impl Iterator<Item = &Name> {
        self.0.iter()
    }

    /// Whether the set is empty.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn quota_json_keeps_zero_and_unlimited_apart() {
        assert_eq!(
            serde_json::to_string(&Quota::Unlimited).expect("ok"),
            "null"
        );
        assert_eq!(serde_json::to_string(&Quota::Finite(0)).expect("ok"), "0");
        assert_eq!(
            serde_json::from_str::<Quota>("0").expect("ok"),
            Quota::Finite(0)
        );
        assert_eq!(
            serde_json::from_str::<Quota>("null").expect("ok"),
            Quota::Unlimited
        );
        assert!(serde_json::from_str::<Quota>("-1").is_err());
    }

    #[test]
    fn zero_denies() {
        assert!(!Quota::Finite(0).allows(0, 1));
        assert!(Quota::Finite(0).allows(0, 0));
    }

    proptest! {
        #[test]
        fn allows_matches_arithmetic(max in any::<u64>(), used in any::<u64>(), more in any::<u64>()) {
            let expected = (used as u128 + more as u128) <= max as u128;
            prop_assert_eq!(Quota::Finite(max).allows(used, more), expected);
            prop_assert!(Quota::Unlimited.allows(used, more));
        }

        #[test]
        fn remaining_never_exceeds_max(max in any::<u64>(), used in any::<u64>()) {
            let left = Quota::Finite(max).remaining(used).expect("finite");
            prop_assert!(left <= max);
            prop_assert_eq!(Quota::Finite(max).allows(used, left), used <= max);
        }
    }
}
