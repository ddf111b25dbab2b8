//! Fuzzing the kernel's decoders of external bytes (see
//! `baton_testkit::fuzz`): log records, payloads, whole stored logs
//! folded by the engine, and payloads checked against schemas. Each input
//! decodes, or is refused with a classified error; none panics.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use baton_run::dispatch::ReplayPolicy;
use baton_run::log::{Record, RecordKind, chain_hash, verify};
use baton_run::program::Schema;
use baton_run::store::{AcquireRequest, Acquired, Append, Store, TreeMeta, TreeStatus};
use baton_run::{Engine, EngineConfig, MemoryStore, Payload, Scope, Timestamp, TreeId};
use baton_testkit::ScriptedDispatcher;
use baton_testkit::fuzz;
use baton_testkit::programs::{Kind, SCOPE, engine, open_wait, program, request};
use proptest::prelude::*;
use serde_json::json;

/// A real tree's log (an answered wait), and record bodies of several
/// kinds (that log's and a dispatching tree's) to seed mutations with.
struct Sample {
    tree: TreeId,
    log: Vec<Record>,
    seeds: Vec<Vec<u8>>,
}

fn sample() -> &'static Sample {
    static SAMPLE: OnceLock<Sample> = OnceLock::new();
    SAMPLE.get_or_init(|| {
        runtime().block_on(async {
            let store = MemoryStore::keeping_history();
            let dispatcher = ScriptedDispatcher::echo(ReplayPolicy::Never);
            let dispatching = program(Kind::Dispatch, Some(Arc::new(dispatcher)));
            let ask = program(Kind::Ask, None);
            let engine = engine(Arc::new(store.clone()), &[&dispatching, &ask]);
            let handle = engine
                .start(&dispatching, request("fuzz-dispatch", json!(["a", "b"])))
                .await
                .expect("starts");
            handle.join().await.expect("joins");
            // A question long enough that the asking steps are recorded as
            // changes of the state, so that edits reach their folding too.
            let asking = engine
                .start(&ask, request("fuzz-ask", "go? ".repeat(1_100)))
                .await
                .expect("starts");
            let wait = open_wait(&asking).await;
            let answer = baton_run::SignalRequest {
                id: baton_run::SignalId::new("fuzz-answer").expect("valid"),
                wait: Some(wait),
                payload: Payload::encode(&true).expect("encodes"),
            };
            asking.signal(answer).await.expect("answered");
            asking.join().await.expect("joins");
            let tree = asking.tree();
            let log = store.records(tree);
            let seeds = log
                .iter()
                .chain(&store.records(handle.tree()))
                .map(|record| record.body.to_vec())
                .collect();
            Sample { tree, log, seeds }
        })
    })
}

/// One runtime for every case (building one per case would dominate).
fn runtime() -> &'static tokio::runtime::Runtime {
    static RUNTIME: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RUNTIME.get_or_init(|| {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime")
    })
}

fn seeds() -> Vec<Vec<u8>> {
    sample().seeds.clone()
}

/// The engine writes a record's body as serde_json's compact text of it,
/// byte for byte, for every kind the sample's trees wrote (the engine's own
/// writer, not serde_json's, produced them): bodies decode to the same
/// record, and a body's bytes do not depend on which writer made them.
#[test]
fn sealed_bodies_are_serde_jsons_text_of_the_record() {
    let sample = sample();
    let mut kinds = std::collections::BTreeSet::new();
    for body in &sample.seeds {
        let record: baton_run::log::RecordBody = serde_json::from_slice(body).expect("decodes");
        kinds.insert(record.kind());
        assert_eq!(
            String::from_utf8_lossy(body),
            serde_json::to_string(&record).expect("encodes"),
        );
        let resealed = Record::seal(1, baton_run::Digest::ZERO, &record);
        assert_eq!(&*resealed.body, &body[..]);
    }
    assert!(
        kinds.len() >= 5,
        "the sample covers several kinds: {kinds:?}"
    );
    assert!(
        sample.seeds.iter().any(|body| matches!(
            serde_json::from_slice(body),
            Ok(baton_run::log::RecordBody::StepAdopted {
                state_change: Some(_),
                ..
            })
        )),
        "the sample holds a step recorded as a change"
    );
}

proptest! {
    #![proptest_config(fuzz::config())]

    /// One record of any kind with any body, correctly chained: checking it
    /// decodes the body as its kind, or refuses it with a verify error.
    #[test]
    fn fuzz_log_records(body in fuzz::bytes(seeds()), kind in 0..RecordKind::ALL.len()) {
        let kind = RecordKind::ALL[kind];
        let body: Arc<[u8]> = body.into();
        let hash = chain_hash(1, baton_run::Digest::ZERO, &body);
        let record = Record::stored(1, baton_run::Digest::ZERO, hash, kind, body);
        if let Err(error) = verify(0, baton_run::Digest::ZERO, &[record]) {
            prop_assert!(error.seq == 1, "{error}");
        }
    }

    /// Payload text from anywhere, decoded as a `Value` and as typed
    /// values: `Payload::decode` (which reads canonical text its own way
    /// first) answers exactly what serde_json answers for the same text,
    /// the value or the error's message.
    #[test]
    fn fuzz_payload_decodes(text in fuzz::text(vec![
        r#"{"a":[1,2.5,-3e10,true,null],"b":"x\u00e9\n\"","c":{"d":{}}}"#.to_owned(),
        r#"{"Newtype":7,"list":[-1,0,18446744073709551615],"name":"n","opt":null}"#.to_owned(),
        r#"["Unit",{"Tuple":[1,"a"]},{"Struct":{"flag":true}},"\u0001"]"#.to_owned(),
        r#"{"1":"one","-2":"minus two","x":{"y":[[],{}]}}"#.to_owned(),
    ])) {
        if let Ok(payload) = Payload::parse_str(&text) {
            same_as_serde_json::<serde_json::Value>(&payload)?;
            same_as_serde_json::<Vec<Shape>>(&payload)?;
            same_as_serde_json::<std::collections::BTreeMap<String, Shape>>(&payload)?;
            same_as_serde_json::<std::collections::BTreeMap<i64, String>>(&payload)?;
            same_as_serde_json::<Named>(&payload)?;
        }
    }

    /// Payload text from anywhere: a payload that parses is canonical and
    /// reads back to itself.
    #[test]
    fn fuzz_payloads(text in fuzz::text(vec![
        r#"{"a":[1,2.5,-3e10,true,null],"b":"x\u00e9\n\"","c":{"d":{}}}"#.to_owned(),
        r#"[[[[[[[[[[]]]]]]]]]]"#.to_owned(),
        r#""\ud83d\ude00 and \\ and \/""#.to_owned(),
        r#"{"dup":1,"dup":2}"#.to_owned(),
    ])) {
        if let Ok(payload) = Payload::parse_str(&text) {
            let again = Payload::parse_str(payload.as_str()).expect("canonical text reads back");
            prop_assert_eq!(again.as_str(), payload.as_str());
            prop_assert_eq!(again.digest(), payload.digest());
        }
    }

    /// Payload text checked against real schemas (a team's `Turn`, whose
    /// tasks hold documented enums, and the kernel's `Termination`): the
    /// text validator, which checks a rewritten schema, gives the value
    /// validator's verdict on the schema as written.
    #[test]
    fn fuzz_schema_verdicts(text in fuzz::text(vec![
        r#"{"controls":[],"number":3,"state":{"a":1},"tasks":[{"outcome":{"cause":"completion","output":2,"status":"completed"},"process":"p_0123456789abcdef0123456789abcdef","request":{"input":1,"key":"a","worker":"w.num"}},{"rejection":{"code":"engine.child.tree_limit","kind":"contract","message":"refused"},"request":{"input":"x","key":"b","worker":"w.text"}}],"workers":[]}"#.to_owned(),
        r#"{"cause":"host_cancellation","failure":{"code":"x.y","kind":"execution","message":"m"},"status":"canceled"}"#.to_owned(),
    ])) {
        static SCHEMAS: OnceLock<Vec<Schema>> = OnceLock::new();
        let schemas = SCHEMAS.get_or_init(|| {
            let turn = std::fs::read_to_string(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/../baton-team/tests/schemas/turn.json"
            ))
            .expect("the team's turn schema is checked in");
            vec![
                Schema::parse(&turn).expect("compiles"),
                Schema::of::<baton_run::Termination>(),
            ]
        });
        if let Ok(payload) = Payload::parse_str(&text) {
            let value = payload.to_value();
            for schema in schemas {
                let expected = schema.validate_value(&value);
                prop_assert_eq!(schema.is_valid(&payload), expected.is_ok(), "{}", payload.as_str());
                prop_assert_eq!(schema.validate(&payload), expected);
            }
        }
    }

    /// A stored log with one record's body edited and the chain rehashed
    /// around it, so the edit reaches the fold: verifying the tree returns
    /// what it checked or a classified error, never a panic.
    #[test]
    fn fuzz_stored_logs(index in 0usize..64, body in fuzz::bytes(seeds())) {
        let at = index % sample().log.len();
        let result = verify_edited(at, body);
        if let Err(error) = result {
            prop_assert!(
                matches!(error.code(), "engine.log.corrupt" | "engine.tree.not_found" | "engine.scope.mismatch"),
                "{error}"
            );
        }
    }
}

/// Verifies, with a fresh engine over a store holding it, the sample's log
/// with record `at`'s body replaced by `body` and the chain rehashed around
/// it, so that the edit reaches the fold.
fn verify_edited(
    at: usize,
    body: Vec<u8>,
) -> Result<baton_run::Verification, baton_run::TreeError> {
    let sample = sample();
    let tree = sample.tree;
    let mut prev = baton_run::Digest::ZERO;
    let mut records = Vec::with_capacity(sample.log.len());
    for (position, record) in sample.log.iter().enumerate() {
        let body: Arc<[u8]> = if position == at {
            body.clone().into()
        } else {
            record.body.clone()
        };
        let rehashed = Record::from_parts(record.seq, prev, record.kind, body);
        prev = rehashed.hash;
        records.push(rehashed);
    }
    runtime().block_on(async {
        let store = MemoryStore::keeping_history();
        let lease = match store
            .acquire(AcquireRequest {
                tree,
                owner: "fuzzer".into(),
                now: Timestamp(0),
                ttl: Duration::from_secs(60),
                force: true,
            })
            .await
            .expect("acquires")
        {
            Acquired::Granted { lease, .. } => lease,
            other => panic!("not granted: {other:?}"),
        };
        store
            .append(vec![Append {
                tree,
                token: lease.token,
                records,
                meta: TreeMeta::new(
                    tree,
                    Scope::new(SCOPE).expect("valid"),
                    TreeStatus::Done,
                    Timestamp(0),
                ),
                release: true,
            }])
            .await
            .expect("appends");
        let ask = program(Kind::Ask, None);
        let engine = Engine::new(EngineConfig {
            programs: vec![ask.erase()],
            ..EngineConfig::new(Arc::new(store))
        })
        .expect("the engine configuration is valid");
        engine
            .verify(&Scope::new(SCOPE).expect("valid"), tree)
            .await
    })
}

/// A step recorded as a change that does not fit the state before it (kept
/// bytes beyond its end, or text that makes no JSON) is a corrupt log,
/// named by its record, and so is a step record with neither form; the
/// log as written verifies.
#[test]
fn a_state_change_that_does_not_fit_is_a_corrupt_log() {
    let sample = sample();
    let (at, change) = sample
        .log
        .iter()
        .enumerate()
        .find_map(|(at, record)| {
            let body: serde_json::Value = serde_json::from_slice(&record.body).ok()?;
            body.get("state_change").is_some().then_some((at, body))
        })
        .expect("the sample holds a step recorded as a change");
    let original = sample.log[at].body.to_vec();
    assert!(
        verify_edited(at, original).is_ok(),
        "the log as written verifies"
    );
    let edit = |edit: &dyn Fn(&mut serde_json::Value)| {
        let mut body = change.clone();
        edit(&mut body);
        serde_json::to_vec(&body).expect("encodes")
    };
    let edits: [(&str, Vec<u8>); 3] = [
        (
            "keeps",
            edit(&|body| body["state_change"]["back"] = json!(u32::MAX)),
        ),
        (
            "makes no state",
            edit(&|body| body["state_change"]["text"] = json!("{")),
        ),
        (
            "whole or as a change",
            edit(&|body| {
                body.as_object_mut()
                    .expect("an object")
                    .remove("state_change");
            }),
        ),
    ];
    for (why, body) in edits {
        let error = verify_edited(at, body).expect_err("corrupt");
        assert_eq!(error.code(), "engine.log.corrupt", "{error}");
        let message = error.to_string();
        assert!(
            message.contains(why) && message.contains(&format!("record {}", at + 1)),
            "{message}"
        );
    }
}

/// Variants of every kind, for [`fuzz_payload_decodes`].
#[derive(Debug, PartialEq, serde::Deserialize)]
enum Shape {
    Unit,
    Newtype(u64),
    Tuple(i8, String),
    Struct { flag: bool },
}

/// A struct with optional, defaulted and nested members, for
/// [`fuzz_payload_decodes`].
#[derive(Debug, PartialEq, serde::Deserialize)]
struct Named {
    name: String,
    opt: Option<Box<Named>>,
    #[serde(default)]
    list: Vec<i64>,
    #[serde(flatten)]
    rest: std::collections::BTreeMap<String, serde_json::Value>,
}

/// `payload.decode::<T>()` is serde_json's answer for the payload's text.
fn same_as_serde_json<T>(payload: &Payload) -> Result<(), TestCaseError>
where
    T: serde::de::DeserializeOwned + PartialEq + std::fmt::Debug,
{
    let expected = serde_json::from_str::<T>(payload.as_str()).map_err(|error| error.to_string());
    let decoded = payload.decode::<T>().map_err(|error| match error {
        baton_run::PayloadError::Decode { message } => message,
        other => other.to_string(),
    });
    prop_assert_eq!(decoded, expected, "{}", payload.as_str());
    Ok(())
}
