//! Each tree's inbox (table `baton_inbox`, schema version 3): commands
//! posted for the engine that holds a tree, each settled once by it.
//!
//! A post or a settlement is one short transaction of its own on a pooled
//! connection (not the writer's group: it must not wait behind appends),
//! and sends `NOTIFY baton_changes, 'inbox <tree>'` in the same
//! transaction. A settlement first locks the tree's row (`FOR SHARE`), so
//! it serializes with a takeover's grant: the fencing check reads the
//! newest token.

use std::str::FromStr;

use baton_run::store::{
    Message, MessageId, PostOutcome, Posted, Settle, SettleOutcome, StoreError,
};
use baton_run::{Payload, Timestamp, TreeId};
use deadpool_postgres::{GenericClient, Pool};
use tokio_postgres::Row;

use crate::CHANNEL;
use crate::error::{pool as pool_error, storage};
use crate::rows::{column, corrupt, execute, int, query, query_opt, uint};
use crate::write::Reply;

/// An inbox operation, answered on a pooled connection.
pub(crate) enum Op {
    Post(Message, Reply<PostOutcome>),
    Settle(Settle, Reply<SettleOutcome>),
    Pending(Option<TreeId>, Reply<Vec<Message>>),
    Message(TreeId, MessageId, Reply<Option<Posted>>),
}

/// The `NOTIFY` payload of a change to the inbox of `tree`.
pub(crate) fn notice(tree: TreeId) -> String {
    format!("inbox {tree}")
}

/// Runs one operation and answers it.
pub(crate) async fn run(pool: &Pool, op: Op) {
    match op {
        Op::Post(message, reply) => {
            let _ = reply.send(post(pool, &message).await);
        }
        Op::Settle(settle, reply) => {
            let _ = reply.send(settle_message(pool, &settle).await);
        }
        Op::Pending(tree, reply) => {
            let _ = reply.send(pending(pool, tree).await);
        }
        Op::Message(tree, id, reply) => {
            let _ = reply.send(message(pool, tree, &id).await);
        }
    }
}

async fn post(pool: &Pool, message: &Message) -> Result<PostOutcome, StoreError> {
    let mut client = pool.get().await.map_err(pool_error)?;
    let tx = client.transaction().await.map_err(storage)?;
    let tree = message.tree.to_string();
    let Some(row) = query_opt(
        &tx,
        "SELECT key FROM baton_trees WHERE id = $1 AND head_seq > 0",
        &[&tree],
    )
    .await
    .map_err(storage)?
    else {
        return Ok(PostOutcome::UnknownTree);
    };
    let key: i64 = column(&row, 0)?;
    let inserted = execute(
        &tx,
        "INSERT INTO baton_inbox (tree, id, body, posted) VALUES ($1, $2, $3, $4)
         ON CONFLICT (tree, id) DO NOTHING",
        &[
            &key,
            &message.id.as_str(),
            &message.body.as_str(),
            &int(message.posted.0),
        ],
    )
    .await
    .map_err(storage)?;
    if inserted == 0 {
        let stored = query_opt(
            &tx,
            "SELECT body FROM baton_inbox WHERE tree = $1 AND id = $2",
            &[&key, &message.id.as_str()],
        )
        .await
        .map_err(storage)?;
        let same = match &stored {
            Some(row) => column::<String>(row, 0)? == message.body.as_str(),
            None => false,
        };
        return Ok(if same {
            PostOutcome::Duplicate
        } else {
            PostOutcome::Conflict
        });
    }
    notify(&tx, message.tree).await?;
    tx.commit().await.map_err(storage)?;
    Ok(PostOutcome::Posted)
}

async fn settle_message(pool: &Pool, settle: &Settle) -> Result<SettleOutcome, StoreError> {
    let mut client = pool.get().await.map_err(pool_error)?;
    let tx = client.transaction().await.map_err(storage)?;
    let Some(row) = query_opt(
        &tx,
        "SELECT key, last_token FROM baton_trees WHERE id = $1 FOR SHARE",
        &[&settle.tree.to_string()],
    )
    .await
    .map_err(storage)?
    else {
        return Ok(SettleOutcome::Unknown);
    };
    let (key, last_token): (i64, i64) = (column(&row, 0)?, column(&row, 1)?);
    let Some(stored) = query_opt(
        &tx,
        "SELECT outcome IS NOT NULL FROM baton_inbox WHERE tree = $1 AND id = $2",
        &[&key, &settle.id.as_str()],
    )
    .await
    .map_err(storage)?
    else {
        return Ok(SettleOutcome::Unknown);
    };
    // The newest grant settles, also after its last append gave the lease
    // up; a takeover grants a newer token and fences the old one.
    if last_token != int(settle.token) {
        return Ok(SettleOutcome::Fenced);
    }
    if column::<bool>(&stored, 0)? {
        return Ok(SettleOutcome::AlreadySettled);
    }
    execute(
        &tx,
        "UPDATE baton_inbox SET outcome = $3 WHERE tree = $1 AND id = $2",
        &[&key, &settle.id.as_str(), &settle.outcome.as_str()],
    )
    .await
    .map_err(storage)?;
    notify(&tx, settle.tree).await?;
    tx.commit().await.map_err(storage)?;
    Ok(SettleOutcome::Settled)
}

async fn notify(tx: &impl GenericClient, tree: TreeId) -> Result<(), StoreError> {
    execute(tx, "SELECT pg_notify($1, $2)", &[&CHANNEL, &notice(tree)])
        .await
        .map_err(storage)?;
    Ok(())
}

const SELECT: &str = "SELECT t.id, i.id, i.body, i.posted, i.outcome
     FROM baton_inbox i JOIN baton_trees t ON t.key = i.tree";

fn decode(row: &Row) -> Result<Posted, StoreError> {
    let tree: String = column(row, 0)?;
    let tree = TreeId::from_str(&tree)
        .map_err(|error| corrupt(format!("inbox: tree id {tree:?}: {error}")))?;
    let id = MessageId::new(column::<String>(row, 1)?)
        .map_err(|error| corrupt(format!("inbox: {error}")))?;
    let payload = |text: String, what: &str| {
        Payload::parse_str(&text)
            .map_err(|error| corrupt(format!("inbox message {id}: its {what}: {error}")))
    };
    let body = payload(column(row, 2)?, "body")?;
    let outcome = column::<Option<String>>(row, 4)?
        .map(|text| payload(text, "outcome"))
        .transpose()?;
    Ok(Posted {
        message: Message {
            tree,
            id: id.clone(),
            body,
            posted: Timestamp(uint(column(row, 3)?)?),
        },
        outcome,
    })
}

async fn pending(pool: &Pool, tree: Option<TreeId>) -> Result<Vec<Message>, StoreError> {
    let client = pool.get().await.map_err(pool_error)?;
    let rows = match tree {
        Some(tree) => {
            query(
                &client,
                &format!("{SELECT} WHERE t.id = $1 AND i.outcome IS NULL ORDER BY i.seq"),
                &[&tree.to_string()],
            )
            .await
        }
        None => {
            query(
                &client,
                &format!("{SELECT} WHERE i.outcome IS NULL ORDER BY i.seq"),
                &[],
            )
            .await
        }
    }
    .map_err(storage)?;
    rows.iter()
        .map(|row| decode(row).map(|posted| posted.message))
        .collect()
}

async fn message(pool: &Pool, tree: TreeId, id: &MessageId) -> Result<Option<Posted>, StoreError> {
    let client = pool.get().await.map_err(pool_error)?;
    let row = query_opt(
        &client,
        &format!("{SELECT} WHERE t.id = $1 AND i.id = $2"),
        &[&tree.to_string(), &id.as_str()],
    )
    .await
    .map_err(storage)?;
    row.as_ref().map(decode).transpose()
}
