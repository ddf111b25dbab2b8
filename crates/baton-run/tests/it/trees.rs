//! Random process trees on the memory store keep their budget and drain
//! invariants. The tree scenarios themselves run in the engine conformance
//! kit (`engine.rs`), on the kit's parent program.

use std::sync::Arc;

use baton_run::log::RecordKind;
use baton_run::program::{Boundary, Condition};
use baton_run::{
    Budget, Capabilities, Dimension, Engine, EngineConfig, MemoryStore, Program, Scope,
    StartRequest, TreeView, Visibility,
};
use baton_testkit::programs::{Kind, Plan, SCOPE, parent, program, start_id};
use proptest::prelude::*;
use serde_json::Value;

fn engine_for(
    store: Arc<dyn baton_run::store::Store>,
    program: &Program<Vec<String>, Value>,
) -> Engine {
    Engine::new(EngineConfig {
        programs: vec![program.erase()],
        ..EngineConfig::new(store)
    })
    .expect("the engine configuration is valid")
}

fn start(key_text: &str, input: Vec<String>, budget: Budget) -> StartRequest<Vec<String>> {
    let mut request = StartRequest::new(start_id(key_text), input);
    request.budget = budget;
    request
}

/// Invariants every finished tree keeps.
fn check_invariants(view: &TreeView) -> Result<(), TestCaseError> {
    for process in &view.processes {
        prop_assert!(
            process.status.is_terminal(),
            "{} is {:?}",
            process.id,
            process.status
        );
        for dimension in [Dimension::Steps, Dimension::Effects, Dimension::Signals] {
            let spent = process.usage.used(&dimension) + process.granted.used(&dimension);
            prop_assert!(
                process.budget.quota(&dimension).allows(spent, 0),
                "{} over budget in {dimension}",
                process.id
            );
            if process.budget.quota(&dimension).is_finite() {
                let debits: u64 = process
                    .children
                    .values()
                    .map(|child| {
                        match view
                            .process(*child)
                            .expect("child")
                            .budget
                            .quota(&dimension)
                        {
                            baton_run::Quota::Finite(n) => n,
                            baton_run::Quota::Unlimited => 0,
                        }
                    })
                    .sum();
                prop_assert_eq!(process.granted.used(&dimension), debits);
            }
        }
        for child in process.children.values() {
            let child = view.process(*child).expect("child");
            prop_assert_eq!(child.parent, Some(process.id));
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, .. ProptestConfig::default() })]
    #[test]
    fn random_trees_keep_budget_and_drain_invariants(
        fanout in 1usize..5,
        child_steps in 0u64..3,
        parent_steps in prop_oneof![Just(None), (1u64..12).prop_map(Some)],
        any in any::<bool>(),
        cancel_rest in any::<bool>(),
        looping in any::<bool>(),
    ) {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
        runtime.block_on(async {
            let child = program(if looping { Kind::Loop } else { Kind::Echo }, None);
            let plan = Plan {
                child_budget: Budget::unlimited().with_steps(child_steps).with_effects(2).with_signals(2),
                child_capabilities: Capabilities::none(),
                boundary: Boundary::Drained,
                condition: if any { Condition::Any } else { Condition::All },
                cancel_rest,
                note: false,
            };
            let root = parent(plan, &child);
            let store = MemoryStore::keeping_history();
            let engine = engine_for(Arc::new(store.clone()), &root);
            let mut budget = Budget::unlimited().with_effects(40).with_signals(40);
            if let Some(steps) = parent_steps {
                budget = budget.with_steps(steps + child_steps * fanout as u64);
            }
            let names: Vec<String> = (0..fanout).map(|i| format!("c{i}")).collect();
            let handle = engine.start(&root, start("random", names, budget)).await.expect("starts");
            handle.join().await.expect("joins");
            let scope = Scope::new(SCOPE).expect("valid");
            engine.verify(&scope, handle.tree()).await.expect("the log verifies");
            let view = engine.inspect(&scope, handle.tree(), Visibility::Public).await.expect("inspects");
            let starts = store.records(handle.tree()).iter().filter(|r| r.kind == RecordKind::ChildStarted).count();
            prop_assert!(starts <= fanout, "no child started twice");
            prop_assert_eq!(starts, view.processes.len() - 1);
            check_invariants(&view)
        })?;
    }
}
