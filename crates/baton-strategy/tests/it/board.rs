//! The message board: a broadcast reaches every running agent once and in
//! order (also across a crash), chat agents read it at a safe boundary,
//! the history reads back from the tree, and invalid posts are classified.

use std::sync::Arc;

use baton_agent::{ChatModel, ModelError, ModelIdentity, Request, Response, Role};
use baton_run::log::RecordKind;
use baton_run::store::Store;
use baton_run::{
    BoxFuture, Engine, MemoryStore, ProcessHandle, RecoverOptions, TreeId, Visibility,
};
use baton_strategy::parallel::{AGENT_FAILED, ErrorMode, Merge, ParallelOutput};
use baton_strategy::{
    Agent, BoardMessage, ModelConfig, Parallel, ParallelConfig, Post, Recipient, board,
};
use baton_testkit::{Cut, FaultStore};
use tokio::sync::watch;

use crate::common::*;

fn post(to: Recipient, subject: &str) -> Post {
    Post {
        to,
        subject: subject.into(),
        body: payload(&format!("about {subject}")),
    }
}

fn team(agents: Vec<Agent>) -> Parallel {
    Parallel::new(ParallelConfig {
        name: "test.board".into(),
        description: "Agents that talk.".into(),
        max_concurrency: agents.len() as u32,
        agents,
        errors: ErrorMode::FailFast,
        merge: Merge::Outputs,
    })
    .expect("valid")
}

/// Three listeners behind `gate` and a poster that broadcasts twice and
/// writes to l2 once.
fn talkers(gate: &Gate) -> Parallel {
    let l2 = baton_strategy::AgentId::new("l2").expect("valid");
    team(vec![
        program_agent("l1", Behaviour::Listen, Some(gate)),
        program_agent("l2", Behaviour::Listen, Some(gate)),
        program_agent("l3", Behaviour::Listen, Some(gate)),
        program_agent(
            "poster",
            Behaviour::Post(vec![
                post(Recipient::Broadcast, "first"),
                post(Recipient::Broadcast, "second"),
                post(Recipient::Agent(l2), "private"),
            ]),
            None,
        ),
    ])
}

/// Waits until the tree's listeners hold `count` undelivered-to-step
/// signals in their mailboxes: the board's deliveries are committed.
async fn deliveries(engine: &Engine, tree: TreeId, count: usize) {
    let mut events = engine.events();
    loop {
        let view = engine
            .inspect(&scope(), tree, Visibility::Public)
            .await
            .expect("inspects");
        let held: usize = view
            .processes
            .iter()
            .filter(|p| {
                p.program.as_str().starts_with("test.l") || p.program.as_str() == "agent.chatty"
            })
            .map(|p| p.mailbox)
            .sum();
        if held >= count {
            return;
        }
        let _ = events.recv().await;
    }
}

async fn received(handle: &ProcessHandle<ParallelOutput>) -> Vec<Vec<u64>> {
    let output = handle.output().await.expect("completed");
    output.results[..3]
        .iter()
        .map(|result| {
            let messages: Vec<BoardMessage> = result
                .outcome
                .output()
                .expect("listened")
                .decode()
                .expect("messages");
            messages.iter().map(|m| m.seq).collect()
        })
        .collect()
}

#[tokio::test]
async fn a_broadcast_reaches_every_running_agent_once_in_order_and_the_history_reads_back() {
    let (gate, open) = gate();
    let team = talkers(&gate);
    let engine = engine(Arc::new(MemoryStore::new()), &[team.program().erase()]);
    let handle = engine
        .start(&team.program(), request("talk", work("coordinate")))
        .await
        .expect("starts")
        .into_handle();
    deliveries(&engine, handle.tree(), 7).await;
    open.send(true).expect("the gate listens");
    assert_eq!(
        received(&handle).await,
        [vec![1, 2], vec![1, 2, 3], vec![1, 2]]
    );
    handle.join().await.expect("joins");
    let capture = engine
        .capture(&scope(), handle.tree())
        .await
        .expect("captures");
    let history = board::history(&capture).expect("reads");
    let subjects: Vec<(u64, &str, &str)> = history
        .iter()
        .map(|m| (m.seq, m.from.as_str(), m.subject.as_str()))
        .collect();
    assert_eq!(
        subjects,
        [
            (1, "poster", "first"),
            (2, "poster", "second"),
            (3, "poster", "private")
        ]
    );
    assert_eq!(
        history[2].to,
        Recipient::Agent(baton_strategy::AgentId::new("l2").expect("valid"))
    );
}

#[tokio::test]
async fn a_broadcast_reaches_every_running_agent_once_in_order_across_a_crash() {
    for cut in [Cut::Before, Cut::After] {
        let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
        let fault = FaultStore::new(store);
        fault.arm(RecordKind::ControlDelivered, cut, 1);
        let (gate, _closed) = gate();
        let program = talkers(&gate).program();
        let first = engine(Arc::new(fault.clone()), &[program.erase()]);
        let handle = first
            .start(&program, request("talk", work("coordinate")))
            .await
            .expect("starts")
            .into_handle();
        let tree = handle.tree();
        assert!(
            handle.join().await.is_err(),
            "{cut:?}: the writer stopped at the crash"
        );
        assert!(fault.crashed(), "{cut:?}");
        drop(handle);
        drop(first);

        let (gate, open) = self::gate();
        let program = talkers(&gate).program();
        let second = engine(fault.inner(), &[program.erase()]);
        let report = second
            .recover(RecoverOptions::default())
            .await
            .expect("recovers");
        assert_eq!(report.len(), 1, "{cut:?}");
        deliveries(&second, tree, 7).await;
        open.send(true).expect("the gate listens");
        let handle = second
            .process::<ParallelOutput>(&scope(), tree)
            .await
            .expect("stored");
        assert_eq!(
            received(&handle).await,
            [vec![1, 2], vec![1, 2, 3], vec![1, 2]],
            "{cut:?}"
        );
        let capture = second.capture(&scope(), tree).await.expect("captures");
        assert_eq!(board::history(&capture).expect("reads").len(), 3, "{cut:?}");
    }
}

/// A model whose first answer waits for its gate; later answers list the
/// board messages the conversation holds.
struct Chatty(watch::Receiver<bool>);

impl ChatModel for Chatty {
    fn identity(&self) -> ModelIdentity {
        ModelIdentity {
            provider: "test".into(),
            model: "chatty".into(),
        }
    }

    fn call(&self, request: Request) -> BoxFuture<'_, Result<Response, ModelError>> {
        let mut gate = self.0.clone();
        Box::pin(async move {
            let board: Vec<String> = request
                .messages()
                .iter()
                .filter(|m| m.role() == Role::User && m.text().starts_with("Board message"))
                .map(|m| m.text())
                .collect();
            if board.is_empty() {
                let _ = gate.wait_for(|open| *open).await;
                return Ok(Response::text("working"));
            }
            Ok(Response::text(board.join(" | ")))
        })
    }
}

#[tokio::test]
async fn a_chat_agent_reads_board_messages_at_its_next_safe_boundary() {
    let (open, gate) = watch::channel(false);
    let chatty = Agent::model(
        "chatty",
        "Listens while it works.",
        "You work.",
        &ModelConfig::new(Arc::new(Chatty(gate))),
    )
    .expect("valid");
    let team = team(vec![
        chatty,
        program_agent(
            "poster",
            Behaviour::Post(vec![
                post(Recipient::Broadcast, "first"),
                post(Recipient::Broadcast, "second"),
            ]),
            None,
        ),
    ]);
    let engine = engine(Arc::new(MemoryStore::new()), &[team.program().erase()]);
    let handle = engine
        .start(&team.program(), request("chat", work("coordinate")))
        .await
        .expect("starts")
        .into_handle();
    deliveries(&engine, handle.tree(), 2).await;
    open.send(true).expect("the model listens");
    let output = handle.output().await.expect("completed");
    assert_eq!(
        output.results[0].outcome.output(),
        Some(&payload(
            &"Board message 1 from poster to everyone: first\nabout first | Board message 2 from poster to everyone: second\nabout second"
        ))
    );
}

#[tokio::test]
async fn a_post_to_an_agent_outside_the_roster_fails_the_posting_task() {
    let stranger = baton_strategy::AgentId::new("stranger").expect("valid");
    let team = team(vec![program_agent(
        "poster",
        Behaviour::Post(vec![post(Recipient::Agent(stranger), "hello")]),
        None,
    )]);
    let (_, _, ended) = run(&team.program(), "stranger", work("x")).await;
    let failure = failure_of(&ended);
    assert_eq!(failure.code(), AGENT_FAILED);
    assert!(failure.message.contains(board::POST_INVALID), "{failure}");
}
