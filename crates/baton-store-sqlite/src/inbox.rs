//! Each tree's inbox (table `inbox`, schema version 3) and the change
//! notices of the store: its own commits are noticed as they commit, and
//! commits of other connections (other handles, other processes) by a
//! watcher that reads `PRAGMA data_version` on a connection of its own
//! every [`WATCH_EVERY`] while anyone subscribes.

use std::path::Path;
use std::str::FromStr;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use baton_run::store::{
    Change, ChangeHub, Message, MessageId, PostOutcome, Posted, Settle, SettleOutcome, StoreError,
};
use baton_run::{Payload, Timestamp, TreeId};
use rusqlite::{Connection, OpenFlags, OptionalExtension, params};

use crate::db::{corrupt, int, storage, tree_row};

/// How often the watcher reads `PRAGMA data_version`.
pub(crate) const WATCH_EVERY: Duration = Duration::from_millis(50);

pub(crate) fn post(conn: &Connection, message: &Message) -> Result<PostOutcome, StoreError> {
    let Some(row) = tree_row(conn, message.tree)? else {
        return Ok(PostOutcome::UnknownTree);
    };
    if row.head_seq == 0 {
        return Ok(PostOutcome::UnknownTree);
    }
    let stored: Option<String> = conn
        .prepare_cached("SELECT body FROM inbox WHERE tree = ?1 AND id = ?2")
        .map_err(storage)?
        .query_row(params![row.key, message.id.as_str()], |r| r.get(0))
        .optional()
        .map_err(storage)?;
    if let Some(stored) = stored {
        return Ok(if stored == message.body.as_str() {
            PostOutcome::Duplicate
        } else {
            PostOutcome::Conflict
        });
    }
    conn.prepare_cached("INSERT INTO inbox (tree, id, body, posted) VALUES (?1, ?2, ?3, ?4)")
        .map_err(storage)?
        .execute(params![
            row.key,
            message.id.as_str(),
            message.body.as_str(),
            int(message.posted.0)
        ])
        .map_err(storage)?;
    Ok(PostOutcome::Posted)
}

pub(crate) fn settle(conn: &Connection, settle: &Settle) -> Result<SettleOutcome, StoreError> {
    let Some(row) = tree_row(conn, settle.tree)? else {
        return Ok(SettleOutcome::Unknown);
    };
    let outcome: Option<Option<String>> = conn
        .prepare_cached("SELECT outcome FROM inbox WHERE tree = ?1 AND id = ?2")
        .map_err(storage)?
        .query_row(params![row.key, settle.id.as_str()], |r| r.get(0))
        .optional()
        .map_err(storage)?;
    let Some(outcome) = outcome else {
        return Ok(SettleOutcome::Unknown);
    };
    // The newest grant settles, also after its last append gave the lease
    // up; a takeover grants a newer token and fences the old one.
    if row.last_token != int(settle.token) {
        return Ok(SettleOutcome::Fenced);
    }
    if outcome.is_some() {
        return Ok(SettleOutcome::AlreadySettled);
    }
    conn.prepare_cached("UPDATE inbox SET outcome = ?3 WHERE tree = ?1 AND id = ?2")
        .map_err(storage)?
        .execute(params![
            row.key,
            settle.id.as_str(),
            settle.outcome.as_str()
        ])
        .map_err(storage)?;
    Ok(SettleOutcome::Settled)
}

/// One stored message row, read back: `(tree id, id, body, posted,
/// outcome)`.
type Row = (String, String, String, i64, Option<String>);

fn decode(row: Row) -> Result<Posted, StoreError> {
    let (tree, id, body, posted, outcome) = row;
    let tree = TreeId::from_str(&tree)
        .map_err(|error| corrupt(format!("inbox: tree id {tree:?}: {error}")))?;
    let id = MessageId::new(id).map_err(|error| corrupt(format!("inbox: {error}")))?;
    let payload = |text: &str, what: &str| {
        Payload::parse_str(text)
            .map_err(|error| corrupt(format!("inbox message {id}: its {what}: {error}")))
    };
    let body = payload(&body, "body")?;
    let outcome = outcome.map(|text| payload(&text, "outcome")).transpose()?;
    let posted = u64::try_from(posted)
        .map_err(|_| corrupt(format!("inbox message {id}: posted time {posted}")))?;
    Ok(Posted {
        message: Message {
            tree,
            id,
            body,
            posted: Timestamp(posted),
        },
        outcome,
    })
}

const SELECT: &str = "SELECT trees.id, inbox.id, inbox.body, inbox.posted, inbox.outcome
     FROM inbox JOIN trees ON trees.key = inbox.tree";

fn read_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<Row> {
    Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?))
}

pub(crate) fn pending(conn: &Connection, tree: Option<TreeId>) -> Result<Vec<Message>, StoreError> {
    let rows = match tree {
        Some(tree) => conn
            .prepare_cached(&format!(
                "{SELECT} WHERE trees.id = ?1 AND inbox.outcome IS NULL ORDER BY inbox.seq"
            ))
            .map_err(storage)?
            .query_map([tree.to_string()], read_row)
            .map_err(storage)?
            .collect::<Result<Vec<_>, _>>(),
        None => conn
            .prepare_cached(&format!(
                "{SELECT} WHERE inbox.outcome IS NULL ORDER BY inbox.seq"
            ))
            .map_err(storage)?
            .query_map([], read_row)
            .map_err(storage)?
            .collect::<Result<Vec<_>, _>>(),
    }
    .map_err(storage)?;
    rows.into_iter()
        .map(|row| decode(row).map(|posted| posted.message))
        .collect()
}

pub(crate) fn message(
    conn: &Connection,
    tree: TreeId,
    id: &MessageId,
) -> Result<Option<Posted>, StoreError> {
    let row = conn
        .prepare_cached(&format!("{SELECT} WHERE trees.id = ?1 AND inbox.id = ?2"))
        .map_err(storage)?
        .query_row(params![tree.to_string(), id.as_str()], read_row)
        .optional()
        .map_err(storage)?;
    row.map(decode).transpose()
}

/// The store's subscribers and its watcher of other connections' commits.
pub(crate) struct Notices {
    pub(crate) hub: ChangeHub,
    watcher: Mutex<Watcher>,
    /// Set when the store is dropped: the watcher stops at once.
    stop: AtomicBool,
}

/// Whether the watcher runs, and its thread. It decides to stop (nobody
/// subscribes) under the same lock a new subscription takes, so a
/// subscription never finds a watcher that is about to stop.
#[derive(Default)]
struct Watcher {
    running: bool,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Notices {
    pub(crate) fn new() -> Notices {
        Notices {
            hub: ChangeHub::new(),
            watcher: Mutex::new(Watcher::default()),
            stop: AtomicBool::new(false),
        }
    }

    fn lock(&self) -> Result<std::sync::MutexGuard<'_, Watcher>, StoreError> {
        self.watcher
            .lock()
            .map_err(|_| StoreError::unavailable("sqlite store: the watcher lock is poisoned"))
    }

    /// A new subscription; starts the watcher unless it runs.
    pub(crate) fn subscribe(
        self: &std::sync::Arc<Self>,
        path: &Path,
    ) -> Result<baton_run::store::Changes, StoreError> {
        let mut watcher = self.lock()?;
        if !watcher.running {
            if let Some(stopped) = watcher.thread.take() {
                let _ = stopped.join();
            }
            let conn = Connection::open_with_flags(
                path,
                OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
            )
            .map_err(storage)?;
            // Read before the subscriber is answered, not when the thread
            // first runs: a commit made after `subscribe` returns must move
            // the version past this one, or the subscriber could miss it.
            let last = version(&conn);
            let notices = std::sync::Arc::clone(self);
            let thread = std::thread::Builder::new()
                .name("baton-sqlite-watcher".into())
                .spawn(move || notices.watch(conn, last))
                .map_err(|error| {
                    StoreError::unavailable(format!("cannot start the sqlite watcher: {error}"))
                })?;
            watcher.running = true;
            watcher.thread = Some(thread);
        }
        Ok(self.hub.subscribe())
    }

    /// Stops the watcher and waits for its connection to close.
    pub(crate) fn stop(&self) {
        self.stop.store(true, Ordering::Release);
        let thread = self
            .lock()
            .ok()
            .and_then(|mut watcher| watcher.thread.take());
        if let Some(thread) = thread {
            let _ = thread.join();
        }
    }

    /// Reads `data_version` every [`WATCH_EVERY`] while anyone subscribes,
    /// and tells subscribers to re-read when it moved from `last`.
    fn watch(&self, conn: Connection, mut last: Option<i64>) {
        let mut warned = false;
        loop {
            pause(WATCH_EVERY);
            if self.stop.load(Ordering::Acquire) {
                return;
            }
            {
                let Ok(mut watcher) = self.watcher.lock() else {
                    return;
                };
                if !self.hub.is_watched() {
                    watcher.running = false;
                    return;
                }
            }
            let now = version(&conn);
            if now.is_none() && !warned {
                warned = true;
                tracing::warn!("the sqlite watcher cannot read data_version; subscribers re-read");
            }
            if now != last || now.is_none() {
                self.hub.notify(Change::Missed);
            }
            last = now;
        }
    }
}

/// The `data_version` of the file as `conn` sees it (`None` if unreadable).
fn version(conn: &Connection) -> Option<i64> {
    conn.query_row("PRAGMA data_version", [], |r| r.get(0)).ok()
}

#[expect(
    clippy::disallowed_methods,
    reason = "the watcher's pause between two reads of data_version is real time on a thread of its own, not a kernel timer"
)]
fn pause(every: Duration) {
    std::thread::sleep(every);
}
