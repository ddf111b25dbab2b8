//! Time enters the engine only through an injectable [`Clock`].

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::protocol::BoxFuture;

/// Milliseconds since the Unix epoch.
#[derive(
    Clone,
    Copy,
    Debug,
    Default,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    Serialize,
    Deserialize,
    schemars::JsonSchema,
)]
#[serde(transparent)]
pub struct Timestamp(pub u64);

impl Timestamp {
    /// Milliseconds since the epoch.
    pub fn millis(self) -> u64 {
        self.0
    }

    /// This instant plus a duration (saturating).
    pub fn plus(self, duration: Duration) -> Timestamp {
        Timestamp(
            self.0
                .saturating_add(u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)),
        )
    }

    /// Time from `self` until `later` (zero if `later` is not later).
    pub fn until(self, later: Timestamp) -> Duration {
        Duration::from_millis(later.0.saturating_sub(self.0))
    }
}

impl fmt::Display for Timestamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}ms", self.0)
    }
}

/// A source of time. Steps never see it; the engine uses it for deadlines
/// and leases, and dispatchers (timers) receive it.
pub trait Clock: Send + Sync + 'static {
    /// The current time.
    fn now(&self) -> Timestamp;

    /// Resolves once `now() >= deadline`.
    fn sleep_until(&self, deadline: Timestamp) -> BoxFuture<'static, ()>;
}

impl fmt::Debug for dyn Clock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Clock({})", self.now())
    }
}

/// Wall-clock time, sleeping with tokio's timer.
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    #[expect(
        clippy::disallowed_methods,
        reason = "the system clock is the one sanctioned reader of wall time"
    )]
    fn now(&self) -> Timestamp {
        let since = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        Timestamp(u64::try_from(since.as_millis()).unwrap_or(u64::MAX))
    }

    fn sleep_until(&self, deadline: Timestamp) -> BoxFuture<'static, ()> {
        let clock = *self;
        Box::pin(async move {
            loop {
                let now = clock.now();
                if now >= deadline {
                    return;
                }
                #[expect(
                    clippy::disallowed_methods,
                    reason = "the system clock sleeps on tokio's timer"
                )]
                tokio::time::sleep(now.until(deadline)).await;
            }
        })
    }
}

/// A clock that moves only when told to; for tests and simulations.
#[derive(Clone, Debug)]
pub struct ManualClock {
    now: Arc<tokio::sync::watch::Sender<Timestamp>>,
}

impl ManualClock {
    /// A clock reading `start`.
    pub fn new(start: Timestamp) -> ManualClock {
        ManualClock {
            now: Arc::new(tokio::sync::watch::Sender::new(start)),
        }
    }

    /// Moves the clock forward by `duration`, waking sleepers that are due.
    pub fn advance(&self, duration: Duration) {
        self.now.send_modify(|now| *now = now.plus(duration));
    }

    /// Sets the clock (never backwards).
    pub fn set(&self, to: Timestamp) {
        self.now.send_modify(|now| *now = (*now).max(to));
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Timestamp {
        *self.now.borrow()
    }

    fn sleep_until(&self, deadline: Timestamp) -> BoxFuture<'static, ()> {
        let mut receiver = self.now.subscribe();
        Box::pin(async move {
            if receiver.wait_for(|now| *now >= deadline).await.is_err() {
                std::future::pending::<()>().await;
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn manual_clock_wakes_sleepers_when_due() {
        let clock = ManualClock::new(Timestamp(1_000));
        let sleeper = tokio::spawn(clock.sleep_until(Timestamp(1_500)));
        clock.advance(Duration::from_millis(100));
        tokio::task::yield_now().await;
        assert!(!sleeper.is_finished());
        clock.advance(Duration::from_millis(400));
        sleeper.await.expect("sleeper finishes");
        assert_eq!(clock.now(), Timestamp(1_500));
        clock.set(Timestamp(10));
        assert_eq!(clock.now(), Timestamp(1_500));
    }
}
