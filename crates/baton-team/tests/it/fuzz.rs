//! Fuzzing the team's decoders of external bytes (see
//! `baton_testkit::fuzz`): a coordinator's `Decision` (what a model writes),
//! a `Turn`, and a recorded team state restored after a crash. Each input
//! decodes, or is refused with a classified error; none panics.

use baton_run::Payload;
use baton_run::program::ExecutionState;
use baton_team::{Control, Decision, Mode, TaskRequest, Turn};
use baton_testkit::fuzz;
use proptest::prelude::*;
use serde_json::json;

use crate::common::{key, name, payload};

fn decision_seeds() -> Vec<String> {
    let full = Decision::new(
        Mode::Wait,
        payload(json!({"notes": ["a", "b"], "round": 2})),
    )
    .with_task(TaskRequest::new(key("a"), name("w.num"), payload(json!(1))))
    .with_task(TaskRequest::new(
        key("b"),
        name("w.text"),
        payload(json!("x")),
    ))
    .with_control(Control::cancel(key("c"), "enough"));
    let done = Decision::complete(payload(json!(7)), payload(json!("done")));
    [full, done]
        .iter()
        .map(|decision| {
            Payload::encode(decision)
                .expect("encodes")
                .as_str()
                .to_owned()
        })
        .collect()
}

/// Turns a team writes: one task running; then three tasks (settled,
/// refused, running) that the memo's entries hold once a seed was decoded.
fn turn_seeds() -> Vec<String> {
    const RUNNING: &str = r#"{"process":"p_0123456789abcdef0123456789abcdef","request":{"input":1,"key":"a","worker":"w.num"}}"#;
    const SETTLED: &str = r#"{"outcome":{"cause":"completion","output":2,"status":"completed"},"process":"p_00112233445566778899aabbccddeeff","request":{"input":1,"key":"s","worker":"w.num"}}"#;
    const REFUSED: &str = r#"{"rejection":{"code":"engine.child.tree_limit","kind":"contract","message":"refused"},"request":{"input":"x","key":"r","worker":"w.text"}}"#;
    vec![
        format!(
            r#"{{"controls":[],"number":3,"state":{{"a":1}},"tasks":[{RUNNING}],"workers":[]}}"#
        ),
        format!(
            r#"{{"controls":[],"number":4,"state":{{"tasks":[{SETTLED}]}},"tasks":[{SETTLED},{REFUSED},{RUNNING}],"workers":[]}}"#
        ),
    ]
}

/// The policy `fuzz_turns` decodes through, its memo kept across cases.
static TURN_POLICY: std::sync::OnceLock<baton_team::Policy> = std::sync::OnceLock::new();

proptest! {
    #![proptest_config(fuzz::config())]

    /// A decision as a model or a coordinator writes it: it decodes (and
    /// then reads back to the same text), or it is refused.
    #[test]
    fn fuzz_decisions(text in fuzz::text(decision_seeds())) {
        if let Ok(payload) = Payload::parse_str(&text)
            && let Ok(decision) = payload.decode::<Decision>()
        {
            let again = Payload::encode(&decision).expect("a decision encodes");
            prop_assert_eq!(again.decode::<Decision>().ok(), Some(decision));
        }
    }

    /// A turn's text: it decodes, or it is refused; and a policy whose
    /// memo holds the seeds' tasks sees exactly that turn, or fails with
    /// exactly that error.
    #[test]
    fn fuzz_turns(text in fuzz::text(turn_seeds())) {
        if let Ok(payload) = Payload::parse_str(&text) {
            let _ = payload.decode::<Turn>();
            let policy = TURN_POLICY.get_or_init(|| {
                let policy = crate::policy_memo::policy();
                for seed in turn_seeds() {
                    let seed = Payload::parse_str(&seed).expect("the seeds are JSON");
                    crate::policy_memo::check(&policy, &seed).expect("the seeds decode");
                }
                policy
            });
            crate::policy_memo::check(policy, &payload)?;
        }
    }

    /// A recorded team state as a store returns it after a crash: the team
    /// restores it, or refuses it with a contract failure.
    #[test]
    fn fuzz_team_states(text in fuzz::text(vec![
        r#"{"initial":7}"#.to_owned(),
        r#"{"tasks":[{"process":"p_0123456789abcdef0123456789abcdef","request":{"input":1,"key":"a","worker":"w.num"}}],"turn":{"coordinator":"p_fedcba9876543210fedcba9876543210","number":2,"state":7}}"#.to_owned(),
        r#"{"tasks":[{"outcome":{"cause":"completion","output":2,"status":"completed"},"process":"p_0123456789abcdef0123456789abcdef","request":{"input":1,"key":"a","worker":"w.num"}},{"rejection":{"code":"engine.child.tree_limit","kind":"contract","message":"refused"},"request":{"input":"x","key":"b","worker":"w.text"}}],"turn":{"coordinator":"p_fedcba9876543210fedcba9876543210","number":2,"outcome_arrived":true,"state":7}}"#.to_owned(),
    ])) {
        static TEAM: std::sync::OnceLock<baton_run::Program<u32, String>> = std::sync::OnceLock::new();
        let team = TEAM.get_or_init(crate::steps::team_for_fuzzing);
        if let Ok(payload) = Payload::parse_str(&text)
            && let Err(error) = team.definition().restore(&ExecutionState(payload))
        {
            prop_assert_eq!(error.failure().kind, baton_run::FailureKind::Contract, "{}", error.failure());
        }
    }
}
