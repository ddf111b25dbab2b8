//! Change notices: every commit that appends to a tree or releases a lease
//! sends `NOTIFY baton_changes` with the tree's id and scope, and a
//! [`Listener`] receives them from a dedicated connection that listens on
//! the channel and connects again when it is lost.

use std::str::FromStr;
use std::time::Duration;

use baton_run::store::StoreError;
use baton_run::{Scope, TreeId};
use futures_util::Stream;
use tokio::sync::{broadcast, mpsc, oneshot, watch};
use tokio_postgres::{AsyncMessage, NoTls};

use crate::CHANNEL;
use crate::error::storage;

/// Something committed that a host waiting on the store may care about.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Notice {
    /// A commit (of any engine on any machine) appended to `tree` or gave
    /// up its lease.
    Changed {
        /// The tree.
        tree: TreeId,
        /// Its scope, once it has records.
        scope: Option<Scope>,
    },
    /// A message was posted to the inbox of `tree`, or settled.
    Inbox {
        /// The tree.
        tree: TreeId,
    },
    /// Notices may have been missed: the listening connection was lost and
    /// is connected again, or this listener fell more than its buffer
    /// behind. Re-read whatever you watch (`Store::list`, `Store::load`).
    Missed,
}

impl Notice {
    /// Reads a `NOTIFY` payload: `"<tree> <scope>"` or `"<tree>"`; `None`
    /// for a payload some other program sent on the channel.
    pub(crate) fn parse(payload: &str) -> Option<Notice> {
        if let Some(tree) = payload.strip_prefix("inbox ") {
            return Some(Notice::Inbox {
                tree: TreeId::from_str(tree).ok()?,
            });
        }
        let (tree, scope) = match payload.split_once(' ') {
            Some((tree, scope)) => (tree, Some(Scope::new(scope).ok()?)),
            None => (payload, None),
        };
        Some(Notice::Changed {
            tree: TreeId::from_str(tree).ok()?,
            scope,
        })
    }
}

/// A subscription to the store's change notices, from
/// [`PostgresStore::listen`](crate::PostgresStore::listen).
///
/// Notices committed after `listen` returned are delivered (unless a
/// [`Notice::Missed`] says otherwise); each is a hint to re-read, never the
/// data itself. Receive with [`Listener::next`] or use it as a `Stream`.
#[derive(Debug)]
pub struct Listener {
    notices: broadcast::Receiver<Notice>,
}

impl Listener {
    pub(crate) fn new(notices: broadcast::Receiver<Notice>) -> Listener {
        Listener { notices }
    }

    /// The next notice; `None` once the store is dropped.
    pub async fn next(&mut self) -> Option<Notice> {
        match self.notices.recv().await {
            Ok(notice) => Some(notice),
            Err(broadcast::error::RecvError::Lagged(_)) => Some(Notice::Missed),
            Err(broadcast::error::RecvError::Closed) => None,
        }
    }

    /// The notices as the kernel's change notices, forwarded by a task of
    /// their own until the subscriber is dropped.
    pub fn into_changes(mut self) -> baton_run::store::Changes {
        use baton_run::store::{Change, Changes};
        let (sender, changes) = Changes::channel();
        tokio::spawn(async move {
            loop {
                let notice = tokio::select! {
                    notice = self.next() => notice,
                    () = sender.closed() => return,
                };
                let change = match notice {
                    Some(Notice::Changed { tree, .. }) => Change::Tree(tree),
                    Some(Notice::Inbox { tree }) => Change::Inbox(tree),
                    Some(Notice::Missed) => Change::Missed,
                    None => return,
                };
                if !sender.send(change) {
                    return;
                }
            }
        });
        changes
    }

    /// The notices as a stream.
    pub fn into_stream(self) -> impl Stream<Item = Notice> + Send + 'static {
        futures_util::stream::unfold(self, |mut listener| async move {
            let notice = listener.next().await?;
            Some((notice, listener))
        })
    }
}

/// Notices buffered per listener before it counts as behind.
const BUFFER: usize = 4096;

/// The longest wait between two attempts to connect again.
const MOST_BACKOFF: Duration = Duration::from_secs(5);

/// Where the listening connection stands.
#[derive(Clone, Debug)]
enum Link {
    /// Connecting for the first time.
    Connecting,
    /// `LISTEN` took effect (it may be connecting again since).
    Listening,
    /// The first attempt failed; the listener stopped.
    Failed(StoreError),
}

/// The store's one listening connection, started by the first `listen`
/// (and again by a later one, if the first could not connect).
pub(crate) struct Hub {
    running: Option<(broadcast::Sender<Notice>, watch::Receiver<Link>)>,
}

impl Hub {
    pub(crate) fn new() -> Hub {
        Hub { running: None }
    }

    /// A new subscription, answered once `LISTEN` took effect.
    pub(crate) fn subscribe(
        &mut self,
        settings: &tokio_postgres::Config,
        reply: oneshot::Sender<Result<Listener, StoreError>>,
    ) {
        let failed = self
            .running
            .as_ref()
            .is_some_and(|(_, link)| matches!(*link.borrow(), Link::Failed(_)));
        if self.running.is_none() || failed {
            let (notices, _) = broadcast::channel(BUFFER);
            let (state, link) = watch::channel(Link::Connecting);
            tokio::spawn(listen_loop(settings.clone(), notices.clone(), state));
            self.running = Some((notices, link));
        }
        let Some((notices, link)) = &self.running else {
            return;
        };
        // Subscribed before waiting, so nothing after `LISTEN` is missed.
        let listener = Listener::new(notices.subscribe());
        let mut link = link.clone();
        tokio::spawn(async move {
            let answer = match link
                .wait_for(|link| !matches!(link, Link::Connecting))
                .await
            {
                Ok(link) => match &*link {
                    Link::Failed(error) => Err(error.clone()),
                    _ => Ok(listener),
                },
                Err(_) => Err(StoreError::unavailable(
                    "postgres store: the listener stopped",
                )),
            };
            let _ = reply.send(answer);
        });
    }
}

/// Connects, listens and forwards notices until the connection ends, then
/// connects again (with a growing pause), telling listeners they may have
/// missed notices. A failure of the first attempt is reported and ends it.
async fn listen_loop(
    settings: tokio_postgres::Config,
    notices: broadcast::Sender<Notice>,
    state: watch::Sender<Link>,
) {
    let mut pause = Duration::from_millis(50);
    loop {
        match connect(&settings).await {
            Ok((client, mut payloads)) => {
                if matches!(*state.borrow(), Link::Connecting) {
                    state.send_replace(Link::Listening);
                } else {
                    let _ = notices.send(Notice::Missed);
                }
                pause = Duration::from_millis(50);
                while let Some(payload) = payloads.recv().await {
                    if let Some(notice) = Notice::parse(&payload) {
                        let _ = notices.send(notice);
                    }
                }
                drop(client);
                tracing::warn!("the postgres listening connection was lost; connecting again");
            }
            Err(error) => {
                if matches!(*state.borrow(), Link::Connecting) {
                    state.send_replace(Link::Failed(error));
                    return;
                }
                tracing::warn!(%error, "the postgres listening connection cannot connect yet");
            }
        }
        pause_for(pause).await;
        pause = (pause * 2).min(MOST_BACKOFF);
    }
}

#[expect(
    clippy::disallowed_methods,
    reason = "a pause before connecting again is real time spent waiting for a server, not a kernel timer"
)]
async fn pause_for(pause: Duration) {
    tokio::time::sleep(pause).await;
}

/// Opens a connection, starts `LISTEN`, and hands back the client (which
/// keeps the connection open) and the payloads as they arrive.
async fn connect(
    settings: &tokio_postgres::Config,
) -> Result<(tokio_postgres::Client, mpsc::UnboundedReceiver<String>), StoreError> {
    let (client, mut connection) = settings.connect(NoTls).await.map_err(storage)?;
    let (payloads, received) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        loop {
            match std::future::poll_fn(|cx| connection.poll_message(cx)).await {
                Some(Ok(AsyncMessage::Notification(notification))) => {
                    if payloads.send(notification.payload().to_owned()).is_err() {
                        return;
                    }
                }
                Some(Ok(_)) => {}
                Some(Err(_)) | None => return,
            }
        }
    });
    client
        .batch_execute(&format!("LISTEN {CHANNEL}"))
        .await
        .map_err(storage)?;
    Ok((client, received))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payloads_read_back_and_foreign_ones_are_ignored() {
        let tree =
            baton_run::ProcessId::root(&baton_run::StartId::new("acme/alice", "k").expect("valid"));
        let scope = Scope::new("acme/alice").expect("valid");
        assert_eq!(
            Notice::parse(&crate::write::notice(tree, Some(scope.as_str()))),
            Some(Notice::Changed {
                tree,
                scope: Some(scope)
            })
        );
        assert_eq!(
            Notice::parse(&crate::write::notice(tree, None)),
            Some(Notice::Changed { tree, scope: None })
        );
        assert_eq!(
            Notice::parse(&crate::inbox::notice(tree)),
            Some(Notice::Inbox { tree })
        );
        assert_eq!(Notice::parse("hello world"), None);
        assert_eq!(Notice::parse(""), None);
    }
}
