//! SIGINT and SIGTERM.
//!
//! A command that drives a tree claims the signals ([`Interrupt::claim`])
//! once it holds an engine: the first signal then makes it stop waiting and
//! shut its engine down with a bounded grace period. Any other command (a
//! read, or one that has not opened its engine yet) exits at the first
//! signal, as it would without a handler. A second signal always exits at
//! once.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tokio::sync::watch;

use crate::error::Stop;

/// The signals of this process, as a command sees them.
#[derive(Clone)]
pub(crate) struct Interrupt {
    received: watch::Receiver<Option<Stop>>,
    claimed: Arc<AtomicBool>,
}

impl Interrupt {
    /// Starts listening; call within the runtime. A platform without the
    /// signals gets an interrupt that never fires.
    pub fn listen() -> Interrupt {
        let (sender, received) = watch::channel(None);
        let claimed = Arc::new(AtomicBool::new(false));
        let claim = claimed.clone();
        // Installed before any command runs, so no signal slips past.
        let mut signals = Signals::install();
        tokio::spawn(async move {
            let mut seen = 0_u32;
            while let Some(stop) = signals.next().await {
                seen += 1;
                if seen > 1 || !claim.load(Ordering::SeqCst) {
                    let why = match stop {
                        Stop::Terminate => "terminated (SIGTERM)",
                        _ => "interrupted (SIGINT)",
                    };
                    let again = if seen > 1 { " again" } else { "" };
                    eprintln!("error: {why}{again}: exiting now");
                    std::process::exit(i32::from(stop.exit_status()));
                }
                sender.send_replace(Some(stop));
            }
        });
        Interrupt { received, claimed }
    }

    /// From now on, the first signal is this command's to handle: it stops
    /// waiting and shuts its engine down gracefully.
    pub fn claim(&self) {
        self.claimed.store(true, Ordering::SeqCst);
    }

    /// Resolves when a signal arrived (at once if one already did).
    pub async fn received(&self) -> Stop {
        let mut received = self.received.clone();
        let stop = received.wait_for(Option::is_some).await.map(|stop| *stop);
        match stop {
            Ok(stop) => stop.unwrap_or(Stop::Interrupt),
            // The listener ended (no signals on this platform): never.
            Err(_) => std::future::pending().await,
        }
    }
}

/// The signal streams, installed once.
#[cfg(unix)]
struct Signals {
    streams: Option<(tokio::signal::unix::Signal, tokio::signal::unix::Signal)>,
}

#[cfg(unix)]
impl Signals {
    fn install() -> Signals {
        use tokio::signal::unix::{SignalKind, signal};
        // A platform that refuses the handlers keeps the default behaviour
        // (the process ends at once).
        let streams = signal(SignalKind::interrupt())
            .and_then(|interrupt| Ok((interrupt, signal(SignalKind::terminate())?)))
            .ok();
        Signals { streams }
    }

    async fn next(&mut self) -> Option<Stop> {
        let (interrupt, terminate) = self.streams.as_mut()?;
        tokio::select! {
            Some(()) = interrupt.recv() => Some(Stop::Interrupt),
            Some(()) = terminate.recv() => Some(Stop::Terminate),
            else => None,
        }
    }
}

/// Ctrl-C, where there are no Unix signals.
#[cfg(not(unix))]
struct Signals;

#[cfg(not(unix))]
impl Signals {
    fn install() -> Signals {
        Signals
    }

    async fn next(&mut self) -> Option<Stop> {
        tokio::signal::ctrl_c().await.ok()?;
        Some(Stop::Interrupt)
    }
}
