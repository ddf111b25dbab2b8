//! Leases on the database's clock: what engines with disagreeing clocks see,
//! and how a takeover fences a stale writer, with each engine on a store
//! handle of its own (its own connections), as on separate machines.

use std::sync::Arc;
use std::time::Duration;

use baton_run::log::{Record, RecordBody};
use baton_run::store::{
    AcquireRequest, Acquired, Append, AppendOutcome, Store, TreeMeta, TreeStatus,
};
use baton_run::{
    Clock, Digest, Engine, EngineConfig, ManualClock, Payload, RecoverOptions, RuntimeError, Scope,
    SignalError, SignalId, SignalReceipt, SignalRequest, SystemClock, Timestamp, TreeError, TreeId,
    WaitId,
};
use baton_run::{EffectId, ProcessId, StartId};
use baton_store_postgres::{PostgresConfig, PostgresStore};
use baton_testkit::programs::{Kind, SCOPE, open_wait, program, request};

use crate::support::{Server, connect};

fn tree(key: &str) -> TreeId {
    ProcessId::root(&StartId::new(SCOPE, key).expect("valid"))
}

fn scope() -> Scope {
    Scope::new(SCOPE).expect("valid")
}

/// Ten minutes, the skew of the fast engine's clock.
const SKEW: Duration = Duration::from_secs(600);

fn acquire(tree: TreeId, owner: &str, now: Timestamp, force: bool) -> AcquireRequest {
    AcquireRequest {
        tree,
        owner: owner.into(),
        now,
        ttl: Duration::from_secs(60),
        force,
    }
}

async fn token(store: &PostgresStore, request: AcquireRequest) -> u64 {
    match store.acquire(request).await.expect("acquires") {
        Acquired::Granted { lease, .. } => lease.token,
        other => panic!("expected a grant, got {other:?}"),
    }
}

fn one_record(tree: TreeId, token: u64) -> Append {
    let body = RecordBody::EffectPending {
        process: tree,
        effect: EffectId::new(tree, 1, 0),
    };
    Append {
        tree,
        token,
        records: vec![Record::seal(1, Digest::ZERO, &body)],
        meta: TreeMeta::new(tree, scope(), TreeStatus::Running, Timestamp(1)),
        release: false,
    }
}

/// The database's clock, in ms since the epoch, and a tree's lease expiry.
async fn database_clock(url: &str, tree: TreeId) -> (i64, Option<i64>) {
    let client = connect(url).await;
    let row = client
        .query_one(
            "SELECT (extract(epoch FROM now()) * 1000)::bigint,
                    (SELECT lease_until FROM baton_trees WHERE id = $1)",
            &[&tree.to_string()],
        )
        .await
        .expect("reads the clock");
    (row.get(0), row.get(1))
}

/// A second handle on the store of `url`, as another machine opens it.
fn another_machine(url: &str) -> PostgresStore {
    PostgresStore::open_with(PostgresConfig {
        read_connections: 2,
        ..PostgresConfig::new(url)
    })
    .expect("opens the shared store")
}

#[tokio::test]
async fn an_engine_whose_clock_runs_ten_minutes_fast_cannot_take_a_live_lease() {
    let server = Server::new();
    let store = server.store();
    let url = server_url_of(&server, &store);
    let ask = program(Kind::Ask, None);
    let honest = Engine::new(EngineConfig {
        programs: vec![ask.erase()],
        lease_ttl: Duration::from_secs(30),
        ..EngineConfig::new(Arc::new(store.clone()))
    })
    .expect("the engine configuration is valid");
    let handle = honest
        .start(&ask, request("skewed", "q"))
        .await
        .expect("starts");
    open_wait(&handle).await;

    // Another machine whose clock runs ten minutes fast: by its clock the
    // lease ran out long ago; by the database's it is live.
    let fast = ManualClock::new(SystemClock.now().plus(SKEW));
    let other = another_machine(&url);
    let skewed = Engine::new(EngineConfig {
        programs: vec![ask.erase()],
        clock: Arc::new(fast.clone()),
        lease_ttl: Duration::from_secs(30),
        ..EngineConfig::new(Arc::new(other.clone()))
    })
    .expect("the engine configuration is valid");
    let report = skewed
        .recover(RecoverOptions::default())
        .await
        .expect("lists");
    assert_eq!(report.len(), 1, "{report:?}");
    match &report[0].1 {
        Err(TreeError::LeaseHeld { until, .. }) => {
            // The expiry it is told is on the database's clock.
            let (now, stored) = database_clock(&url, handle.tree()).await;
            assert_eq!(Some(until.0 as i64), stored);
            assert!(
                (until.0 as i64) > now && (until.0 as i64) <= now + 30_000,
                "until {until:?} vs the database's now {now}"
            );
        }
        other => panic!("the fast engine took a live lease: {other:?}"),
    }
    // Straight at the store, with its skewed `now`: held too.
    match other
        .acquire(acquire(handle.tree(), "fast", fast.now(), false))
        .await
        .expect("asks")
    {
        Acquired::LeaseHeld { .. } => {}
        granted => panic!("a live lease was granted to a fast clock: {granted:?}"),
    }
    // The honest engine still writes.
    let wait = handle.inspect().await.expect("inspects").root().open_waits[0].id;
    assert_eq!(
        handle.signal(answer("yes", wait, true)).await,
        Ok(SignalReceipt::Admitted)
    );
    assert_eq!(
        handle.await_result().await.expect("completes").status(),
        baton_run::Status::Completed
    );

    // The same skew on a store that judges leases by the requests' clock
    // takes the lease: what the database's clock prevents.
    let naive = server.store_on_request_clock();
    let t = tree("naive");
    token(&naive, acquire(t, "honest", SystemClock.now(), false)).await;
    assert!(matches!(
        naive
            .acquire(acquire(t, "fast", fast.now(), false))
            .await
            .expect("asks"),
        Acquired::Granted { .. }
    ));
}

fn server_url_of(_server: &Server, store: &PostgresStore) -> String {
    // The store's target has no password; the tests' server URL may.
    let database = store
        .target()
        .rsplit('/')
        .next()
        .expect("a database")
        .to_owned();
    crate::support::url_of(&crate::support::server_url(), &database)
}

fn answer(id: &str, wait: WaitId, value: bool) -> SignalRequest {
    SignalRequest {
        id: SignalId::new(id).expect("valid"),
        wait: Some(wait),
        payload: Payload::encode(&value).expect("encodes"),
    }
}

#[tokio::test]
async fn a_lease_the_database_says_ran_out_is_granted_whatever_the_engine_clock_says() {
    let server = Server::new();
    let store = server.store();
    let url = server_url_of(&server, &store);
    let t = tree("expired");
    let first = token(&store, acquire(t, "a", SystemClock.now(), false)).await;
    // The same owner asking again is refused: a live lease is never granted
    // twice, and no clock in the request changes that.
    for now in [
        Timestamp(0),
        SystemClock.now(),
        SystemClock.now().plus(SKEW),
    ] {
        match store
            .acquire(acquire(t, "a", now, false))
            .await
            .expect("asks")
        {
            Acquired::LeaseHeld { owner, .. } => assert_eq!(owner, "a"),
            other => panic!("a live lease was granted again at {now:?}: {other:?}"),
        }
    }
    // Time passes on the database: the lease runs out there.
    connect(&url)
        .await
        .execute(
            "UPDATE baton_trees SET lease_until = (extract(epoch FROM now()) * 1000)::bigint - 1
             WHERE id = $1",
            &[&t.to_string()],
        )
        .await
        .expect("ages the lease");
    // An engine whose clock runs ten minutes slow gets it all the same.
    let slow = Timestamp(SystemClock.now().0 - SKEW.as_millis() as u64);
    let second = token(&store, acquire(t, "b", slow, false)).await;
    assert!(second > first, "fencing tokens increase");
    assert_eq!(
        store.append(vec![one_record(t, first)]).await,
        Ok(vec![AppendOutcome::Fenced]),
        "the expired writer is fenced"
    );
    assert_eq!(
        store.append(vec![one_record(t, second)]).await,
        Ok(vec![AppendOutcome::Committed])
    );
}

#[tokio::test]
async fn a_renewal_extends_the_lease_by_its_ttl_on_the_database_clock() {
    let server = Server::new();
    let store = server.store();
    let url = server_url_of(&server, &store);
    let t = tree("renewed");
    let lease = token(&store, acquire(t, "a", Timestamp(5), false)).await;
    // The engine's idea of the new expiry is ignored: the database counts
    // the grant's 60 s from its own now.
    assert_eq!(store.renew(t, lease, Timestamp(1)).await, Ok(true));
    let (now, until) = database_clock(&url, t).await;
    let until = until.expect("a lease");
    assert!(
        until > now + 55_000 && until <= now + 60_000,
        "renewed until {until}, the database's now is {now}"
    );
    assert_eq!(store.renew(t, lease + 1, Timestamp(1)).await, Ok(false));
    store.release(t, lease).await.expect("releases");
    assert_eq!(store.renew(t, lease, Timestamp(1)).await, Ok(false));
}

#[tokio::test]
async fn a_stale_writer_fenced_by_a_takeover_on_another_machine_writes_nothing() {
    let server = Server::new();
    let store = server.store();
    let url = server_url_of(&server, &store);
    let ask = program(Kind::Ask, None);
    let old = Engine::new(EngineConfig {
        programs: vec![ask.erase()],
        ..EngineConfig::new(Arc::new(store.clone()))
    })
    .expect("the engine configuration is valid");
    let handle = old
        .start(&ask, request("stale", "q"))
        .await
        .expect("starts");
    let wait = open_wait(&handle).await;

    let other = another_machine(&url);
    let new = Engine::new(EngineConfig {
        programs: vec![ask.erase()],
        ..EngineConfig::new(Arc::new(other.clone()))
    })
    .expect("the engine configuration is valid");
    let report = new
        .recover(RecoverOptions {
            force: true,
            scope: None,
        })
        .await
        .expect("lists");
    assert!(report[0].1.is_ok(), "{report:?}");
    let before = other.records(handle.tree()).await.expect("reads");

    let error = handle
        .signal(answer("to-old", wait, true))
        .await
        .expect_err("the old writer is fenced");
    assert!(
        matches!(error, SignalError::Stopped(RuntimeError::Fenced { .. })),
        "{error:?}"
    );
    assert_eq!(
        other.records(handle.tree()).await.expect("reads"),
        before,
        "the fenced writer wrote nothing"
    );
    // The new writer finishes the tree.
    let taken = new
        .process::<Payload>(&scope(), handle.tree())
        .await
        .expect("held by the new engine");
    assert_eq!(
        taken.signal(answer("to-new", wait, false)).await,
        Ok(SignalReceipt::Admitted)
    );
    assert_eq!(
        taken.await_result().await.expect("completes").status(),
        baton_run::Status::Completed
    );
    assert!(new.verify(&scope(), handle.tree()).await.is_ok());
}
