//! `store_conformance`: the contract every `Store` must keep.

use std::sync::Arc;
use std::time::Duration;

use baton_run::dispatch::ReplayPolicy;
use baton_run::log::{Record, RecordBody, RecordKind, Snapshot, verify};
use baton_run::program::Purpose;
use baton_run::program::{
    Definition, Descriptor, Effect, Execution, ExecutionState, ProgramConfig, Schema, Signal,
    SignalBody, StepError, Transition, configuration_digest, implementation_digest,
};
use baton_run::store::{
    AcquireRequest, Acquired, Append, AppendOutcome, Change, CreateTree, Created, Lease,
    ListCursor, ListFilter, Store, StoreError, TreeLoad, TreeMeta, TreeStatus,
};
use baton_run::{
    Digest, EffectId, Engine, EngineConfig, Labels, ManualClock, Name, Payload, ProcessId, Program,
    ProgramVersion, RecoverOptions, RuntimeError, Scope, Settlement, StartId, StartRequest, Status,
    Timestamp, TreeId, TreeView, Visibility,
};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::{Cut, FaultStore, ScriptedDispatcher};

/// Checks a store implementation against the kernel's storage contract,
/// panicking with a precise message at the first violation. `factory`
/// makes a fresh, empty store; every case gets its own.
///
/// Cases:
/// - **round trip**: appended records (small and a 300 KB one) load back
///   byte for byte with their metadata and verify as a chain;
/// - **create a tree**: a new tree's first commit stores its records and
///   metadata and grants a lease with a newer token, kept or given up in
///   the same commit (then another writer takes the tree at once and the
///   create's token is fenced); a tree with records is `Exists` and a live
///   lease of someone else `LeaseHeld`, with nothing written; once that
///   lease ran out the create takes the tree and fences its holder;
///   malformed records are refused;
/// - **compare-and-swap**: a gap, a wrong `prev` or different content at a
///   committed sequence is a `Conflict` carrying the head; nothing changes;
/// - **idempotent retry**: an acknowledged append sent again is a
///   `Duplicate`, also after later appends;
/// - **racing writers**: concurrent acquires by different owners grant
///   exactly one lease; concurrent appends at the same sequence commit
///   exactly one;
/// - **fencing**: after a forced or an expired takeover the old token's
///   appends, snapshots and renewals are refused and its release is a
///   no-op; a released lease is free;
/// - **snapshots**: a snapshot must name a point of the chain; the load
///   then holds it and only the records after it, which verify from its
///   head; an engine with frequent snapshots recovers and verifies;
/// - **release with the last append**: an append marked `release` gives
///   up the lease in its commit;
/// - **listing** by status and scope, sorted by tree id, without trees that
///   have no records;
/// - **labels**: a tree's program version, labels and start time load and
///   list back as appended; a listing selects the trees carrying every
///   label asked for, with status and scope filters too;
/// - **paging**: a long listing read a page at a time (with and without a
///   filter) lists every tree once, in order, also while trees are added
///   between pages, and the last page has no next cursor;
/// - **engine listing**: trees an engine starts with labels list with their
///   program's exact version, their labels and their start time through
///   every later append and lease release; a second start of the same id
///   with other labels keeps the first labels;
/// - **inbox**: a message posts once by id (another body under its id is a
///   conflict), a tree without records takes none, pending messages list in
///   post order, a settlement is fenced by the newest lease token (also
///   after that lease was released) and the first outcome stands;
/// - **notices**: a store that sends change notices tells a subscriber of
///   an append, a post and a settlement;
/// - **answers across engines** ([`answer_across_engines`](crate::answer_across_engines)
///   on one handle): an answer given through one engine for a tree another
///   engine holds is applied by the holder; a holder that never applies
///   makes it time out queued, and the next holder applies it;
/// - **crash matrix**: with a real engine and a [`FaultStore`] cutting the
///   store before and after the first commit of each record kind of a
///   one-dispatch program (a root that acts in its first round is created
///   with its start alone), recovery on the same store shows the guaranteed
///   behaviour: a `Never` dispatch is sent at most once, an uncertain one
///   is surfaced as unknown and resolvable, a settled one is not sent again.
pub async fn store_conformance<S: Store>(factory: impl Fn() -> S) {
    let fresh = || -> Arc<dyn Store> { Arc::new(factory()) };
    round_trip(fresh()).await;
    create_tree(fresh()).await;
    compare_and_swap(fresh()).await;
    idempotent_retry(fresh()).await;
    racing_writers(fresh()).await;
    fencing(fresh()).await;
    snapshots(fresh()).await;
    large_bodies(fresh()).await;
    engine_snapshots(fresh()).await;
    listing(fresh()).await;
    labels(fresh()).await;
    paging(fresh()).await;
    engine_listing(fresh()).await;
    crate::inbox::inbox(fresh()).await;
    crate::inbox::notices(fresh()).await;
    let shared = fresh();
    crate::inbox::answer_across_engines(shared.clone(), shared).await;
    crash_matrix(&fresh).await;
}

const SCOPE: &str = "conformance";

fn tree(key: &str) -> TreeId {
    ProcessId::root(&StartId::new(SCOPE, key).expect("valid start id"))
}

fn acquire(tree: TreeId, owner: &str, now: u64, force: bool) -> AcquireRequest {
    AcquireRequest {
        tree,
        owner: owner.into(),
        now: Timestamp(now),
        ttl: Duration::from_millis(1_000),
        force,
    }
}

async fn granted(store: &dyn Store, request: AcquireRequest, case: &str) -> (Lease, TreeLoad) {
    let owner = request.owner.clone();
    match store.acquire(request).await {
        Ok(Acquired::Granted { lease, load }) => {
            assert_eq!(lease.owner, owner, "{case}: the lease names its owner");
            (lease, load)
        }
        other => panic!("{case}: expected a granted lease for {owner}, got {other:?}"),
    }
}

fn meta(tree: TreeId, scope: &str, status: TreeStatus, updated: u64) -> TreeMeta {
    TreeMeta::new(
        tree,
        Scope::new(scope).expect("valid scope"),
        status,
        Timestamp(updated),
    )
}

/// A valid record whose body carries `content` (so sizes can vary).
/// The first record of a test tree (for the inbox cases).
pub(crate) fn first_record(tree: TreeId) -> Record {
    record(tree, 1, Digest::ZERO, "first")
}

fn record(tree: TreeId, seq: u64, prev: Digest, content: &str) -> Record {
    let body = RecordBody::EffectSettled {
        process: tree,
        effect: EffectId::new(tree, seq, 0),
        settlement: Settlement::ok(Payload::encode(content).expect("encodes")),
    };
    Record::seal(seq, prev, &body)
}

/// `count` chained records after `(seq, prev)`.
fn chain(tree: TreeId, after: (u64, Digest), count: u64, tag: &str) -> Vec<Record> {
    let (mut seq, mut prev) = after;
    (0..count)
        .map(|_| {
            seq += 1;
            let record = record(tree, seq, prev, &format!("{tag} {seq}"));
            prev = record.hash;
            record
        })
        .collect()
}

fn append(tree: TreeId, token: u64, records: Vec<Record>) -> Append {
    Append {
        tree,
        token,
        records,
        meta: meta(tree, SCOPE, TreeStatus::Running, 7),
        release: false,
    }
}

async fn one(store: &dyn Store, item: Append, case: &str) -> AppendOutcome {
    let outcomes = store
        .append(vec![item])
        .await
        .unwrap_or_else(|error| panic!("{case}: append failed: {error}"));
    assert_eq!(outcomes.len(), 1, "{case}: one outcome per append");
    outcomes[0]
}

async fn load(store: &dyn Store, tree: TreeId, case: &str) -> TreeLoad {
    store
        .load(tree)
        .await
        .unwrap_or_else(|error| panic!("{case}: load failed: {error}"))
}

fn same_records(actual: &[Record], expected: &[Record], case: &str) {
    assert_eq!(
        actual.len(),
        expected.len(),
        "{case}: number of stored records"
    );
    for (a, e) in actual.iter().zip(expected) {
        assert_eq!(
            (a.seq, a.prev, a.hash, a.kind),
            (e.seq, e.prev, e.hash, e.kind),
            "{case}: record {} header",
            e.seq
        );
        assert!(
            a.body[..] == e.body[..],
            "{case}: record {} body is not byte-exact ({} vs {} bytes)",
            e.seq,
            a.body.len(),
            e.body.len()
        );
    }
}

async fn round_trip(store: Arc<dyn Store>) {
    let case = "round trip";
    let t = tree("round-trip");
    let empty = load(&*store, t, case).await;
    assert!(!empty.exists(), "{case}: an unknown tree loads empty");
    let (lease, load0) = granted(&*store, acquire(t, "a", 0, false), case).await;
    assert!(!load0.exists(), "{case}: a new tree has no records");
    assert_eq!(load0.head(), (0, Digest::ZERO), "{case}: empty head");

    let mut records = chain(t, (0, Digest::ZERO), 2, "small");
    // A large, mostly repetitive body exercises any chunking or dedupe.
    let big: String = (0..300_000u32)
        .map(|i| char::from(b'a' + (i.wrapping_mul(2_654_435_761) >> 27) as u8 % 26))
        .collect();
    let large = record(t, 3, records[1].hash, &big);
    records.push(large);
    let more = chain(t, (3, records[2].hash), 2, "tail");
    records.extend(more);
    assert_eq!(
        one(&*store, append(t, lease.token, records[..2].to_vec()), case).await,
        AppendOutcome::Committed,
        "{case}: first append"
    );
    let mut last = append(t, lease.token, records[2..].to_vec());
    last.meta = meta(t, SCOPE, TreeStatus::Waiting, 42);
    assert_eq!(
        one(&*store, last, case).await,
        AppendOutcome::Committed,
        "{case}: second append"
    );
    let loaded = load(&*store, t, case).await;
    same_records(&loaded.records, &records, case);
    assert_eq!(
        loaded.meta,
        Some(meta(t, SCOPE, TreeStatus::Waiting, 42)),
        "{case}: metadata is the last append's"
    );
    assert!(loaded.snapshot.is_none(), "{case}: no snapshot was written");
    let head = verify(0, Digest::ZERO, &loaded.records)
        .unwrap_or_else(|error| panic!("{case}: the stored chain does not verify: {error}"));
    assert_eq!(head, (5, records[4].hash), "{case}: verified head");
    assert_eq!(loaded.head(), head, "{case}: load head");
    if let Some(recorded) = loaded.recorded_head {
        assert_eq!(
            recorded, head,
            "{case}: the recorded head is the last append's"
        );
    }
    let whole = store
        .history(t)
        .await
        .unwrap_or_else(|error| panic!("{case}: history failed: {error}"));
    same_records(&whole.records, &records, case);
    // A grant (after the lease ran out) returns the same stored state.
    let (_, reload) = granted(&*store, acquire(t, "a", 1_010, false), case).await;
    same_records(&reload.records, &records, case);
}

fn create(tree: TreeId, owner: &str, now: u64, records: Vec<Record>, hold: bool) -> CreateTree {
    CreateTree {
        tree,
        owner: owner.into(),
        now: Timestamp(now),
        ttl: Duration::from_millis(1_000),
        records,
        meta: meta(tree, SCOPE, TreeStatus::Done, now),
        hold,
    }
}

async fn created(store: &dyn Store, request: CreateTree, case: &str) -> Created {
    store
        .create_tree(request)
        .await
        .unwrap_or_else(|error| panic!("{case}: create_tree failed: {error}"))
}

/// A create the store must commit: its lease.
async fn committed(store: &dyn Store, request: CreateTree, case: &str) -> Lease {
    match created(store, request, case).await {
        Created::Committed(lease) => lease,
        other => panic!("{case}: expected a commit, got {other:?}"),
    }
}

async fn create_tree(store: Arc<dyn Store>) {
    let case = "create a tree, releasing";
    let done = tree("create-done");
    let records = chain(done, (0, Digest::ZERO), 3, "first round");
    let mut changes = store.changes().await.expect("subscribes");
    let lease = committed(&*store, create(done, "a", 10, records.clone(), false), case).await;
    assert_eq!(lease.owner, "a", "{case}: the grant names its owner");
    let loaded = load(&*store, done, case).await;
    same_records(&loaded.records, &records, case);
    assert_eq!(
        loaded.meta,
        Some(meta(done, SCOPE, TreeStatus::Done, 10)),
        "{case}: the metadata is the create's"
    );
    assert_eq!(loaded.head(), (3, records[2].hash), "{case}: head");
    if let Some(changes) = changes.as_mut() {
        crate::inbox::noticed(changes, Change::Tree(done), "a new tree").await;
    }
    // The lease was given up in the same commit: another writer takes the
    // tree at once, with a newer token, and the create's token is fenced.
    let (next, reload) = granted(&*store, acquire(done, "b", 11, false), case).await;
    assert!(next.token > lease.token, "{case}: tokens increase");
    same_records(&reload.records, &records, case);
    let late = append(
        done,
        lease.token,
        chain(done, (3, records[2].hash), 1, "late"),
    );
    assert_eq!(
        one(&*store, late, case).await,
        AppendOutcome::Fenced,
        "{case}: the create's token no longer writes"
    );

    let case = "create a tree, holding";
    let held = tree("create-held");
    let records = chain(held, (0, Digest::ZERO), 2, "first round");
    let lease = committed(&*store, create(held, "a", 10, records.clone(), true), case).await;
    assert_eq!(
        lease.until,
        Timestamp(1_010),
        "{case}: the lease runs for its ttl"
    );
    match store.acquire(acquire(held, "b", 20, false)).await {
        Ok(Acquired::LeaseHeld { owner, until }) => {
            assert_eq!((owner.as_str(), until), ("a", lease.until), "{case}: held");
        }
        other => panic!("{case}: the held lease must refuse b, got {other:?}"),
    }
    let more = chain(held, (2, records[1].hash), 1, "second round");
    assert_eq!(
        one(&*store, append(held, lease.token, more), case).await,
        AppendOutcome::Committed,
        "{case}: the holder appends with the create's token"
    );

    let case = "create an existing tree";
    let again = chain(held, (0, Digest::ZERO), 1, "another start");
    assert_eq!(
        created(&*store, create(held, "c", 5_000, again, false), case).await,
        Created::Exists,
        "{case}"
    );
    assert_eq!(
        load(&*store, held, case).await.head().0,
        3,
        "{case}: untouched"
    );

    let case = "create under someone's lease";
    let racing = tree("create-racing");
    let (other, _) = granted(&*store, acquire(racing, "other", 100, false), case).await;
    let records = chain(racing, (0, Digest::ZERO), 1, "start");
    assert_eq!(
        created(
            &*store,
            create(racing, "a", 200, records.clone(), false),
            case
        )
        .await,
        Created::LeaseHeld {
            owner: "other".into(),
            until: other.until
        },
        "{case}"
    );
    assert!(
        !load(&*store, racing, case).await.exists(),
        "{case}: nothing written"
    );
    // Once that lease ran out, the create takes the tree and fences it.
    // (expected to commit once that lease ran out)
    let lease = committed(
        &*store,
        create(racing, "a", 1_200, records.clone(), false),
        case,
    )
    .await;
    assert!(lease.token > other.token, "{case}: a newer token");
    let stale = append(
        racing,
        other.token,
        chain(racing, (1, records[0].hash), 1, "stale"),
    );
    assert_eq!(
        one(&*store, stale, case).await,
        AppendOutcome::Fenced,
        "{case}: the expired holder is fenced"
    );

    let case = "create with malformed records";
    let bad = tree("create-bad");
    let orphan = chain(bad, (1, Digest::ZERO), 1, "no start");
    for (what, records) in [("no record", Vec::new()), ("not from 1", orphan)] {
        let refused = store
            .create_tree(create(bad, "a", 10, records, false))
            .await;
        assert!(
            matches!(refused, Err(StoreError::Refused { .. })),
            "{case}: {what}: {refused:?}"
        );
    }
    assert!(
        !load(&*store, bad, case).await.exists(),
        "{case}: nothing written"
    );
    let listed = list_all(&*store, ListFilter::default(), case).await;
    assert!(
        listed.iter().all(|meta| meta.tree != bad),
        "{case}: no listing row for a refused create"
    );
}

async fn compare_and_swap(store: Arc<dyn Store>) {
    let case = "compare-and-swap";
    let t = tree("cas");
    let (lease, _) = granted(&*store, acquire(t, "a", 0, false), case).await;
    let records = chain(t, (0, Digest::ZERO), 2, "cas");
    assert_eq!(
        one(&*store, append(t, lease.token, records.clone()), case).await,
        AppendOutcome::Committed
    );
    let other = chain(t, (0, Digest::ZERO), 1, "other");
    assert_eq!(
        one(&*store, append(t, lease.token, other), case).await,
        AppendOutcome::Conflict { head: 2 },
        "{case}: different content at a committed sequence"
    );
    let gap = record(t, 4, records[1].hash, "gap");
    assert_eq!(
        one(&*store, append(t, lease.token, vec![gap]), case).await,
        AppendOutcome::Conflict { head: 2 },
        "{case}: a gap after the head"
    );
    let wrong_prev = record(t, 3, Digest::ZERO, "wrong prev");
    assert_eq!(
        one(&*store, append(t, lease.token, vec![wrong_prev]), case).await,
        AppendOutcome::Conflict { head: 2 },
        "{case}: a prev that is not the head's hash"
    );
    let partly = vec![records[1].clone(), record(t, 3, records[1].hash, "new")];
    assert_eq!(
        one(&*store, append(t, lease.token, partly), case).await,
        AppendOutcome::Conflict { head: 2 },
        "{case}: a batch overlapping the head is not a duplicate"
    );
    same_records(&load(&*store, t, case).await.records, &records, case);
    // Items of one batch are atomic on their own and answered in order.
    let next = chain(t, (2, records[1].hash), 1, "next");
    let outcomes = store
        .append(vec![
            append(t, lease.token, chain(t, (0, Digest::ZERO), 1, "stale")),
            append(t, lease.token, next.clone()),
            append(
                tree("cas-unknown"),
                lease.token,
                chain(t, (0, Digest::ZERO), 1, "x"),
            ),
        ])
        .await
        .unwrap_or_else(|error| panic!("{case}: batch append failed: {error}"));
    assert_eq!(
        outcomes,
        [
            AppendOutcome::Conflict { head: 2 },
            AppendOutcome::Committed,
            AppendOutcome::Fenced
        ],
        "{case}: batch outcomes in order (an unacquired tree is fenced)"
    );
    assert_eq!(load(&*store, t, case).await.head(), (3, next[0].hash));
}

async fn idempotent_retry(store: Arc<dyn Store>) {
    let case = "idempotent retry";
    let t = tree("retry");
    let (lease, _) = granted(&*store, acquire(t, "a", 0, false), case).await;
    let first = chain(t, (0, Digest::ZERO), 2, "retry");
    assert_eq!(
        one(&*store, append(t, lease.token, first.clone()), case).await,
        AppendOutcome::Committed
    );
    assert_eq!(
        one(&*store, append(t, lease.token, first.clone()), case).await,
        AppendOutcome::Duplicate,
        "{case}: the same append again"
    );
    let second = chain(t, (2, first[1].hash), 1, "retry");
    assert_eq!(
        one(&*store, append(t, lease.token, second.clone()), case).await,
        AppendOutcome::Committed
    );
    assert_eq!(
        one(&*store, append(t, lease.token, first.clone()), case).await,
        AppendOutcome::Duplicate,
        "{case}: an older acknowledged append after later ones"
    );
    let mut all = first;
    all.extend(second);
    same_records(&load(&*store, t, case).await.records, &all, case);
}

async fn racing_writers(store: Arc<dyn Store>) {
    let case = "racing writers";
    let t = tree("race");
    let acquires: Vec<_> = (0..8)
        .map(|n| {
            let store = store.clone();
            tokio::spawn(async move { store.acquire(acquire(t, &format!("w{n}"), 0, false)).await })
        })
        .collect();
    let mut winners = Vec::new();
    for task in acquires {
        match task.await.expect("task runs") {
            Ok(Acquired::Granted { lease, .. }) => winners.push(lease),
            Ok(Acquired::LeaseHeld { until, .. }) => {
                assert_eq!(until, Timestamp(1_000), "{case}: the live lease's expiry");
            }
            Err(error) => panic!("{case}: acquire failed: {error}"),
        }
    }
    assert_eq!(winners.len(), 1, "{case}: exactly one acquire wins");
    let token = winners[0].token;
    let appends: Vec<_> = (0..8)
        .map(|n| {
            let store = store.clone();
            let records = chain(t, (0, Digest::ZERO), 1, &format!("racer {n}"));
            let item = append(t, token, records.clone());
            tokio::spawn(async move { (records, store.append(vec![item]).await) })
        })
        .collect();
    let mut committed = Vec::new();
    for task in appends {
        let (records, outcome) = task.await.expect("task runs");
        match outcome.unwrap_or_else(|error| panic!("{case}: append failed: {error}"))[..] {
            [AppendOutcome::Committed] => committed.push(records),
            [AppendOutcome::Conflict { head: 1 }] => {}
            ref other => panic!("{case}: unexpected outcome {other:?}"),
        }
    }
    assert_eq!(
        committed.len(),
        1,
        "{case}: exactly one append at seq 1 wins"
    );
    same_records(&load(&*store, t, case).await.records, &committed[0], case);
}

async fn fencing(store: Arc<dyn Store>) {
    let case = "fencing";
    let t = tree("fence");
    let (a, _) = granted(&*store, acquire(t, "a", 0, false), case).await;
    let first = chain(t, (0, Digest::ZERO), 1, "a");
    assert_eq!(
        one(&*store, append(t, a.token, first.clone()), case).await,
        AppendOutcome::Committed
    );
    match store.acquire(acquire(t, "b", 500, false)).await {
        Ok(Acquired::LeaseHeld { owner, until }) => {
            assert_eq!(
                (owner.as_str(), until),
                ("a", Timestamp(1_000)),
                "{case}: holder"
            );
        }
        other => panic!("{case}: a live lease must be reported held, got {other:?}"),
    }
    // The holder may renew; a forced takeover fences it.
    assert!(
        store
            .renew(t, a.token, Timestamp(1_500))
            .await
            .expect("renews"),
        "{case}: the current writer renews"
    );
    let (b, load_b) = granted(&*store, acquire(t, "b", 600, true), case).await;
    assert!(b.token > a.token, "{case}: fencing tokens increase");
    same_records(&load_b.records, &first, case);
    let second = chain(t, (1, first[0].hash), 1, "second");
    assert_eq!(
        one(&*store, append(t, a.token, second.clone()), case).await,
        AppendOutcome::Fenced,
        "{case}: the old writer after a forced takeover"
    );
    let snapshot = Snapshot {
        seq: 1,
        head: first[0].hash,
        state: Arc::from(&b"{}"[..]),
    };
    assert_eq!(
        store
            .write_snapshot(t, a.token, snapshot)
            .await
            .expect("snapshot call"),
        AppendOutcome::Fenced,
        "{case}: a snapshot by the old writer"
    );
    assert!(
        !store
            .renew(t, a.token, Timestamp(9_000))
            .await
            .expect("renew call"),
        "{case}: the old writer cannot renew"
    );
    store.release(t, a.token).await.expect("release call");
    match store.acquire(acquire(t, "c", 700, false)).await {
        Ok(Acquired::LeaseHeld { owner, .. }) => {
            assert_eq!(owner, "b", "{case}: a stale release leaves the lease")
        }
        other => panic!("{case}: expected b's lease to hold, got {other:?}"),
    }
    assert_eq!(
        one(&*store, append(t, b.token, second.clone()), case).await,
        AppendOutcome::Committed,
        "{case}: the new writer appends"
    );
    // An expired lease lets a new writer in without force.
    let (c, _) = granted(&*store, acquire(t, "c", 1_700, false), case).await;
    assert!(c.token > b.token, "{case}: fencing tokens increase");
    let third = chain(t, (2, second[0].hash), 1, "third");
    assert_eq!(
        one(&*store, append(t, b.token, third.clone()), case).await,
        AppendOutcome::Fenced,
        "{case}: the old writer after an expired takeover"
    );
    // The same owner asking again without force is refused like anyone
    // else: a live lease is never granted twice, so a writer cannot fence
    // itself. With force it gets a new token that fences the old one.
    match store.acquire(acquire(t, "c", 1_800, false)).await {
        Ok(Acquired::LeaseHeld { owner, .. }) => {
            assert_eq!(owner, "c", "{case}: the holder is named");
        }
        other => panic!("{case}: a live lease was granted again to its owner: {other:?}"),
    }
    let (c2, _) = granted(&*store, acquire(t, "c", 1_800, true), case).await;
    assert!(c2.token > c.token, "{case}: re-acquiring mints a new token");
    assert_eq!(
        one(&*store, append(t, c.token, third.clone()), case).await,
        AppendOutcome::Fenced,
        "{case}: a token replaced by its own owner"
    );
    // A released lease is free for anyone.
    store.release(t, c2.token).await.expect("release call");
    let (d, _) = granted(&*store, acquire(t, "d", 1_900, false), case).await;
    assert_eq!(
        one(&*store, append(t, d.token, third.clone()), case).await,
        AppendOutcome::Committed
    );
    assert_eq!(load(&*store, t, case).await.head().0, 3);
    // A last append gives up the lease in the same commit: the next writer
    // gets in before the lease would have expired, and fences the old token.
    let (e, _) = granted(&*store, acquire(t, "e", 3_000, false), case).await;
    let last = Append {
        release: true,
        ..append(t, e.token, chain(t, (3, third[0].hash), 1, "last"))
    };
    let retry = Append {
        release: true,
        ..append(t, e.token, last.records.clone())
    };
    assert_eq!(one(&*store, last, case).await, AppendOutcome::Committed);
    let (f, load_f) = granted(&*store, acquire(t, "f", 3_100, false), case).await;
    assert!(f.token > e.token, "{case}: fencing tokens increase");
    assert_eq!(
        load_f.head().0,
        4,
        "{case}: the releasing append is durable"
    );
    assert_eq!(
        one(&*store, retry, case).await,
        AppendOutcome::Fenced,
        "{case}: a released token is no longer current"
    );
}

async fn snapshots(store: Arc<dyn Store>) {
    let case = "snapshots";
    let t = tree("snapshot");
    let (lease, _) = granted(&*store, acquire(t, "a", 0, false), case).await;
    let records = chain(t, (0, Digest::ZERO), 5, "snap");
    assert_eq!(
        one(&*store, append(t, lease.token, records.clone()), case).await,
        AppendOutcome::Committed
    );
    let state: Arc<[u8]> =
        Arc::from(format!("{{\"state\":\"{}\"}}", "s".repeat(20_000)).as_bytes());
    let at = |seq: u64, head: Digest| Snapshot {
        seq,
        head,
        state: state.clone(),
    };
    let write = |snapshot: Snapshot| {
        let store = store.clone();
        async move {
            store
                .write_snapshot(t, lease.token, snapshot)
                .await
                .unwrap_or_else(|error| panic!("{case}: write_snapshot failed: {error}"))
        }
    };
    assert_eq!(
        write(at(3, records[1].hash)).await,
        AppendOutcome::Conflict { head: 5 },
        "{case}: a head that is not the covered record's hash"
    );
    assert_eq!(
        write(at(6, records[4].hash)).await,
        AppendOutcome::Conflict { head: 5 },
        "{case}: a snapshot past the head"
    );
    assert_eq!(
        write(at(3, records[2].hash)).await,
        AppendOutcome::Committed,
        "{case}: a snapshot of seq 3"
    );
    let loaded = load(&*store, t, case).await;
    let snapshot = loaded
        .snapshot
        .clone()
        .unwrap_or_else(|| panic!("{case}: the snapshot is loaded"));
    assert_eq!((snapshot.seq, snapshot.head), (3, records[2].hash));
    assert!(
        snapshot.state[..] == state[..],
        "{case}: the snapshot state is byte-exact"
    );
    assert!(
        loaded.records.iter().all(|r| r.seq > 3),
        "{case}: the load holds only records after the snapshot"
    );
    same_records(&loaded.records, &records[3..], case);
    assert_eq!(
        verify(snapshot.seq, snapshot.head, &loaded.records),
        Ok((5, records[4].hash)),
        "{case}: the tail verifies from the snapshot head"
    );
    // The chain goes on after compaction, and a later snapshot replaces it.
    let more = chain(t, (5, records[4].hash), 2, "more");
    assert_eq!(
        one(&*store, append(t, lease.token, more.clone()), case).await,
        AppendOutcome::Committed
    );
    assert_eq!(
        write(at(7, more[1].hash)).await,
        AppendOutcome::Committed,
        "{case}: a snapshot at the head"
    );
    let loaded = load(&*store, t, case).await;
    assert_eq!(loaded.snapshot.as_ref().map(|s| s.seq), Some(7));
    assert!(loaded.records.is_empty(), "{case}: nothing after the head");
    assert_eq!(
        loaded.head(),
        (7, more[1].hash),
        "{case}: head from the snapshot"
    );
    let next = chain(t, (7, more[1].hash), 1, "next");
    assert_eq!(
        one(&*store, append(t, lease.token, next.clone()), case).await,
        AppendOutcome::Committed,
        "{case}: appending after a snapshot at the head"
    );
    let loaded = load(&*store, t, case).await;
    same_records(&loaded.records, &next, case);
}

/// Seeded, incompressible bytes as hex text, `len` bytes of it: content
/// no other seed repeats, for tests of how stores keep long bodies.
pub fn noise(len: usize, seed: u64) -> String {
    let mut state = seed;
    (0..len / 2)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            format!("{:02x}", (state >> 32) as u8)
        })
        .collect()
}

/// Long bodies, which stores may keep in pieces and find again: a tree
/// whose bodies take turns between two kinds (a state edited a little at
/// each step, then an unrelated settlement-sized body), with a large
/// snapshot that compacts in between. Record 6 repeats record 3's state,
/// whose piece around the fifth step's edit only the compacted records 3
/// and 4 held: a store that reused a piece of a compacted record would not
/// read back. Then two large snapshots of another tree queued together (a
/// store may commit them in one transaction, the second after the first's
/// compaction). Every body and snapshot reads back byte for byte, and the
/// tails verify from the snapshots.
async fn large_bodies(store: Arc<dyn Store>) {
    let case = "large bodies";
    let t = tree("large");
    let (lease, _) = granted(&*store, acquire(t, "a", 0, false), case).await;
    let mut state = noise(150_000, 31);
    let mut states: Vec<String> = Vec::new();
    let (mut head, mut written, mut snapshot_state) = (Digest::ZERO, Vec::new(), None);
    for seq in 1..=11u64 {
        let body = if seq == 6 {
            states[1].clone()
        } else if seq % 2 == 1 {
            state.insert_str(seq as usize * 1000, &format!("step {seq};"));
            states.push(state.clone());
            state.clone()
        } else {
            noise(12_000, 40 + seq % 4)
        };
        let next = record(t, seq, head, &body);
        head = next.hash;
        assert_eq!(
            one(&*store, append(t, lease.token, vec![next.clone()]), case).await,
            AppendOutcome::Committed,
            "{case}: record {seq}"
        );
        written.push(next);
        if seq == 5 {
            // Shares most of its pieces with the state just recorded.
            let bytes: Arc<[u8]> = Arc::from(format!("{{\"state\":\"{state}\"}}").into_bytes());
            let snapshot = Snapshot {
                seq,
                head,
                state: Arc::clone(&bytes),
            };
            assert_eq!(
                store.write_snapshot(t, lease.token, snapshot).await,
                Ok(AppendOutcome::Committed),
                "{case}: the snapshot"
            );
            snapshot_state = Some(bytes);
        }
    }
    let loaded = load(&*store, t, case).await;
    let snapshot = loaded
        .snapshot
        .clone()
        .unwrap_or_else(|| panic!("{case}: the snapshot is loaded"));
    assert!(
        snapshot.seq == 5 && Some(&snapshot.state) == snapshot_state.as_ref(),
        "{case}: the snapshot state is byte-exact"
    );
    same_records(&loaded.records, &written[5..], case);
    assert_eq!(
        verify(snapshot.seq, snapshot.head, &loaded.records),
        Ok((11, head)),
        "{case}: the tail verifies from the snapshot head"
    );

    // Two states, then two snapshots at the head queued together: the
    // first with the second record's state, the second with the first's,
    // whose pieces only the first snapshot's compaction deleted.
    let u = tree("large-twice");
    let (lease, _) = granted(&*store, acquire(u, "a", 0, false), case).await;
    let first = record(u, 1, Digest::ZERO, &noise(200_000, 51));
    let second = record(u, 2, first.hash, &noise(200_000, 52));
    assert_eq!(
        one(
            &*store,
            append(u, lease.token, vec![first.clone(), second.clone()]),
            case
        )
        .await,
        AppendOutcome::Committed,
        "{case}: two states"
    );
    let at = |body: &Arc<[u8]>| Snapshot {
        seq: 2,
        head: second.hash,
        state: Arc::clone(body),
    };
    let queued = (
        store.write_snapshot(u, lease.token, at(&second.body)),
        store.write_snapshot(u, lease.token, at(&first.body)),
    );
    assert_eq!(
        queued.0.await,
        Ok(AppendOutcome::Committed),
        "{case}: the first of two snapshots"
    );
    assert_eq!(
        queued.1.await,
        Ok(AppendOutcome::Committed),
        "{case}: the second of two snapshots"
    );
    let loaded = load(&*store, u, case).await;
    let snapshot = loaded
        .snapshot
        .clone()
        .unwrap_or_else(|| panic!("{case}: the second snapshot is loaded"));
    assert!(
        snapshot.seq == 2 && snapshot.state[..] == first.body[..],
        "{case}: the second snapshot's state is byte-exact"
    );
    assert!(loaded.records.is_empty(), "{case}: nothing after the head");
}

async fn listing(store: Arc<dyn Store>) {
    let case = "listing";
    let entries = [
        ("l1", "acme", TreeStatus::Running),
        ("l2", "acme", TreeStatus::Done),
        ("l3", "other", TreeStatus::Done),
        ("l4", "other", TreeStatus::NeedsAttention),
        ("l5", "acme", TreeStatus::Waiting),
    ];
    for (n, (key, scope, status)) in entries.iter().enumerate() {
        let t = tree(key);
        let (lease, _) = granted(&*store, acquire(t, "a", 0, false), case).await;
        let mut item = append(t, lease.token, chain(t, (0, Digest::ZERO), 1, key));
        item.meta = meta(t, scope, *status, n as u64);
        assert_eq!(one(&*store, item, case).await, AppendOutcome::Committed);
    }
    // Acquired but never appended: not listed.
    granted(&*store, acquire(tree("l6"), "a", 0, false), case).await;
    let list = |status: Option<TreeStatus>, scope: Option<&str>| {
        let store = store.clone();
        let filter = ListFilter {
            status,
            scope: scope.map(|s| Scope::new(s).expect("valid scope")),
            ..ListFilter::default()
        };
        async move {
            let listing = store
                .list(filter)
                .await
                .unwrap_or_else(|error| panic!("{case}: list failed: {error}"));
            assert!(
                listing.unreadable.is_empty(),
                "{case}: no row is unreadable: {:?}",
                listing.unreadable
            );
            listing.trees
        }
    };
    let expected = |pick: &dyn Fn(&str, TreeStatus) -> bool| {
        let mut metas: Vec<TreeMeta> = entries
            .iter()
            .enumerate()
            .filter(|(_, (_, scope, status))| pick(scope, *status))
            .map(|(n, (key, scope, status))| meta(tree(key), scope, *status, n as u64))
            .collect();
        metas.sort_by_key(|m| m.tree);
        metas
    };
    assert_eq!(
        list(None, None).await,
        expected(&|_, _| true),
        "{case}: all"
    );
    assert_eq!(
        list(Some(TreeStatus::Done), None).await,
        expected(&|_, s| s == TreeStatus::Done),
        "{case}: by status"
    );
    assert_eq!(
        list(None, Some("acme")).await,
        expected(&|scope, _| scope == "acme"),
        "{case}: by scope"
    );
    assert_eq!(
        list(Some(TreeStatus::Done), Some("other")).await,
        expected(&|scope, s| scope == "other" && s == TreeStatus::Done),
        "{case}: by status and scope"
    );
    assert!(
        list(Some(TreeStatus::Running), Some("nobody"))
            .await
            .is_empty(),
        "{case}: an empty match"
    );
}

fn labels_of(pairs: &[(&str, &str)]) -> Labels {
    Labels::from_pairs(pairs.iter().copied()).expect("valid labels")
}

/// Listing metadata carrying a program version, labels and a start time.
fn labeled_meta(tree: TreeId, scope: &str, status: TreeStatus, labels: Labels) -> TreeMeta {
    let name = Name::new("testkit.labeled").expect("valid name");
    TreeMeta {
        program: Some(ProgramVersion {
            digest: Digest::of_parts(Purpose::Program, &[name.as_str().as_bytes()]),
            name,
        }),
        labels,
        created: Some(Timestamp(1_000)),
        ..meta(tree, scope, status, 2_000)
    }
}

async fn list_all(store: &dyn Store, filter: ListFilter, case: &str) -> Vec<TreeMeta> {
    let listing = store
        .list(filter)
        .await
        .unwrap_or_else(|error| panic!("{case}: list failed: {error}"));
    assert!(
        listing.unreadable.is_empty(),
        "{case}: no row is unreadable: {:?}",
        listing.unreadable
    );
    listing.trees
}

async fn labels(store: Arc<dyn Store>) {
    let case = "labels";
    let entries = [
        (
            "lb1",
            "acme",
            TreeStatus::Running,
            labels_of(&[("team", "billing"), ("env", "prod")]),
        ),
        (
            "lb2",
            "acme",
            TreeStatus::Done,
            labels_of(&[("team", "billing"), ("env", "staging")]),
        ),
        (
            "lb3",
            "other",
            TreeStatus::Running,
            labels_of(&[("team", "billing"), ("env", "prod")]),
        ),
        (
            "lb4",
            "acme",
            TreeStatus::Running,
            labels_of(&[("team", "sales")]),
        ),
        ("lb5", "acme", TreeStatus::Running, Labels::new()),
    ];
    let mut metas = Vec::new();
    for (key, scope, status, labels) in &entries {
        let t = tree(key);
        let (lease, _) = granted(&*store, acquire(t, "a", 0, false), case).await;
        let mut item = append(t, lease.token, chain(t, (0, Digest::ZERO), 1, key));
        item.meta = labeled_meta(t, scope, *status, labels.clone());
        metas.push(item.meta.clone());
        assert_eq!(one(&*store, item, case).await, AppendOutcome::Committed);
    }
    metas.sort_by_key(|m| m.tree);
    // What was appended loads and lists back whole.
    for meta in &metas {
        assert_eq!(
            load(&*store, meta.tree, case).await.meta.as_ref(),
            Some(meta),
            "{case}: the program, labels and start time load back"
        );
    }
    assert_eq!(
        list_all(&*store, ListFilter::default(), case).await,
        metas,
        "{case}: the program, labels and start time list back"
    );
    let select = |pairs: &[(&str, &str)], scope: Option<&str>, status: Option<TreeStatus>| {
        let store = store.clone();
        let filter = ListFilter {
            labels: labels_of(pairs),
            scope: scope.map(|s| Scope::new(s).expect("valid scope")),
            status,
            ..ListFilter::default()
        };
        async move {
            list_all(&*store, filter, case)
                .await
                .into_iter()
                .map(|meta| meta.tree)
                .collect::<Vec<_>>()
        }
    };
    let trees = |keys: &[&str]| {
        let mut trees: Vec<TreeId> = keys.iter().map(|key| tree(key)).collect();
        trees.sort();
        trees
    };
    assert_eq!(
        select(&[("team", "billing")], None, None).await,
        trees(&["lb1", "lb2", "lb3"]),
        "{case}: by one label"
    );
    assert_eq!(
        select(&[("team", "billing"), ("env", "prod")], None, None).await,
        trees(&["lb1", "lb3"]),
        "{case}: every label asked for must match"
    );
    assert_eq!(
        select(&[("team", "billing"), ("env", "prod")], Some("acme"), None).await,
        trees(&["lb1"]),
        "{case}: by labels and scope"
    );
    assert_eq!(
        select(&[("team", "billing")], None, Some(TreeStatus::Done)).await,
        trees(&["lb2"]),
        "{case}: by labels and status"
    );
    assert!(
        select(&[("team", "billing"), ("zone", "a")], None, None)
            .await
            .is_empty(),
        "{case}: a label no tree carries matches nothing"
    );
    assert!(
        select(&[("team", "bill")], None, None).await.is_empty(),
        "{case}: values match whole, not by prefix"
    );
}

/// Reads every page of `filter` with pages of `limit`, calling `between`
/// after each page; returns the trees in the order listed.
async fn pages(
    store: &dyn Store,
    filter: &ListFilter,
    limit: u32,
    case: &str,
    mut between: impl AsyncFnMut(usize),
) -> Vec<TreeId> {
    let mut listed = Vec::new();
    let mut after = None;
    for page in 0.. {
        assert!(page <= 1_000, "{case}: paging never ends");
        let listing = store
            .list(ListFilter {
                limit: std::num::NonZeroU32::new(limit),
                after: after.clone(),
                ..filter.clone()
            })
            .await
            .unwrap_or_else(|error| panic!("{case}: list failed: {error}"));
        assert!(
            listing.trees.len() <= limit as usize,
            "{case}: a page holds at most {limit} trees, got {}",
            listing.trees.len()
        );
        listed.extend(listing.trees.iter().map(|meta| meta.tree));
        match listing.next {
            Some(next) => {
                assert_eq!(
                    listing.trees.len(),
                    limit as usize,
                    "{case}: only the last page is short"
                );
                let text = next.to_string();
                let parsed: ListCursor = text.parse().unwrap_or_else(|error| {
                    panic!("{case}: cursor {text:?} does not parse: {error}")
                });
                assert_eq!(parsed, next, "{case}: a cursor's text reads back");
                after = Some(parsed);
            }
            None => break,
        }
        between(page).await;
    }
    listed
}

async fn paging(store: Arc<dyn Store>) {
    let case = "paging";
    let mut expected = Vec::new();
    let mut even = Vec::new();
    let write = async |key: String, labels: Labels| {
        let t = tree(&key);
        let (lease, _) = granted(&*store, acquire(t, "a", 0, false), case).await;
        let mut item = append(t, lease.token, chain(t, (0, Digest::ZERO), 1, &key));
        item.meta = labeled_meta(t, SCOPE, TreeStatus::Waiting, labels);
        assert_eq!(one(&*store, item, case).await, AppendOutcome::Committed);
        t
    };
    for n in 0..23 {
        let parity = if n % 2 == 0 { "even" } else { "odd" };
        let t = write(format!("page-{n}"), labels_of(&[("parity", parity)])).await;
        expected.push(t);
        if n % 2 == 0 {
            even.push(t);
        }
    }
    expected.sort();
    even.sort();
    // Acquired but never appended: on no page.
    granted(&*store, acquire(tree("page-none"), "a", 0, false), case).await;
    for limit in [1, 5, 23, 24, 100] {
        let listed = pages(&*store, &ListFilter::default(), limit, case, async |_| {}).await;
        assert_eq!(
            listed, expected,
            "{case}: pages of {limit} list every tree once, in tree-id order"
        );
    }
    let by_label = ListFilter {
        labels: labels_of(&[("parity", "even")]),
        ..ListFilter::default()
    };
    assert_eq!(
        pages(&*store, &by_label, 4, case, async |_| {}).await,
        even,
        "{case}: pages of a label filter list every match once"
    );
    // Trees added while a listing is paged through: every tree that was
    // there from the start is listed exactly once, and the listing stays
    // in order.
    let mut added = 0;
    let listed = pages(&*store, &ListFilter::default(), 6, case, async |page| {
        write(format!("page-added-{page}"), Labels::new()).await;
        added += 1;
    })
    .await;
    assert!(added > 0, "{case}: trees were added between pages");
    let mut sorted = listed.clone();
    sorted.sort();
    sorted.dedup();
    assert_eq!(listed, sorted, "{case}: no tree twice, in order");
    for tree in &expected {
        assert!(
            listed.contains(tree),
            "{case}: tree {tree}, there throughout, was missed"
        );
    }
}

/// Trees an engine starts with labels list with their program's version,
/// labels and start time, through every later append and lease release.
async fn engine_listing(store: Arc<dyn Store>) {
    let case = "engine listing";
    let program = crate::programs::program(crate::programs::Kind::Ask, None);
    let clock = Arc::new(ManualClock::new(Timestamp(5_000)));
    let engine = Engine::new(EngineConfig {
        programs: vec![program.erase()],
        clock: clock.clone(),
        ..EngineConfig::new(store.clone())
    })
    .expect("valid engine configuration");
    let labels = labels_of(&[("team", "billing"), ("ticket", "t-42")]);
    let request = StartRequest {
        labels: labels.clone(),
        ..StartRequest::new(StartId::new(SCOPE, "labeled").expect("valid"), json!("ok?"))
    };
    let handle = engine
        .start(&program, request)
        .await
        .unwrap_or_else(|error| panic!("{case}: start failed: {error}"));
    let tree = handle.tree();
    let other = StartRequest::new(StartId::new(SCOPE, "unlabeled").expect("valid"), json!("?"));
    engine
        .start(&program, other)
        .await
        .unwrap_or_else(|error| panic!("{case}: start failed: {error}"));
    let view = view_until(&engine, tree, case, |view| {
        view.status == TreeStatus::Waiting
    })
    .await;
    assert_eq!(view.labels, labels, "{case}: inspect shows the labels");
    assert_eq!(
        view.program,
        program.reference().version(),
        "{case}: inspect shows the program's exact version"
    );
    assert_eq!(
        view.created,
        Some(Timestamp(5_000)),
        "{case}: inspect shows the start time"
    );
    // Starting the same id again with other labels is the same start; the
    // first labels stay.
    clock.advance(Duration::from_millis(10));
    let again = StartRequest {
        labels: labels_of(&[("team", "sales")]),
        ..StartRequest::new(StartId::new(SCOPE, "labeled").expect("valid"), json!("ok?"))
    };
    let again = engine
        .start(&program, again)
        .await
        .unwrap_or_else(|error| panic!("{case}: the second start failed: {error}"));
    assert!(!again.is_new(), "{case}: a second start made no new tree");
    assert_eq!(again.into_handle().tree(), tree, "{case}: the same tree");
    let expect_listed = async |status: TreeStatus, what: &str| {
        let selected = list_all(
            &*store,
            ListFilter {
                labels: labels_of(&[("team", "billing")]),
                ..ListFilter::default()
            },
            case,
        )
        .await;
        assert_eq!(
            selected.len(),
            1,
            "{case}: {what}: only the labeled tree is selected"
        );
        let meta = &selected[0];
        assert_eq!(meta.tree, tree, "{case}: {what}: the labeled tree");
        assert_eq!(meta.status, status, "{case}: {what}: its status");
        assert_eq!(meta.labels, labels, "{case}: {what}: its first labels");
        assert_eq!(
            meta.program,
            Some(program.reference().version()),
            "{case}: {what}: its program's exact version"
        );
        assert_eq!(
            meta.created,
            Some(Timestamp(5_000)),
            "{case}: {what}: its start time"
        );
    };
    expect_listed(TreeStatus::Waiting, "after the start").await;
    let wait = view
        .processes
        .first()
        .and_then(|process| process.open_waits.first())
        .map(|wait| wait.id)
        .unwrap_or_else(|| panic!("{case}: the tree waits for an answer"));
    clock.advance(Duration::from_millis(10));
    engine
        .answer(
            &scope(),
            tree,
            wait,
            Payload::encode(&json!(true)).expect("encodes"),
        )
        .await
        .unwrap_or_else(|error| panic!("{case}: answer failed: {error}"));
    handle
        .await_result()
        .await
        .unwrap_or_else(|error| panic!("{case}: the tree stopped: {error}"));
    engine.close().await;
    expect_listed(TreeStatus::Done, "after later appends and the release").await;
}

// ---------------------------------------------------------------------------
// Engine cases: a one-dispatch program under a fault-injecting wrapper.

/// Dispatches its input once, then completes with the settlement's output.
struct DispatchOnce {
    descriptor: Descriptor,
}

#[derive(Serialize, Deserialize)]
struct OnceState {
    input: Value,
    dispatched: bool,
}

struct OnceExecution(OnceState);

impl Definition for DispatchOnce {
    fn descriptor(&self) -> &Descriptor {
        &self.descriptor
    }

    fn start(&self, input: &Payload) -> Result<Box<dyn Execution>, StepError> {
        Ok(Box::new(OnceExecution(OnceState {
            input: input.to_value(),
            dispatched: false,
        })))
    }

    fn restore(&self, state: &ExecutionState) -> Result<Box<dyn Execution>, StepError> {
        Ok(Box::new(OnceExecution(state.decode()?)))
    }
}

impl Execution for OnceExecution {
    fn step(&mut self, window: &[Signal]) -> Result<Transition, StepError> {
        if !self.0.dispatched {
            self.0.dispatched = true;
            return Ok(Transition::Continue {
                consumed: 0,
                effects: vec![Effect::dispatch(Payload::from_value(&self.0.input)?)],
            });
        }
        match window.first().map(|signal| &signal.body) {
            Some(SignalBody::Settled {
                settlement: Settlement::Succeeded { output, .. },
                ..
            }) => Ok(Transition::Complete {
                consumed: 1,
                output: output.clone(),
            }),
            Some(SignalBody::Settled {
                settlement: Settlement::Failed { failure, .. },
                ..
            }) => Ok(Transition::Fail {
                consumed: 1,
                failure: failure.clone(),
            }),
            _ => Ok(Transition::Continue {
                consumed: 0,
                effects: Vec::new(),
            }),
        }
    }

    fn snapshot(&self) -> Result<ExecutionState, StepError> {
        ExecutionState::encode(&self.0)
    }
}

fn dispatch_once(dispatcher: ScriptedDispatcher) -> Program<Value, Value> {
    let descriptor = Descriptor::new(
        "testkit.dispatch_once",
        "Dispatches its input once and completes with the result.",
        Schema::any(),
        Schema::any(),
    )
    .expect("valid descriptor");
    Program::new(ProgramConfig {
        definition: Arc::new(DispatchOnce { descriptor }),
        dispatcher: Some(Arc::new(dispatcher)),
        implementation: implementation_digest(env!("CARGO_PKG_NAME"), env!("CARGO_PKG_VERSION")),
        configuration: configuration_digest("dispatch_once").expect("encodes"),
    })
}

fn engine(store: Arc<dyn Store>, program: &Program<Value, Value>, snapshot_every: u64) -> Engine {
    let mut config = EngineConfig {
        programs: vec![program.erase()],
        ..EngineConfig::new(store)
    };
    config.snapshot_every = snapshot_every;
    Engine::new(config).expect("the engine configuration is valid")
}

fn scope() -> Scope {
    Scope::new(SCOPE).expect("valid scope")
}

async fn view_until(
    engine: &Engine,
    tree: TreeId,
    case: &str,
    done: impl Fn(&TreeView) -> bool,
) -> TreeView {
    for _ in 0..10_000 {
        if let Ok(view) = engine.inspect(&scope(), tree, Visibility::Public).await
            && done(&view)
        {
            return view;
        }
        tokio::task::yield_now().await;
    }
    panic!("{case}: the tree never reached the expected state");
}

/// Many commits with a snapshot every two records: the store compacts (or
/// keeps) what snapshots cover, the log verifies from the snapshot head and
/// a fresh engine recovers the finished tree with its output.
async fn engine_snapshots(store: Arc<dyn Store>) {
    let case = "engine snapshots";
    let dispatcher = ScriptedDispatcher::echo(ReplayPolicy::Never);
    let program = dispatch_once(dispatcher.clone());
    let first = engine(store.clone(), &program, 2);
    let mut keys = Vec::new();
    for n in 0..4 {
        let key = format!("snapshots-{n}");
        let request = StartRequest::new(
            StartId::new(SCOPE, &key).expect("valid"),
            json!({ "n": n, "pad": "p".repeat(6_000) }),
        );
        let handle = first
            .start(&program, request)
            .await
            .unwrap_or_else(|error| panic!("{case}: start failed: {error}"));
        let termination = handle
            .await_result()
            .await
            .unwrap_or_else(|error| panic!("{case}: the tree stopped: {error}"));
        assert_eq!(termination.status(), Status::Completed, "{case}: completes");
        handle.join().await.expect("joins");
        keys.push((handle.tree(), n));
    }
    first.close().await;
    let second = engine(store.clone(), &program, 2);
    for (tree, n) in keys {
        let head = second
            .verify(&scope(), tree)
            .await
            .unwrap_or_else(|error| panic!("{case}: the log does not verify: {error}"))
            .head_seq;
        let stored = load(&*store, tree, case).await;
        assert_eq!(stored.head().0, head, "{case}: verified up to the head");
        let handle = second
            .process::<Value>(&scope(), tree)
            .await
            .unwrap_or_else(|error| panic!("{case}: cannot take the tree up: {error}"));
        let output = handle.output().await.expect("completed output");
        assert_eq!(output["n"], n, "{case}: the recorded output survives");
    }
    assert_eq!(dispatcher.total(), 4, "{case}: one dispatch per tree");
}

/// What recovery must show after a crash at one commit.
#[derive(Clone, Copy, Debug)]
enum Expect {
    /// Exactly this many dispatches over both engines, and whether the
    /// dispatch is surfaced as unknown (and must be resolved).
    Exactly { dispatches: u32, unknown: bool },
    /// Where the engine may group this commit with the pending record: the
    /// `Never` guarantee only — dispatched once and known, or surfaced as
    /// unknown having been dispatched at most once.
    AtMostOnce,
}

const fn exactly(dispatches: u32, unknown: bool) -> Expect {
    Expect::Exactly {
        dispatches,
        unknown,
    }
}

async fn crash_matrix(fresh: &dyn Fn() -> Arc<dyn Store>) {
    // A completing step is its process's terminal record, so these are all
    // the commit kinds of a one-dispatch tree.
    use RecordKind::{EffectPending, EffectSettled, StepAdopted, TreeStarted};
    let never = ReplayPolicy::Never;
    let same = ReplayPolicy::SameIdentity;
    let cases = [
        (TreeStarted, Cut::Before, never, exactly(1, false)),
        (TreeStarted, Cut::After, never, exactly(1, false)),
        (StepAdopted, Cut::Before, never, exactly(1, false)),
        (StepAdopted, Cut::After, never, Expect::AtMostOnce),
        (EffectPending, Cut::Before, never, exactly(1, false)),
        (EffectPending, Cut::After, never, exactly(0, true)),
        (EffectPending, Cut::After, same, exactly(1, false)),
        (EffectSettled, Cut::Before, never, exactly(1, true)),
        (EffectSettled, Cut::Before, same, exactly(2, false)),
        (EffectSettled, Cut::After, never, exactly(1, false)),
    ];
    for (index, (kind, cut, policy, expect)) in cases.into_iter().enumerate() {
        let case = format!("crash {cut:?} {kind} ({policy:?})");
        crash_case(fresh(), &case, index, kind, cut, policy, expect).await;
    }
}

async fn crash_case(
    store: Arc<dyn Store>,
    case: &str,
    index: usize,
    kind: RecordKind,
    cut: Cut,
    policy: ReplayPolicy,
    expect: Expect,
) {
    let dispatcher = ScriptedDispatcher::echo(policy);
    let program = dispatch_once(dispatcher.clone());
    let faulty = FaultStore::new(store.clone());
    faulty.arm(kind, cut, 1);
    let key = format!("crash-{index}");
    let id = StartId::new(SCOPE, &key).expect("valid");
    let tree = ProcessId::root(&id);
    let input = json!({ "case": index });
    let first = engine(Arc::new(faulty.clone()), &program, 512);
    match first
        .start(&program, StartRequest::new(id.clone(), input.clone()))
        .await
    {
        Ok(handle) => {
            let stopped = handle.await_result().await;
            assert!(
                matches!(stopped, Err(RuntimeError::Storage { .. })),
                "{case}: the writer must stop on the storage failure, got {stopped:?}"
            );
        }
        // The start itself is the cut commit (a root that acts in its
        // first round is created with its start alone).
        Err(error) => assert_eq!(
            kind,
            RecordKind::TreeStarted,
            "{case}: start failed: {error}"
        ),
    }
    assert!(faulty.crashed(), "{case}: the fault fired");
    drop(first);

    // A fresh engine on the same store: recover, then start again (a no-op
    // for a stored tree, a first start if the crash lost it).
    let second = engine(store.clone(), &program, 512);
    let report = second
        .recover(RecoverOptions::default())
        .await
        .unwrap_or_else(|error| panic!("{case}: recover failed: {error}"));
    assert!(
        report.iter().all(|(_, result)| result.is_ok()),
        "{case}: recovery reported {report:?}"
    );
    let handle = second
        .start(&program, StartRequest::new(id, input.clone()))
        .await
        .unwrap_or_else(|error| panic!("{case}: start after recovery failed: {error}"));
    let settled = view_until(&second, tree, case, |view| {
        let root = view.root();
        root.status.is_terminal() || root.status == Status::Parked
    })
    .await;
    let unknown = settled.root().unknown_effects.clone();
    match expect {
        Expect::Exactly {
            unknown: surfaced, ..
        } => assert_eq!(
            !unknown.is_empty(),
            surfaced,
            "{case}: unknown effects after recovery: {unknown:?}"
        ),
        Expect::AtMostOnce => assert!(unknown.len() <= 1, "{case}: {unknown:?}"),
    }
    if let Some(effect) = unknown.first() {
        assert_eq!(
            settled.status,
            TreeStatus::NeedsAttention,
            "{case}: listing"
        );
        let resolution = Settlement::ok(Payload::from_value(&input).expect("encodes"));
        second
            .resolve_unknown(&scope(), tree, *effect, resolution)
            .await
            .unwrap_or_else(|error| panic!("{case}: resolve failed: {error}"));
    }
    let termination = handle
        .await_result()
        .await
        .unwrap_or_else(|error| panic!("{case}: the recovered tree stopped: {error}"));
    assert_eq!(termination.status(), Status::Completed, "{case}: completes");
    let output = termination.output().expect("completed").to_value();
    assert_eq!(
        output, input,
        "{case}: the output is the dispatched (or resolved) one"
    );
    match expect {
        Expect::Exactly { dispatches, .. } => assert_eq!(
            dispatcher.total(),
            dispatches,
            "{case}: dispatches over the crash"
        ),
        Expect::AtMostOnce if unknown.is_empty() => assert_eq!(
            dispatcher.total(),
            1,
            "{case}: a known settlement comes from exactly one dispatch"
        ),
        Expect::AtMostOnce => assert!(
            dispatcher.total() <= 1,
            "{case}: an unknown dispatch was sent at most once"
        ),
    }
    assert!(
        dispatcher.counts().len() <= 1,
        "{case}: one effect identity only"
    );
    second
        .verify(&scope(), tree)
        .await
        .unwrap_or_else(|error| panic!("{case}: the log does not verify: {error}"));
}
