//! The shared vocabulary: roster rules every strategy keeps, and the public
//! types' thread safety.

use baton_agent::{InteractionInput, InteractionOutput, ModelError, Request, Response};
use baton_strategy::{
    Agent, AgentId, ConfigError, Hierarchy, ModelConfig, Parallel, Planner, Pure, Router,
    Sequential, SequentialConfig, Swarm, Work,
};

use crate::common::*;

fn answer(request: &Request) -> Result<Response, ModelError> {
    echo(request).ok_or_else(|| ModelError::Malformed("not an agent's request".into()))
}

fn sequential(agents: Vec<Agent>) -> Result<(), &'static str> {
    Sequential::new(SequentialConfig {
        name: "test.rules".into(),
        description: "Rules.".into(),
        agents,
        input: None,
    })
    .map(|_| ())
    .map_err(|error| error.code())
}

#[test]
fn a_roster_needs_valid_unique_ids_and_a_program_per_agent() {
    let models = Models::new(answer);
    assert_eq!(
        AgentId::new("billing.eu:2").map(|id| id.to_string()),
        Ok("billing.eu:2".into())
    );
    for bad in ["", "has space", "ünïcode", &"x".repeat(65)] {
        assert_eq!(
            AgentId::new(bad).map_err(|e| e.code()),
            Err("strategy.roster.invalid_id"),
            "{bad:?}"
        );
    }
    assert_eq!(
        sequential(vec![
            echo_agent(&models, "a"),
            program_agent("a", Behaviour::Echo, None)
        ]),
        Err("strategy.roster.duplicate_agent")
    );
    let shared = program_agent("one", Behaviour::Echo, None);
    let twin = Agent::program("two", &shared.binding().program).expect("valid");
    assert_eq!(
        sequential(vec![shared, twin]),
        Err("strategy.roster.duplicate_program")
    );
    assert_eq!(
        sequential(vec![echo_agent(&models, "chatty").posting()]),
        Err("strategy.roster.posting_chat")
    );
    let not_chat = program_agent("plain", Behaviour::Echo, None);
    let retyped = not_chat
        .binding()
        .program
        .retype::<InteractionInput, InteractionOutput>();
    assert!(matches!(
        Agent::chat("plain", &retyped),
        Err(ConfigError::ChatContract { which: "input", .. })
    ));
    let empty = Pure::new(" ", |_: &baton_strategy::sequential::StepContext| {
        Ok(baton_run::Payload::null())
    });
    assert_eq!(
        Sequential::new(SequentialConfig {
            name: "test.rules".into(),
            description: "Rules.".into(),
            agents: vec![echo_agent(&models, "a")],
            input: Some(empty),
        })
        .map(|_| ())
        .map_err(|e| e.code()),
        Err("strategy.config.build")
    );
}

#[test]
fn the_public_types_can_be_shared_between_threads() {
    fn shared<T: Send + Sync>() {}
    shared::<Sequential>();
    shared::<Parallel>();
    shared::<Router>();
    shared::<Planner>();
    shared::<Swarm>();
    shared::<Hierarchy>();
    shared::<Agent>();
    shared::<ModelConfig>();
    shared::<Pure<Work, Work>>();
    shared::<Work>();
    shared::<ConfigError>();
}
