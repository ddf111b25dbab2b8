//! Swarm: handoffs with generated transfer tools, the shared conversation,
//! the handoff limit, invalid handoffs, construction rules, conformance
//! and crashes.

use baton_agent::{ModelError, Request, Response, Role, ToolCall};
use baton_run::program::{Signal, SignalBody};
use baton_run::{EffectId, Payload, ProcessId, Program, Settlement, SignalId, StartId};
use baton_strategy::swarm::{
    DEFAULT_MAX_HANDOFFS, HANDOFF_INVALID, MAX_HANDOFFS, SwarmAgent, SwarmInput, SwarmOutput,
    tool_name,
};
use baton_strategy::{Swarm, SwarmConfig, Work};
use baton_testkit::{ConformanceCase, definition_conformance};
use serde_json::json;

use crate::common::*;

fn transfer(to: &str, message: &str) -> Response {
    Response::calls(vec![ToolCall {
        id: format!("call-{to}"),
        name: tool_name(to),
        arguments: json!({ "message": message }).to_string(),
    }])
    .expect("a valid answer")
}

/// Each agent's behaviour, by the id in its system prompt.
fn answer(request: &Request) -> Result<Response, ModelError> {
    let system = system(request);
    let id = system
        .strip_prefix("You are ")
        .and_then(|s| s.strip_suffix('.'))
        .ok_or_else(|| ModelError::Malformed("not a swarm agent".into()))?;
    let first_user = request
        .messages()
        .iter()
        .find(|m| m.role() == Role::User)
        .map(|m| m.text())
        .unwrap_or_default();
    Ok(match id {
        "triage" => transfer("billing", "the customer wants money back"),
        "billing" => transfer("refunds", "order 7 qualifies"),
        "refunds" => Response::text(format!("refund issued: {first_user}")),
        "ping" => transfer("pong", "your turn"),
        "pong" => transfer("ping", "your turn"),
        "confused" => Response::calls(vec![
            ToolCall {
                id: "1".into(),
                name: tool_name("triage"),
                arguments: "{}".into(),
            },
            ToolCall {
                id: "2".into(),
                name: tool_name("refunds"),
                arguments: "{}".into(),
            },
        ])
        .expect("a valid answer"),
        _ => return Err(ModelError::Malformed(format!("unknown agent {id}"))),
    })
}

fn agent(models: &Models, id: &str) -> SwarmAgent {
    SwarmAgent {
        id: id.into(),
        name: format!("The {id} desk"),
        description: format!("Hand over to {id} for {id} questions."),
        system: format!("You are {id}."),
        model: models.config(id),
    }
}

fn desk(models: &Models) -> Swarm {
    Swarm::new(SwarmConfig::new(
        "test.swarm",
        "Customer service.",
        ["triage", "billing", "refunds"]
            .iter()
            .map(|id| agent(models, id))
            .collect(),
    ))
    .expect("valid")
}

fn service(models: &Models) -> Program<Work, SwarmOutput> {
    desk(models).program()
}

#[tokio::test]
async fn agents_hand_the_shared_conversation_on_until_one_answers() {
    let models = Models::new(answer);
    let team = desk(&models);
    let (engine, handle, ended) = run(&team.program(), "swarm", work("refund order 7")).await;
    let output: SwarmOutput = ended
        .output()
        .expect("completed")
        .decode()
        .expect("decodes");
    assert_eq!(output.answer, "refund issued: refund order 7");
    assert_eq!(output.agent.as_str(), "refunds");
    let hops: Vec<(&str, &str, Option<&str>)> = output
        .handoffs
        .iter()
        .map(|h| (h.from.as_str(), h.to.as_str(), h.message.as_deref()))
        .collect();
    assert_eq!(
        hops,
        [
            ("triage", "billing", Some("the customer wants money back")),
            ("billing", "refunds", Some("order 7 qualifies"))
        ]
    );
    let roles: Vec<Role> = output.conversation.iter().map(|m| m.role()).collect();
    assert_eq!(
        roles,
        [
            Role::User,
            Role::Assistant,
            Role::Tool,
            Role::Assistant,
            Role::Tool,
            Role::Assistant
        ]
    );
    // Each agent is offered a transfer tool to every other agent, described
    // by the target's description.
    let triage: Request = Payload::parse_str(
        &models
            .requests()
            .into_iter()
            .find(|r| r.contains("You are triage."))
            .expect("asked"),
    )
    .and_then(|p| p.decode())
    .expect("a request");
    let tools: Vec<(&str, &str)> = triage
        .tools()
        .iter()
        .map(|t| (t.name.as_str(), t.description.as_str()))
        .collect();
    assert_eq!(
        tools,
        [
            (
                "transfer_to_billing",
                "Hand over to billing for billing questions."
            ),
            (
                "transfer_to_refunds",
                "Hand over to refunds for refunds questions."
            )
        ]
    );
    assert!(
        models.calls().values().all(|c| *c == 1),
        "{:?}",
        models.calls()
    );
    let turns = recorded_turns(&engine, handle.tree()).await;
    let checked = definition_conformance(
        team.coordinator().definition().as_ref(),
        &turn_cases(&turns),
    );
    assert_eq!(checked, turns.len());
}

#[tokio::test]
async fn the_handoff_limit_ends_the_swarm_with_its_own_code() {
    let models = Models::new(answer);
    let mut config = SwarmConfig::new(
        "test.pingpong",
        "Endless.",
        vec![agent(&models, "ping"), agent(&models, "pong")],
    );
    config.max_handoffs = 3;
    let (_, _, ended) = run(
        &Swarm::new(config).expect("valid").program(),
        "limit",
        work("go"),
    )
    .await;
    let failure = failure_of(&ended);
    assert_eq!(failure.code(), MAX_HANDOFFS);
    assert!(
        failure
            .message
            .contains("agent pong asked for handoff 4 to ping, over the limit of 3"),
        "{failure}"
    );
    assert_eq!(models.total(), 4);

    let models = Models::new(answer);
    let config = SwarmConfig::new(
        "test.pingpong",
        "Endless.",
        vec![agent(&models, "ping"), agent(&models, "pong")],
    );
    assert_eq!(config.max_handoffs, DEFAULT_MAX_HANDOFFS);
    let (_, _, ended) = run(
        &Swarm::new(config).expect("valid").program(),
        "default",
        work("go"),
    )
    .await;
    assert_eq!(failure_of(&ended).code(), MAX_HANDOFFS);
    assert_eq!(
        models.total(),
        11,
        "ten handoffs, and the turn that asked for an eleventh"
    );
}

#[tokio::test]
async fn an_answer_that_is_not_exactly_one_transfer_is_an_invalid_handoff() {
    let models = Models::new(answer);
    let mut config = SwarmConfig::new(
        "test.confused",
        "Confused.",
        ["confused", "triage", "refunds"]
            .iter()
            .map(|id| agent(&models, id))
            .collect(),
    );
    config.initial = Some("confused".into());
    let (_, _, ended) = run(
        &Swarm::new(config).expect("valid").program(),
        "confused",
        work("go"),
    )
    .await;
    let failure = failure_of(&ended);
    assert_eq!(failure.code(), HANDOFF_INVALID);
    assert!(
        failure
            .message
            .contains("agent confused: the model made 2 tool calls"),
        "{failure}"
    );
}

#[test]
fn tool_names_are_sanitized_and_collisions_refused_when_built() {
    assert_eq!(tool_name("billing.eu:2"), "transfer_to_billing_eu_2");
    assert_eq!(tool_name(&"x".repeat(64)).len(), 64);
    let models = Models::new(answer);
    let build = |ids: &[&str], initial: Option<&str>, max: u32| {
        let mut config = SwarmConfig::new(
            "test.rules",
            "Rules.",
            ids.iter().map(|id| agent(&models, id)).collect(),
        );
        config.initial = initial.map(str::to_owned);
        config.max_handoffs = max;
        Swarm::new(config).map(|_| ()).map_err(|e| e.code())
    };
    assert_eq!(
        build(&["a.b", "a_b"], None, 10),
        Err("strategy.swarm.tool_name_collision")
    );
    assert_eq!(
        build(&["solo"], None, 10),
        Err("strategy.swarm.too_few_agents")
    );
    assert_eq!(
        build(&["a", "b"], Some("c"), 10),
        Err("strategy.swarm.unknown_initial")
    );
    assert_eq!(
        build(&["a", "a"], None, 10),
        Err("strategy.roster.duplicate_agent")
    );
    assert_eq!(
        build(&["a", "b"], None, 0),
        Err("strategy.swarm.zero_handoffs")
    );
    assert_eq!(build(&["a", "b"], Some("b"), 1), Ok(()));
}

#[test]
fn a_turn_program_keeps_the_definition_contract() {
    let models = Models::new(answer);
    let team = desk(&models);
    let input = payload(&SwarmInput {
        conversation: vec![baton_agent::Message::user("refund order 7")],
    });
    let effect = EffectId::new(
        ProcessId::root(&StartId::new("acme", "turn").expect("valid")),
        0,
        0,
    );
    let settled = |response: Response| Signal {
        id: SignalId::for_effect(effect),
        wait: None,
        body: SignalBody::Settled {
            effect,
            settlement: Settlement::ok(payload(&response)),
        },
    };
    let cases = vec![
        ConformanceCase::new(
            "handoff",
            input.clone(),
            vec![vec![], vec![settled(transfer("billing", "go"))]],
        ),
        ConformanceCase::new(
            "answer",
            input.clone(),
            vec![vec![], vec![settled(Response::text("done"))]],
        ),
        ConformanceCase::new(
            "invalid",
            input,
            vec![vec![], vec![settled(transfer("nobody", "go"))]],
        ),
    ];
    let checked = definition_conformance(team.turns()[0].definition().as_ref(), &cases);
    assert_eq!(checked, 6);
}

#[tokio::test]
async fn a_crash_at_any_commit_resumes_to_the_same_output_without_repeating_a_model_call() {
    let crashes = crash_everywhere(service, answer, "refund order 7").await;
    assert!(crashes >= 15, "{crashes} crashes checked");
}

#[tokio::test]
async fn the_agent_stream_shows_each_turn_and_each_handoff() {
    let models = Models::new(answer);
    let team = desk(&models);
    let (engine, handle, _) = run(&team.program(), "stream", work("refund order 7")).await;
    let events = agent_stream(&engine, handle.tree()).await;
    assert_eq!(started_agents(&events).len(), 3, "{events:#?}");
    let handoffs: Vec<&str> = events
        .iter()
        .filter_map(|event| match event {
            baton_agent::AgentEvent::Handoff { to, .. } => Some(to.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(handoffs, ["billing", "refunds"]);
    assert!(matches!(
        events.last(),
        Some(baton_agent::AgentEvent::Complete { .. })
    ));
}
