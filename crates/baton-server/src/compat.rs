//! TEMPORARY: stands in for `Condition`, `ProcessHandle::until` and
//! `Engine::shutdown` until the engine's versions land on main.

use baton::run::{ControlError, Engine, ProcessHandle, TreeView};
use baton::run::store::TreeStatus;

#[derive(Clone, Copy, Debug)]
pub(crate) enum Condition {
    WaitOpened,
    Quiescent,
    Terminal,
}

pub(crate) trait HandleExt {
    async fn until(&self, condition: Condition) -> Result<TreeView, ControlError>;
}

impl HandleExt for ProcessHandle {
    async fn until(&self, condition: Condition) -> Result<TreeView, ControlError> {
        let mut ticks = tokio::time::interval(std::time::Duration::from_millis(20));
        loop {
            ticks.tick().await;
            let view = self.inspect().await?;
            let holds = match condition {
                Condition::Terminal => view.status == TreeStatus::Done,
                Condition::Quiescent => view.status != TreeStatus::Running,
                Condition::WaitOpened => {
                    view.status != TreeStatus::Running
                        || view.processes.iter().any(|p| !p.open_waits.is_empty())
                }
            };
            if holds {
                return Ok(view);
            }
        }
    }
}

pub(crate) async fn shutdown(engine: Engine, _grace: std::time::Duration) {
    engine.close().await;
}
