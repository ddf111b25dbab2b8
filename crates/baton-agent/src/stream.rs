//! The agent stream view: a tree's event stream ([`baton_run::Watch`])
//! projected into what a chat UI shows — an agent starts, streams tokens,
//! calls tools, hands off, ends with its output and usage — closed by
//! exactly one terminal event, `complete` or `error`.
//!
//! Agents and tools are told apart by their programs' roles
//! ([`ProgramRole`]): interactions and strategy turns are agents, tools and
//! activities are tools. Every team and strategy gets the same view, since
//! each is a tree of such processes. A handoff is an agent whose output
//! names the agent taking over (`{"handoff": {"to": …}}`, as a swarm turn
//! answers).

use std::collections::BTreeMap;

use baton_run::{
    ChildKey, Failure, Name, Payload, ProcessId, ProgramRole, Status, Usage, WatchEvent, WatchKind,
};
use serde::{Deserialize, Serialize};

use crate::model::Delta;

/// An agent, as the stream names it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct AgentRef {
    /// Its process.
    pub process: ProcessId,
    /// Its path of child keys from the tree's root (empty for the root).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub path: Vec<ChildKey>,
    /// Its program's name.
    pub name: Option<Name>,
}

/// One event of the agent stream view. Its JSON shape is stable: `type`
/// (snake case) and the variant's fields beside it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
#[non_exhaustive]
pub enum AgentEvent {
    /// An agent started.
    AgentStart {
        /// The agent.
        agent: AgentRef,
    },
    /// A piece of an agent's answer text as the model streams it (live
    /// only: a reader that comes later sees the answer in `agent_end`).
    Token {
        /// The agent.
        agent: AgentRef,
        /// The text.
        text: String,
    },
    /// An agent called a tool.
    ToolCallStart {
        /// The agent.
        agent: AgentRef,
        /// The tool call's process.
        call: ProcessId,
        /// The tool's program name.
        tool: Option<Name>,
    },
    /// A tool call ended.
    ToolCallEnd {
        /// The agent.
        agent: AgentRef,
        /// The tool call's process.
        call: ProcessId,
        /// The tool's program name.
        tool: Option<Name>,
        /// How it ended.
        status: Status,
        /// Its output, when it completed.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        output: Option<Payload>,
        /// Its failure, when it did not.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        failure: Option<Failure>,
    },
    /// An agent handed the conversation to another.
    Handoff {
        /// The agent that handed off.
        from: AgentRef,
        /// The agent taking over, as the handing agent named it.
        to: String,
    },
    /// An agent ended.
    AgentEnd {
        /// The agent.
        agent: AgentRef,
        /// How it ended.
        status: Status,
        /// Its output, when it completed.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        output: Option<Payload>,
        /// Its failure, when it did not.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        failure: Option<Failure>,
        /// What it used, its tool calls included (model tokens, cost, steps).
        usage: Usage,
    },
    /// Terminal: the run completed.
    Complete {
        /// The run's output.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        output: Option<Payload>,
    },
    /// Terminal: the run did not complete.
    Error {
        /// How it ended (`failed`, `canceled`, …).
        status: Status,
        /// Why.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        failure: Option<Failure>,
    },
}

impl AgentEvent {
    /// Whether this is the stream's terminal event.
    pub fn is_terminal(&self) -> bool {
        matches!(self, AgentEvent::Complete { .. } | AgentEvent::Error { .. })
    }
}

/// A running agent's usage so far: its own, then its tool calls' as they end.
#[derive(Debug)]
struct Running {
    agent: AgentRef,
    tools: Usage,
}

/// Folds a tree's watch events into agent events, in order. Feed it every
/// event of one tree from sequence 1 on ([`AgentStream::push`]); it emits
/// exactly one terminal event, when the root ends, and nothing after it.
#[derive(Debug, Default)]
pub struct AgentStream {
    agents: BTreeMap<ProcessId, Running>,
    /// Tool calls in flight: the call's process → its agent and tool name.
    calls: BTreeMap<ProcessId, (ProcessId, Option<Name>)>,
    root: Option<ProcessId>,
    ended: bool,
}

impl AgentStream {
    /// A stream that has seen nothing yet.
    pub fn new() -> AgentStream {
        AgentStream::default()
    }

    /// Whether the terminal event was emitted.
    pub fn is_ended(&self) -> bool {
        self.ended
    }

    /// The agent events one watch event makes (often none).
    pub fn push(&mut self, event: &WatchEvent) -> Vec<AgentEvent> {
        let mut out = Vec::new();
        if self.ended {
            return out;
        }
        let Some(process) = event.process else {
            return out;
        };
        match &event.kind {
            WatchKind::ProcessStarted => {
                self.root = Some(process);
                self.started(event, process, None, &mut out);
            }
            WatchKind::ChildStarted { parent } => {
                self.started(event, process, Some(*parent), &mut out);
            }
            WatchKind::Delta { delta, .. } => {
                if let Some(running) = self.agents.get(&process)
                    && let Ok(Delta::Text { text }) = delta.decode::<Delta>()
                {
                    out.push(AgentEvent::Token {
                        agent: running.agent.clone(),
                        text,
                    });
                }
            }
            WatchKind::Terminated {
                status,
                output,
                failure,
                usage,
            } => {
                let ended = Ended {
                    status: *status,
                    output: output.clone(),
                    failure: failure.clone(),
                    usage: usage.clone(),
                };
                self.terminated(process, ended, &mut out);
            }
            _ => {}
        }
        out
    }

    fn started(
        &mut self,
        event: &WatchEvent,
        process: ProcessId,
        parent: Option<ProcessId>,
        out: &mut Vec<AgentEvent>,
    ) {
        let agent = AgentRef {
            process,
            path: event.path.clone(),
            name: event.program.clone(),
        };
        match event.role {
            ProgramRole::Agent => {
                out.push(AgentEvent::AgentStart {
                    agent: agent.clone(),
                });
                self.agents.insert(
                    process,
                    Running {
                        agent,
                        tools: Usage::default(),
                    },
                );
            }
            ProgramRole::Tool => {
                if let Some(parent) = parent
                    && let Some(running) = self.agents.get(&parent)
                {
                    out.push(AgentEvent::ToolCallStart {
                        agent: running.agent.clone(),
                        call: process,
                        tool: event.program.clone(),
                    });
                    self.calls.insert(process, (parent, event.program.clone()));
                }
            }
            _ => {}
        }
    }

    fn terminated(&mut self, process: ProcessId, ended: Ended, out: &mut Vec<AgentEvent>) {
        if let Some((agent, tool)) = self.calls.remove(&process)
            && let Some(running) = self.agents.get_mut(&agent)
        {
            running.tools.add(&ended.usage);
            out.push(AgentEvent::ToolCallEnd {
                agent: running.agent.clone(),
                call: process,
                tool,
                status: ended.status,
                output: ended.output.clone(),
                failure: ended.failure.clone(),
            });
        }
        if let Some(running) = self.agents.remove(&process) {
            let mut usage = ended.usage.clone();
            usage.add(&running.tools);
            let handoff = ended.output.as_ref().and_then(handoff_target);
            out.push(AgentEvent::AgentEnd {
                agent: running.agent.clone(),
                status: ended.status,
                output: ended.output.clone(),
                failure: ended.failure.clone(),
                usage,
            });
            if let Some(to) = handoff {
                out.push(AgentEvent::Handoff {
                    from: running.agent,
                    to,
                });
            }
        }
        if self.root == Some(process) {
            self.ended = true;
            out.push(match ended.status {
                Status::Completed => AgentEvent::Complete {
                    output: ended.output,
                },
                status => AgentEvent::Error {
                    status,
                    failure: ended.failure,
                },
            });
        }
    }
}

/// How a process ended, as its `terminated` event says.
struct Ended {
    status: Status,
    output: Option<Payload>,
    failure: Option<Failure>,
    usage: Usage,
}

/// The agent an output hands off to: `{"handoff": {"to": "<agent>"}}`.
fn handoff_target(output: &Payload) -> Option<String> {
    #[derive(Deserialize)]
    struct Handing {
        handoff: Option<Target>,
    }
    #[derive(Deserialize)]
    struct Target {
        to: String,
    }
    let handing: Handing = output.decode().ok()?;
    handing.handoff.map(|target| target.to)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handoff_is_read_from_an_output_naming_the_next_agent() {
        let handing = Payload::encode(&serde_json::json!({
            "message": {"role": "assistant", "content": []},
            "handoff": {"to": "billing", "tool": "transfer_to_billing", "call_id": "c1"}
        }))
        .expect("encodes");
        assert_eq!(handoff_target(&handing).as_deref(), Some("billing"));
        let answering = Payload::encode(&serde_json::json!({"text": "done"})).expect("encodes");
        assert_eq!(handoff_target(&answering), None);
        let text = Payload::encode(&serde_json::json!("plain")).expect("encodes");
        assert_eq!(handoff_target(&text), None);
    }
}
