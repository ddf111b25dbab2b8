//! A scripted dispatcher that counts dispatches per effect id.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use baton_run::dispatch::{DispatchCall, Dispatcher, ReplayPolicy};
use baton_run::{BoxFuture, Capabilities, EffectId, Payload, Settlement};

type Respond = dyn Fn(&DispatchCall) -> Settlement + Send + Sync;

/// A dispatcher whose settlements come from a closure, recording how many
/// times each `EffectId` was dispatched. Clones share the counts.
#[derive(Clone)]
pub struct ScriptedDispatcher {
    policy: ReplayPolicy,
    respond: Arc<Respond>,
    counts: Arc<Mutex<BTreeMap<EffectId, u32>>>,
    order: Arc<Mutex<Vec<EffectId>>>,
    required: Capabilities,
}

impl std::fmt::Debug for ScriptedDispatcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ScriptedDispatcher")
            .field("policy", &self.policy)
            .finish_non_exhaustive()
    }
}

impl ScriptedDispatcher {
    /// Settles each call with `respond`.
    pub fn new(
        policy: ReplayPolicy,
        respond: impl Fn(&DispatchCall) -> Settlement + Send + Sync + 'static,
    ) -> ScriptedDispatcher {
        ScriptedDispatcher {
            policy,
            respond: Arc::new(respond),
            counts: Arc::default(),
            order: Arc::default(),
            required: Capabilities::none(),
        }
    }

    /// Succeeds with the request itself as the output.
    pub fn echo(policy: ReplayPolicy) -> ScriptedDispatcher {
        ScriptedDispatcher::new(policy, |call| Settlement::ok(call.request.clone()))
    }

    /// Requires these capabilities for every request.
    pub fn requiring(mut self, capabilities: Capabilities) -> ScriptedDispatcher {
        self.required = capabilities;
        self
    }

    /// How many times `effect` was dispatched.
    pub fn count(&self, effect: EffectId) -> u32 {
        self.counts
            .lock()
            .map(|c| c.get(&effect).copied().unwrap_or(0))
            .unwrap_or(0)
    }

    /// Dispatch counts per effect id.
    pub fn counts(&self) -> BTreeMap<EffectId, u32> {
        self.counts.lock().map(|c| c.clone()).unwrap_or_default()
    }

    /// Every dispatch in the order it happened.
    pub fn order(&self) -> Vec<EffectId> {
        self.order.lock().map(|o| o.clone()).unwrap_or_default()
    }

    /// Total dispatches.
    pub fn total(&self) -> u32 {
        self.counts().values().sum()
    }
}

impl Dispatcher for ScriptedDispatcher {
    fn replay_policy(&self, _request: &Payload) -> ReplayPolicy {
        self.policy
    }

    fn required_capabilities(&self, _request: &Payload) -> Capabilities {
        self.required.clone()
    }

    fn dispatch(&self, call: DispatchCall) -> BoxFuture<'static, Settlement> {
        if let Ok(mut counts) = self.counts.lock() {
            *counts.entry(call.effect).or_insert(0) += 1;
        }
        if let Ok(mut order) = self.order.lock() {
            order.push(call.effect);
        }
        let settlement = (self.respond)(&call);
        Box::pin(std::future::ready(settlement))
    }
}
