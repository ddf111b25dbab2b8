//! `watch`'s output: the tree's events as lines (or JSON lines), and on a
//! terminal one status line per running agent — a spinner with what it is
//! doing now and the tail of the text it streams — then a summary.

use std::collections::BTreeMap;
use std::time::Duration;

use baton::agent::{AgentEvent, AgentStream};
use baton::run::{Failure, Payload, ProcessId, Status, Usage, WatchEvent, WatchKind};
use clap::ValueEnum;
use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};

use crate::{emit, render};

/// What `watch` shows.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum WatchView {
    /// The tree's events: committed facts and live ones.
    #[default]
    Events,
    /// The agent stream view: agents starting and ending, their tokens,
    /// tool calls and handoffs, and one terminal event.
    Agents,
}

/// How many characters of an agent's streamed text its status line shows.
const TAIL: usize = 60;

/// The running agents' status lines.
struct Lines {
    multi: MultiProgress,
    bars: BTreeMap<ProcessId, AgentLine>,
}

/// One agent's status line and the text it streamed so far.
struct AgentLine {
    bar: ProgressBar,
    name: String,
    doing: String,
    text: String,
}

/// Follows one tree's watch and prints it.
pub(crate) struct Follow {
    json: bool,
    view: WatchView,
    agents: AgentStream,
    lines: Option<Lines>,
    /// How the tree ended, for the summary.
    ended: Option<(Status, Option<Payload>, Option<Failure>)>,
    /// Streamed text was printed since the last line ended.
    mid_line: bool,
}

impl Follow {
    /// Status lines only for people: not with `--json`, and not when stderr
    /// is not a terminal (indicatif then draws nothing).
    pub(crate) fn new(json: bool, view: WatchView) -> Follow {
        let lines = (!json).then(|| Lines {
            multi: MultiProgress::with_draw_target(ProgressDrawTarget::stderr()),
            bars: BTreeMap::new(),
        });
        Follow {
            json,
            view,
            agents: AgentStream::new(),
            lines,
            ended: None,
            mid_line: false,
        }
    }

    /// Takes one event of the watch.
    pub(crate) fn event(&mut self, event: &WatchEvent) {
        let agent_events = self.agents.push(event);
        for agent_event in &agent_events {
            self.status(event, agent_event);
        }
        if let (Some(lines), WatchKind::Progress { progress }) = (&mut self.lines, &event.kind)
            && let Some(process) = event.process
            && let Some(status) = lines.bars.get_mut(&process)
        {
            let progress = &progress.progress;
            let mut doing = progress.phase.clone();
            if let Some(tool) = &progress.tool {
                doing.push_str(&format!(" · {tool}"));
            }
            if let Some(detail) = &progress.detail {
                doing.push_str(&format!(" · {detail}"));
            }
            status.doing = doing;
            status.draw();
        }
        match self.view {
            WatchView::Events => {
                // Live model text and progress go to the status lines; every
                // other event is a line of its own.
                let live_only = matches!(
                    event.kind,
                    WatchKind::Delta { .. } | WatchKind::Progress { .. }
                );
                if self.json || !live_only {
                    self.print(&render::event(event, self.json));
                }
            }
            WatchView::Agents => {
                for agent_event in agent_events {
                    let text = render::agent_event(&agent_event, self.json);
                    if text.is_empty() {
                        continue;
                    }
                    let token = matches!(agent_event, AgentEvent::Token { .. });
                    if self.mid_line && !token {
                        self.print("\n");
                    }
                    self.mid_line = token && !self.json && !text.ends_with('\n');
                    self.print(&text);
                }
            }
        }
    }

    /// Updates the status lines and the ending from one agent event.
    fn status(&mut self, event: &WatchEvent, agent_event: &AgentEvent) {
        match agent_event {
            AgentEvent::Complete { output } => {
                self.ended = Some((Status::Completed, output.clone(), None));
            }
            AgentEvent::Error { status, failure } => {
                self.ended = Some((*status, None, failure.clone()));
            }
            _ => {}
        }
        let Some(lines) = &mut self.lines else {
            return;
        };
        match agent_event {
            AgentEvent::AgentStart { agent } => {
                let bar = lines.multi.add(ProgressBar::new_spinner());
                bar.set_style(
                    ProgressStyle::with_template("{spinner} {msg}")
                        .unwrap_or_else(|_| ProgressStyle::default_spinner()),
                );
                bar.enable_steady_tick(Duration::from_millis(120));
                let name = match (&agent.name, event.path.is_empty()) {
                    (Some(name), true) => name.to_string(),
                    (Some(name), false) => format!("{} {name}", render::path(&event.path)),
                    (None, _) => render::path(&event.path),
                };
                let status = AgentLine {
                    bar,
                    name,
                    doing: "starting".into(),
                    text: String::new(),
                };
                status.draw();
                lines.bars.insert(agent.process, status);
            }
            AgentEvent::Token { agent, text } => {
                if let Some(status) = lines.bars.get_mut(&agent.process) {
                    status.text.push_str(text);
                    status.draw();
                }
            }
            AgentEvent::AgentEnd { agent, .. } => {
                if let Some(status) = lines.bars.remove(&agent.process) {
                    status.bar.finish_and_clear();
                    lines.multi.remove(&status.bar);
                }
            }
            _ => {}
        }
    }

    fn print(&self, text: &str) {
        match &self.lines {
            Some(lines) => lines.multi.suspend(|| emit(text)),
            None => emit(text),
        }
    }

    /// Clears the status lines and prints the summary (people only): how
    /// the tree ended and what it used.
    pub(crate) fn finish(self, usage: Option<&Usage>) {
        if let Some(lines) = &self.lines {
            for status in lines.bars.values() {
                status.bar.finish_and_clear();
            }
            let _ = lines.multi.clear();
        }
        if self.json {
            return;
        }
        if self.mid_line {
            emit("\n");
        }
        emit(&render::watch_summary(self.ended.as_ref(), usage));
    }
}

impl AgentLine {
    fn draw(&self) {
        let tail: String = {
            let flat = self.text.replace(['\n', '\r'], " ");
            let count = flat.chars().count();
            flat.chars().skip(count.saturating_sub(TAIL)).collect()
        };
        let message = if tail.is_empty() {
            format!("{}: {}", self.name, self.doing)
        } else {
            format!("{}: {} · “{tail}”", self.name, self.doing)
        };
        self.bar.set_message(message);
    }
}
