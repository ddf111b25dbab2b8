//! The message board between agents: durable, ordered, team-level.
//!
//! An agent declared [`posting`](crate::Agent::posting) returns a
//! [`Posted`]: its result and the messages it posts. When the team's
//! coordinator sees its task end, the posts go on the board in the order
//! the coordinator observed them, numbered from 1, and each is delivered
//! at once to every running agent it is addressed to (a broadcast: every
//! running agent but the sender) as a signal control of the team: a
//! [`Steering`] for a chat agent, applied at its next safe boundary, and
//! the [`BoardMessage`] itself for a program agent whose signal schema
//! accepts it. The board lives in the team's working state
//! ([`Work::board`](crate::Work)), so it is written to the log with every
//! team step and every coordinator turn, and each delivery is a
//! `control_delivered` record: no in-memory channel holds a message, and a
//! crash loses or repeats none. [`history`] reads it back from a tree.

use baton_agent::Steering;
use baton_run::program::ChildSignal;
use baton_run::{ChildKey, Failure, Payload, SignalId, TreeCapture};
use baton_team::{Control, Decision, Turn};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::driver::{Fact, State, TurnView};
use crate::roster::{Roster, text_of};
use crate::{AgentId, AgentKind, Work};

/// Code of an agent's output that is not a valid [`Posted`] (its task
/// counts as failed).
pub const POST_INVALID: &str = "strategy.board.post_invalid";
/// Code of a board that cannot be read from a tree.
pub const UNREADABLE: &str = "strategy.board.unreadable";

/// Who a message is for.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum Recipient {
    /// Every running agent but the sender.
    Broadcast,
    /// One agent, if it is running.
    Agent(AgentId),
}

/// A message an agent posts: what its [`Posted`] output lists.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Post {
    /// Who it is for.
    pub to: Recipient,
    /// What it is about.
    pub subject: String,
    /// The content.
    pub body: Payload,
}

/// The output of an agent that posts: its result and its posts.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Posted {
    /// The agent's result, as strategies see it.
    pub output: Payload,
    /// Messages for the board, in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub posts: Vec<Post>,
}

/// A message on the board.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct BoardMessage {
    /// Its place on the board, from 1.
    pub seq: u64,
    /// The agent that posted it.
    pub from: AgentId,
    /// Who it is for.
    pub to: Recipient,
    /// What it is about.
    pub subject: String,
    /// The content.
    pub body: Payload,
}

impl BoardMessage {
    /// The text a chat agent reads.
    pub fn text(&self) -> String {
        let to = match &self.to {
            Recipient::Broadcast => "everyone".to_owned(),
            Recipient::Agent(id) => id.to_string(),
        };
        format!(
            "Board message {} from {} to {to}: {}\n{}",
            self.seq,
            self.from,
            self.subject,
            text_of(&self.body)
        )
    }
}

/// The board: every message so far, and the tasks whose posts are on it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Board {
    /// The messages, in board order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub messages: Vec<BoardMessage>,
    /// Keys of the ended tasks whose posts were taken, in the order taken.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub collected: Vec<String>,
}

impl Board {
    /// Whether nothing was posted or collected.
    pub fn is_empty(&self) -> bool {
        self.messages.is_empty() && self.collected.is_empty()
    }

    /// Takes the posts of tasks that ended since the last turn and returns
    /// the controls delivering the new messages, message by message in
    /// board order.
    pub(crate) fn absorb(&mut self, view: &TurnView<'_>, roster: &Roster) -> Vec<Control> {
        let first_new = self.messages.len();
        for fact in &view.facts {
            let Some(index) = fact.agent else { continue };
            if fact.posts.is_empty() || self.collected.iter().any(|key| key == fact.key) {
                continue;
            }
            self.collected.push(fact.key.to_owned());
            for post in &fact.posts {
                self.messages.push(BoardMessage {
                    seq: self.messages.len() as u64 + 1,
                    from: roster.get(index).id().clone(),
                    to: post.to.clone(),
                    subject: post.subject.clone(),
                    body: post.body.clone(),
                });
            }
        }
        let mut controls = Vec::new();
        for message in &self.messages[first_new..] {
            for fact in view
                .facts
                .iter()
                .filter(|f| matches!(f.state, State::Running))
            {
                if let Some(control) = delivery(message, fact, roster) {
                    controls.push(control);
                }
            }
        }
        controls
    }
}

/// The control delivering `message` to the running task `fact`, if the
/// message is for its agent and the agent can take it.
fn delivery(message: &BoardMessage, fact: &Fact<'_>, roster: &Roster) -> Option<Control> {
    let agent = roster.get(fact.agent?);
    if *agent.id() == message.from {
        return None;
    }
    if let Recipient::Agent(to) = &message.to
        && to != agent.id()
    {
        return None;
    }
    let payload = match agent.kind() {
        AgentKind::Chat => Payload::encode(&Steering {
            messages: vec![message.text()],
        })
        .ok()?,
        AgentKind::Program => {
            let payload = Payload::encode(message).ok()?;
            let schema = agent.binding().program.descriptor().signal_schema();
            if !schema.is_valid(&payload) {
                return None;
            }
            payload
        }
    };
    let id = SignalId::new(format!("board.{}.{}", message.seq, fact.key)).ok()?;
    let key = ChildKey::new(fact.key).ok()?;
    Some(Control::signal(
        key,
        ChildSignal {
            id,
            wait: None,
            payload,
        },
    ))
}

/// Splits a posting agent's output into its result and its posts; an
/// output that is not a [`Posted`], or that addresses an agent outside the
/// roster, is a failure of the task.
pub(crate) fn split(output: &Payload, roster: &Roster) -> Result<(Payload, Vec<Post>), Failure> {
    let posted: Posted = output.decode().map_err(|error| {
        Failure::contract(
            POST_INVALID,
            format!("a posting agent's output is not a Posted: {error}"),
        )
    })?;
    for post in &posted.posts {
        if let Recipient::Agent(to) = &post.to
            && roster.index_of(to.as_str()).is_none()
        {
            return Err(Failure::contract(
                POST_INVALID,
                format!("a post is addressed to {to}, who is not in the roster"),
            ));
        }
    }
    Ok((posted.output, posted.posts))
}

/// Why a board could not be read from a tree.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("strategy.board.unreadable: {0}")]
pub struct BoardError(String);

impl BoardError {
    /// The stable code, `strategy.board.unreadable`.
    pub fn code(&self) -> &'static str {
        UNREADABLE
    }
}

/// The board of a strategy's tree, as of its latest coordinator turn: the
/// messages in board order.
///
/// Reads the capture (`Engine::capture`) of a tree whose root is a
/// strategy's team: the latest coordinator turn's decision when it has
/// decided, else the turn it was given. A tree with no turn yet has an
/// empty board. It reads the processes' keys, recorded states and
/// terminations from the capture, and the coordinator's state is its
/// [`Turn`].
pub fn history(capture: &TreeCapture) -> Result<Vec<BoardMessage>, BoardError> {
    let state = capture.state.to_value();
    let unreadable = |what: &str| BoardError(format!("the capture {what}"));
    let root = state
        .get("root")
        .and_then(|root| root.as_str())
        .ok_or_else(|| unreadable("names no root"))?;
    let processes = state
        .get("processes")
        .and_then(|processes| processes.as_object())
        .ok_or_else(|| unreadable("holds no processes"))?;
    let mut latest: Option<(u64, &serde_json::Value)> = None;
    for process in processes.values() {
        if process.get("parent").and_then(|p| p.as_str()) != Some(root) {
            continue;
        }
        let Some(number) = process
            .get("key")
            .and_then(|key| key.as_str())
            .and_then(|key| key.strip_prefix(baton_team::RESERVED_PREFIX))
            .and_then(|number| number.parse::<u64>().ok())
        else {
            continue;
        };
        if latest.is_none_or(|(best, _)| number > best) {
            latest = Some((number, process));
        }
    }
    let Some((_, process)) = latest else {
        return Ok(Vec::new());
    };
    let decided = process
        .get("termination")
        .and_then(|termination| termination.get("output"));
    let work = match decided {
        Some(output) => {
            let decision: Decision =
                serde_json::from_value(output.clone()).map_err(|e| BoardError(e.to_string()))?;
            decision.state
        }
        None => {
            let turn = process
                .get("state")
                .ok_or_else(|| unreadable("holds a turn without its state"))?;
            let turn: Turn =
                serde_json::from_value(turn.clone()).map_err(|e| BoardError(e.to_string()))?;
            turn.state
        }
    };
    let work: Work = work.decode().map_err(|e| BoardError(e.to_string()))?;
    Ok(work.board.messages)
}
