//! The authoritative, hash-chained log of a tree.
//!
//! Records carry facts, never commands to re-run. Each record's hash is
//! `H(prev ‖ seq ‖ body)` in the log-chain context, so editing any byte of
//! any record breaks the chain at that record.

use std::fmt;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::budget::{Budget, Capabilities, Meters, TreeLimits};
use crate::clock::Timestamp;
use crate::digest::{Digest, Purpose};
use crate::failure::{Cause, Failure, Termination};
use crate::ids::{ChildKey, EffectId, ProcessId, StartId};
use crate::labels::Labels;
use crate::payload::Payload;
use crate::protocol::{ExecutionState, ProgramRef, Settlement, Signal, Transition};
use crate::tagged;

mod change;
mod write;

pub use change::StateChange;

/// The kind of a record, stored beside its body for listing and fault injection.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RecordKind {
    /// A tree and its root process started.
    TreeStarted,
    /// A step's transition and new state were adopted.
    StepAdopted,
    /// A dispatch is about to be sent (durable before any I/O).
    EffectPending,
    /// A dispatch settled (durable before the process sees it).
    EffectSettled,
    /// The host resolved an unknown effect.
    EffectResolved,
    /// The host asked to replay an unknown effect.
    EffectReplayed,
    /// Host signals were admitted to a mailbox.
    SignalsAdmitted,
    /// Cancellation was requested.
    CancelRequested,
    /// A process terminated.
    Terminated,
    /// A child was published together with its parent's start receipt.
    ChildStarted,
    /// A control reached a child together with its parent's receipt.
    ControlDelivered,
    /// An attempt of a dispatch failed and its retry policy tries it again
    /// after a backoff.
    EffectRetrying,
    /// A children wait settled with the outcomes its children's
    /// terminations give at that point of the log, ending its batch.
    ChildrenReady,
}

impl RecordKind {
    /// Every kind, in declaration order.
    pub const ALL: [RecordKind; 13] = [
        RecordKind::TreeStarted,
        RecordKind::StepAdopted,
        RecordKind::EffectPending,
        RecordKind::EffectSettled,
        RecordKind::EffectResolved,
        RecordKind::EffectReplayed,
        RecordKind::SignalsAdmitted,
        RecordKind::CancelRequested,
        RecordKind::Terminated,
        RecordKind::ChildStarted,
        RecordKind::ControlDelivered,
        RecordKind::EffectRetrying,
        RecordKind::ChildrenReady,
    ];

    /// The snake_case name.
    pub fn as_str(self) -> &'static str {
        match self {
            RecordKind::TreeStarted => "tree_started",
            RecordKind::StepAdopted => "step_adopted",
            RecordKind::EffectPending => "effect_pending",
            RecordKind::EffectSettled => "effect_settled",
            RecordKind::EffectResolved => "effect_resolved",
            RecordKind::EffectReplayed => "effect_replayed",
            RecordKind::SignalsAdmitted => "signals_admitted",
            RecordKind::CancelRequested => "cancel_requested",
            RecordKind::Terminated => "terminated",
            RecordKind::ChildStarted => "child_started",
            RecordKind::ControlDelivered => "control_delivered",
            RecordKind::EffectRetrying => "effect_retrying",
            RecordKind::ChildrenReady => "children_ready",
        }
    }
}

impl fmt::Display for RecordKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

// Read with its `kind` first (see `tagged`): a log folds without buffering
// each body.
tagged::tag_first! {
tag = "kind", remote = "RecordBody", expecting = "a record body";
/// The facts a record carries.
// Records are short-lived values between the engine and the log; boxing the
// large start variant would only add an allocation to every tree start.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RecordBody {
    /// A tree started: its root process, program, input, grants and initial state.
    TreeStarted {
        /// The caller's start id.
        start: StartId,
        /// The root process.
        root: ProcessId,
        /// The exact program (boxed: it is the largest member of any record,
        /// and every record body is as large as its largest kind).
        #[serde(serialize_with = "program_text")]
        program: Box<ProgramRef>,
        /// The validated input.
        input: Payload,
        /// The root's budget.
        budget: Budget,
        /// The root's capabilities.
        capabilities: Capabilities,
        /// The host deadline, if any.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        deadline: Option<Timestamp>,
        /// The tree's limits (absent: the defaults).
        #[serde(default, skip_serializing_if = "is_default_limits")]
        limits: TreeLimits,
        /// When the tree was started (engine clock; absent in logs written
        /// before starts recorded it).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        created: Option<Timestamp>,
        /// The labels the host gave the start (absent: none).
        #[serde(default, skip_serializing_if = "Labels::is_empty")]
        labels: Labels,
        /// The state `Definition::start` produced (after a restore round trip).
        state: ExecutionState,
    },
    /// A step was adopted.
    StepAdopted {
        /// The process.
        process: ProcessId,
        /// The step's number (from 0).
        step: u64,
        /// The adopted execution state, whole; absent when `state_change`
        /// holds it (a record holds exactly one of the two).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        state: Option<ExecutionState>,
        /// The adopted execution state as its change from the process's
        /// state before the step (a large state's small change).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        state_change: Option<StateChange>,
        /// The transition (consumed count, effects, output or failure).
        transition: Transition,
    },
    /// A dispatch is about to be sent.
    EffectPending {
        /// The process.
        process: ProcessId,
        /// The effect.
        effect: EffectId,
    },
    /// An attempt of a pending dispatch failed, and its retry policy tries
    /// it again once `at` has passed (a durable timer).
    EffectRetrying {
        /// The process.
        process: ProcessId,
        /// The effect.
        effect: EffectId,
        /// Why the attempt failed.
        failure: Failure,
        /// The failed attempt's meter usage.
        #[serde(default, skip_serializing_if = "Meters::is_empty")]
        usage: Meters,
        /// When the next attempt may start (engine clock).
        at: Timestamp,
    },
    /// An effect settled.
    EffectSettled {
        /// The process.
        process: ProcessId,
        /// The effect.
        effect: EffectId,
        /// Its settlement.
        settlement: Settlement,
    },
    /// A children wait (`wait_children`) settled as the last open effect of
    /// its batch: its outcomes are not written, since they are the
    /// terminations of the children it names as the log holds them at this
    /// record, in the order of its keys, and the fold takes them from there.
    /// A wait settled while another effect of its batch is open is an
    /// `effect_settled` record with its outcomes, as every wait was in logs
    /// written before this record existed.
    ChildrenReady {
        /// The process.
        process: ProcessId,
        /// The `wait_children` effect.
        effect: EffectId,
    },
    /// The host resolved an unknown effect.
    EffectResolved {
        /// The process.
        process: ProcessId,
        /// The effect.
        effect: EffectId,
        /// The host's settlement (never unknown).
        settlement: Settlement,
    },
    /// The host asked to replay an unknown effect under its identity.
    EffectReplayed {
        /// The process.
        process: ProcessId,
        /// The effect.
        effect: EffectId,
    },
    /// Host signals were admitted.
    SignalsAdmitted {
        /// The recipient.
        process: ProcessId,
        /// The signals, in admission order.
        signals: Vec<Signal>,
    },
    /// Cancellation was requested.
    CancelRequested {
        /// The process.
        process: ProcessId,
        /// Host or parent cancellation.
        cause: Cause,
        /// Why.
        reason: String,
    },
    /// A process terminated.
    Terminated {
        /// The process.
        process: ProcessId,
        /// How.
        termination: Termination,
    },
    /// A child started: the child process and the parent's receipt.
    ChildStarted {
        /// The parent.
        parent: ProcessId,
        /// The parent's start effect.
        effect: EffectId,
        /// The child.
        child: ProcessId,
        /// Its key under the parent, written only in logs from before the
        /// kernel named it by `effect`: absent, it is the key of the
        /// parent's start effect; where present it must be that key.
        #[serde(
            default,
            skip_serializing_if = "Option::is_none",
            deserialize_with = "crate::payload::deserialize_present"
        )]
        key: Option<ChildKey>,
        /// Its program's descriptor name (for people).
        name: crate::ids::Name,
        /// Its exact program (`ProgramRef::digest`; the full ref is the
        /// parent's declared child), written only in older logs: absent,
        /// it is the program of the parent's start effect; where present
        /// it must be that program.
        #[serde(
            default,
            skip_serializing_if = "Option::is_none",
            deserialize_with = "crate::payload::deserialize_present"
        )]
        program: Option<crate::digest::Digest>,
        /// Its validated input, written only in logs from before the
        /// kernel named it by `effect`: absent, it is the input of the
        /// parent's start effect, which the parent's step recorded, so a
        /// large input (a team's turn) is written and hashed once. Where
        /// present it must be that input.
        #[serde(
            default,
            skip_serializing_if = "Option::is_none",
            deserialize_with = "crate::payload::deserialize_present"
        )]
        input: Option<Payload>,
        /// Its budget (debited from the parent); absent where it is the
        /// budget the parent's start effect asked for (a start granted
        /// exactly, or clipped to no less), written where a clipped grant
        /// gave less, and always in older logs.
        #[serde(
            default,
            skip_serializing_if = "Option::is_none",
            deserialize_with = "crate::payload::deserialize_present"
        )]
        budget: Option<Budget>,
        /// Its capabilities, written only in older logs: absent, they are
        /// those of the parent's start effect; where present they must be
        /// those.
        #[serde(
            default,
            skip_serializing_if = "Option::is_none",
            deserialize_with = "crate::payload::deserialize_present"
        )]
        capabilities: Option<Capabilities>,
        /// Its initial state; absent where that is its input (a program
        /// that keeps its input as its state, as a team's coordinator keeps
        /// its turn), so the input is not written a second time.
        #[serde(
            default,
            skip_serializing_if = "Option::is_none",
            deserialize_with = "crate::payload::deserialize_present"
        )]
        state: Option<ExecutionState>,
    },
    /// A control reached a child: the delivery and the parent's receipt.
    ControlDelivered {
        /// The parent.
        parent: ProcessId,
        /// The parent's control effect.
        effect: EffectId,
        /// The child.
        child: ProcessId,
        /// What was delivered.
        delivery: Delivery,
    },
}
}

fn is_default_limits(limits: &TreeLimits) -> bool {
    *limits == TreeLimits::default()
}

/// A program reference's JSON text (`serde_json::to_string`), kept per
/// thread for the last few programs: a tree's start record writes its
/// program, and a host starts many trees of the same few programs. `None`
/// when the thread's cache is in use or gone (the caller writes it then).
fn program_json(program: &ProgramRef) -> Option<Arc<str>> {
    /// The programs a thread keeps the text of.
    const KEPT: usize = 4;
    thread_local! {
        static WRITTEN: std::cell::RefCell<Vec<(ProgramRef, Arc<str>)>> =
            const { std::cell::RefCell::new(Vec::new()) };
    }
    WRITTEN
        .try_with(|written| {
            let mut written = written.try_borrow_mut().ok()?;
            if let Some((_, text)) = written.iter().find(|(kept, _)| kept == program) {
                return Some(Arc::clone(text));
            }
            let text: Arc<str> = serde_json::to_string(program).ok()?.into();
            if written.len() == KEPT {
                written.remove(0);
            }
            written.push((program.clone(), Arc::clone(&text)));
            Some(text)
        })
        .ok()
        .flatten()
}

/// Writes a start's program as serde_json writes it, from the text kept for
/// it when this thread wrote the same program before: a host starts the
/// same few programs again and again, and a program's reference (four
/// digests, the children's and a name) is most of what writing a start
/// costs. The text goes as a raw JSON value, so serde_json's serializers
/// (and the kernel's own) write it as it is; a value kept is reused only for
/// an equal program, so it is never stale.
fn program_text<S: serde::Serializer>(
    program: &ProgramRef,
    serializer: S,
) -> Result<S::Ok, S::Error> {
    use serde::ser::SerializeStruct;
    let Some(text) = program_json(program) else {
        return program.serialize(serializer);
    };
    let token = crate::canonical::RAW_VALUE_TOKEN;
    let mut raw = serializer.serialize_struct(token, 1)?;
    raw.serialize_field(token, &*text)?;
    raw.end()
}

tagged::tag_first! {
tag = "delivery", remote = "Delivery", expecting = "a delivery";
/// What a control delivered to a child.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Delivery {
    /// A signal appended to the child's mailbox.
    Signal {
        /// The signal.
        signal: Signal,
    },
    /// A cancellation intent.
    Cancel {
        /// Why.
        reason: String,
    },
}
}

impl RecordBody {
    /// Bytes of state folding this body builds beyond its own: the whole
    /// state a step recorded as a change makes (0 for any other body).
    pub fn folded_state_bytes(&self) -> u64 {
        match self {
            RecordBody::StepAdopted {
                state_change: Some(change),
                ..
            } => change.state_bytes(),
            _ => 0,
        }
    }

    /// The record kind.
    pub fn kind(&self) -> RecordKind {
        match self {
            RecordBody::TreeStarted { .. } => RecordKind::TreeStarted,
            RecordBody::StepAdopted { .. } => RecordKind::StepAdopted,
            RecordBody::EffectPending { .. } => RecordKind::EffectPending,
            RecordBody::EffectSettled { .. } => RecordKind::EffectSettled,
            RecordBody::EffectResolved { .. } => RecordKind::EffectResolved,
            RecordBody::EffectReplayed { .. } => RecordKind::EffectReplayed,
            RecordBody::SignalsAdmitted { .. } => RecordKind::SignalsAdmitted,
            RecordBody::CancelRequested { .. } => RecordKind::CancelRequested,
            RecordBody::Terminated { .. } => RecordKind::Terminated,
            RecordBody::ChildStarted { .. } => RecordKind::ChildStarted,
            RecordBody::ControlDelivered { .. } => RecordKind::ControlDelivered,
            RecordBody::EffectRetrying { .. } => RecordKind::EffectRetrying,
            RecordBody::ChildrenReady { .. } => RecordKind::ChildrenReady,
        }
    }
}

/// One log record: `{seq, prev, kind, body}` and `hash = H(prev ‖ seq ‖ body)`.
/// The body bytes are kept exactly as hashed.
///
/// A record sealed in this process ([`Record::seal`], [`Record::from_parts`])
/// remembers what it computed its hash from, so that [`is_chain`] can take
/// its hash at its word for as long as its fields are unchanged; a record
/// read back with a stored hash ([`Record::stored`]) has no such memory.
/// Equality compares the five fields only.
#[derive(Clone)]
pub struct Record {
    /// Position in the log, from 1.
    pub seq: u64,
    /// Hash of the previous record (`Digest::ZERO` for the first).
    pub prev: Digest,
    /// This record's hash.
    pub hash: Digest,
    /// The body's kind.
    pub kind: RecordKind,
    /// The body's JSON bytes, exactly as hashed.
    pub body: Arc<[u8]>,
    /// What the hash was computed from, when this process computed it
    /// (shared by clones, and apart, so that a record without one is no
    /// larger for it).
    seal: Option<Arc<Seal>>,
}

/// What a record's chain hash was computed from: its sequence, the previous
/// hash and its body (held, so that its bytes cannot change and its
/// allocation cannot be reused while the seal lives), with the hash.
struct Seal {
    seq: u64,
    prev: Digest,
    hash: Digest,
    body: Arc<[u8]>,
}

impl Record {
    /// Seals a body as record `seq` after `prev`.
    pub fn seal(seq: u64, prev: Digest, body: &RecordBody) -> Record {
        Record::from_parts(seq, prev, body.kind(), write::encode(body))
    }

    /// Builds a record from stored parts, computing its hash (use [`verify`]
    /// to check stored hashes).
    pub fn from_parts(seq: u64, prev: Digest, kind: RecordKind, body: Arc<[u8]>) -> Record {
        let hash = chain_hash(seq, prev, &body);
        Record {
            seq,
            prev,
            hash,
            kind,
            seal: Some(Arc::new(Seal {
                seq,
                prev,
                hash,
                body: Arc::clone(&body),
            })),
            body,
        }
    }

    /// A record as a store read it back, its hash as stored (not checked:
    /// [`verify`] checks it).
    pub fn stored(
        seq: u64,
        prev: Digest,
        hash: Digest,
        kind: RecordKind,
        body: Arc<[u8]>,
    ) -> Record {
        Record {
            seq,
            prev,
            hash,
            kind,
            body,
            seal: None,
        }
    }

    /// Decodes the body.
    pub fn decode(&self) -> Result<RecordBody, serde_json::Error> {
        serde_json::from_slice(&self.body)
    }

    /// The record without what it was sealed from, for a store that keeps
    /// records in memory: a seal's allocation is as large as the record,
    /// and what it saves is hashing the record again when it is written.
    pub(crate) fn unsealed(mut self) -> Record {
        self.seal = None;
        self
    }

    /// Whether the hash is the chain hash of `(seq, prev, body)`: known
    /// without hashing while the record is as it was sealed, else computed.
    fn hash_is_chain_hash(&self) -> bool {
        match &self.seal {
            Some(seal)
                if seal.seq == self.seq
                    && seal.prev == self.prev
                    && seal.hash == self.hash
                    && Arc::ptr_eq(&seal.body, &self.body) =>
            {
                true
            }
            _ => chain_hash(self.seq, self.prev, &self.body) == self.hash,
        }
    }
}

impl PartialEq for Record {
    fn eq(&self, other: &Record) -> bool {
        self.seq == other.seq
            && self.prev == other.prev
            && self.hash == other.hash
            && self.kind == other.kind
            && self.body == other.body
    }
}

impl Eq for Record {}

impl fmt::Debug for Record {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Record")
            .field("seq", &self.seq)
            .field("kind", &self.kind)
            .field("hash", &self.hash)
            .field("bytes", &self.body.len())
            .finish()
    }
}

/// The chain hash of a record.
pub fn chain_hash(seq: u64, prev: Digest, body: &[u8]) -> Digest {
    Digest::of_parts(
        Purpose::LogChain,
        &[prev.as_bytes(), &seq.to_le_bytes(), body],
    )
}

/// Whether `records` follow `(after_seq, after_hash)` as a chain: contiguous
/// sequence numbers, each `prev` the hash before it, and each hash the
/// chain hash of its record. A record sealed in this process and unchanged
/// since is not hashed again. Unlike [`verify`], bodies are not decoded.
pub fn is_chain(after_seq: u64, after_hash: Digest, records: &[Record]) -> bool {
    let (mut seq, mut head) = (after_seq, after_hash);
    for record in records {
        if Some(record.seq) != seq.checked_add(1)
            || record.prev != head
            || !record.hash_is_chain_hash()
        {
            return false;
        }
        seq = record.seq;
        head = record.hash;
    }
    true
}

/// Where and why a log failed verification.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("log verification failed at record {seq}: {reason}")]
pub struct VerifyError {
    /// The first record that does not verify.
    pub seq: u64,
    /// What is wrong with it.
    pub reason: String,
}

/// Verifies a run of records that should follow `(after_seq, after_hash)`:
/// contiguous sequence numbers, each `prev` the previous hash, each hash
/// recomputed from the stored bytes, each body decodable with the kind it
/// claims. Returns the head `(seq, hash)`.
pub fn verify(
    after_seq: u64,
    after_hash: Digest,
    records: &[Record],
) -> Result<(u64, Digest), VerifyError> {
    let (mut seq, mut head) = (after_seq, after_hash);
    for record in records {
        check(seq, head, record)?;
        seq = record.seq;
        head = record.hash;
    }
    Ok((seq, head))
}

/// Checks that `record` follows `(seq, head)` and that its bytes are its
/// hash's and decode to its kind; returns the decoded body.
pub(crate) fn check(seq: u64, head: Digest, record: &Record) -> Result<RecordBody, VerifyError> {
    let fail = |reason: String| VerifyError {
        seq: record.seq,
        reason,
    };
    if record.seq != seq + 1 {
        return Err(fail(format!("expected sequence {}", seq + 1)));
    }
    if record.prev != head {
        return Err(fail(
            "prev does not match the previous record's hash".into(),
        ));
    }
    if chain_hash(record.seq, record.prev, &record.body) != record.hash {
        return Err(fail("hash does not match the record's bytes".into()));
    }
    match record.decode() {
        Ok(body) if body.kind() == record.kind => Ok(body),
        Ok(body) => Err(fail(format!(
            "body is {} but the record says {}",
            body.kind(),
            record.kind
        ))),
        Err(error) => Err(fail(format!("body does not decode: {error}"))),
    }
}

/// The whole tree state at a sequence number, with the chain head it covers.
#[derive(Clone, PartialEq, Eq)]
pub struct Snapshot {
    /// The last record folded into the state.
    pub seq: u64,
    /// That record's hash.
    pub head: Digest,
    /// The serialized tree state.
    pub state: Arc<[u8]>,
}

impl fmt::Debug for Snapshot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Snapshot")
            .field("seq", &self.seq)
            .field("head", &self.head)
            .field("bytes", &self.state.len())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::digest::Digest;

    /// A tree's start carrying `payload` as its input and its state.
    fn tree_started(labels: Labels, created: Option<Timestamp>, payload: Payload) -> RecordBody {
        let start = StartId::new("acme", "s").expect("valid");
        RecordBody::TreeStarted {
            root: ProcessId::root(&start),
            start,
            program: Box::new(crate::protocol::ProgramRef {
                name: crate::ids::Name::new("p").expect("valid"),
                contract: Digest::ZERO,
                implementation: Digest::ZERO,
                configuration: Digest::ZERO,
                children: Vec::new(),
                digest: Digest::ZERO,
            }),
            input: payload.clone(),
            budget: Budget::unlimited(),
            capabilities: Capabilities::none(),
            deadline: None,
            limits: TreeLimits::default(),
            created,
            labels,
            state: ExecutionState(payload),
        }
    }

    fn started(labels: Labels, created: Option<Timestamp>) -> String {
        let body = tree_started(labels, created, Payload::null());
        String::from_utf8(Record::seal(1, Digest::ZERO, &body).body.to_vec()).expect("utf-8")
    }

    fn decode(kind: RecordKind, body: &str) -> Result<RecordBody, serde_json::Error> {
        Record::from_parts(1, Digest::ZERO, kind, body.as_bytes().into()).decode()
    }

    /// `body` with its `kind` member moved from the front to the end.
    fn kind_last(body: &str) -> String {
        let (tag, rest) = body[1..].split_once(',').expect("a tag and more");
        assert!(tag.starts_with(r#""kind":"#), "{body}");
        format!("{{{},{tag}}}", &rest[..rest.len() - 1])
    }

    fn pending() -> (RecordBody, String) {
        let process = ProcessId::root(&StartId::new("acme", "s").expect("valid"));
        let body = RecordBody::EffectPending {
            process,
            effect: EffectId::new(process, 3, 1),
        };
        let text = String::from_utf8(Record::seal(1, Digest::ZERO, &body).body.to_vec());
        (body, text.expect("utf-8"))
    }

    /// A chain of `len` sealed records with distinct bodies.
    fn sealed_chain(len: usize) -> Vec<Record> {
        let mut prev = Digest::ZERO;
        (0..len)
            .map(|at| {
                let body = format!(r#"{{"kind":"effect_replayed","n":{at}}}"#);
                let record = Record::from_parts(
                    at as u64 + 1,
                    prev,
                    RecordKind::EffectReplayed,
                    body.as_bytes().into(),
                );
                prev = record.hash;
                record
            })
            .collect()
    }

    /// What [`is_chain`] must answer, every hash computed again.
    fn is_chain_by_hashing(after_seq: u64, after_hash: Digest, records: &[Record]) -> bool {
        let (mut seq, mut head) = (after_seq, after_hash);
        records.iter().all(|record| {
            let follows = Some(record.seq) == seq.checked_add(1)
                && record.prev == head
                && record.hash == chain_hash(record.seq, record.prev, &record.body);
            (seq, head) = (record.seq, record.hash);
            follows
        })
    }

    proptest::proptest! {
        /// Whatever is done to sealed records afterwards (a field changed,
        /// a body swapped for equal or other bytes, a record rebuilt as
        /// read back, records swapped or cloned), `is_chain` answers what
        /// hashing every record again answers: a seal vouches only for the
        /// values it was made from.
        #[test]
        fn is_chain_answers_as_hashing_again_would(
            len in 1usize..6,
            changes in proptest::collection::vec((0u8..10, 0usize..6, proptest::prelude::any::<u8>()), 0..3),
        ) {
            let mut records = sealed_chain(len);
            for (change, at, byte) in changes {
                let at = at % len;
                let record = &mut records[at];
                match change {
                    0 => record.hash = Digest::from_bytes([byte; 32]),
                    1 => record.prev = Digest::from_bytes([byte; 32]),
                    2 => record.seq = record.seq.wrapping_add(u64::from(byte) + 1),
                    // The same bytes in another allocation: still a chain.
                    3 => record.body = record.body.to_vec().into(),
                    4 => record.body = format!(r#"{{"n":{byte}}}"#).as_bytes().into(),
                    // Read back with its hash as stored: hashed again.
                    5 => {
                        *record = Record::stored(
                            record.seq,
                            record.prev,
                            record.hash,
                            record.kind,
                            record.body.clone(),
                        );
                    }
                    6 => records.swap(at, (at + 1) % len),
                    7 => *record = record.clone(),
                    // A body changed and its own hash made to match.
                    8 => {
                        record.body = format!(r#"{{"m":{byte}}}"#).as_bytes().into();
                        record.hash = chain_hash(record.seq, record.prev, &record.body);
                    }
                    _ => record.kind = RecordKind::Terminated,
                }
            }
            proptest::prop_assert_eq!(
                is_chain(0, Digest::ZERO, &records),
                is_chain_by_hashing(0, Digest::ZERO, &records)
            );
            // Whatever the first record now claims to follow.
            let (seq, prev) = (records[0].seq.wrapping_sub(1), records[0].prev);
            proptest::prop_assert_eq!(
                is_chain(seq, prev, &records),
                is_chain_by_hashing(seq, prev, &records)
            );
            let tail = &records[1..];
            proptest::prop_assert_eq!(
                is_chain(records[0].seq, records[0].hash, tail),
                is_chain_by_hashing(records[0].seq, records[0].hash, tail)
            );
        }
    }

    /// A seal costs a record one pointer, held or not (a store that keeps
    /// records in memory keeps many).
    #[test]
    fn a_seal_costs_a_record_one_pointer() {
        assert!(
            std::mem::size_of::<Record>() <= 104,
            "{}",
            std::mem::size_of::<Record>()
        );
        assert_eq!(
            std::mem::size_of::<Option<Arc<Seal>>>(),
            std::mem::size_of::<usize>()
        );
    }

    /// Untouched sealed records, and the same records read back with their
    /// hashes, are a chain; one that starts anywhere but where it follows
    /// is not, nor one after the last sequence number there is.
    #[test]
    fn sealed_records_are_a_chain_only_where_they_follow() {
        let records = sealed_chain(4);
        assert!(is_chain(0, Digest::ZERO, &records));
        let stored: Vec<Record> = records
            .iter()
            .map(|r| Record::stored(r.seq, r.prev, r.hash, r.kind, r.body.clone()))
            .collect();
        assert_eq!(stored, records, "equality ignores the seal");
        assert!(is_chain(0, Digest::ZERO, &stored));
        assert!(is_chain(2, records[1].hash, &records[2..]));
        assert!(!is_chain(1, records[1].hash, &records[2..]));
        assert!(!is_chain(2, records[0].hash, &records[2..]));
        assert!(!is_chain(u64::MAX, records[1].hash, &records[2..]));
        assert!(is_chain(7, Digest::ZERO, &[]));
    }

    /// Bodies are read tag first, their payloads borrowed as text; one whose
    /// `kind` comes later (valid JSON Baton never writes) is read the
    /// buffered way, to the same body.
    #[test]
    fn a_body_decodes_to_itself_wherever_its_kind_is() {
        let labels = Labels::from_pairs([("team", "billing")]).expect("valid");
        let state = Payload::parse_str(
            r#"{"notes":["a\"b\\c\u0001",{"deep":[1,-2.5,null,true]}],"n":18446744073709551615}"#,
        )
        .expect("valid");
        let body = tree_started(labels, Some(Timestamp(7)), state);
        let text =
            String::from_utf8(Record::seal(1, Digest::ZERO, &body).body.to_vec()).expect("utf-8");
        assert!(text.starts_with(r#"{"kind":"tree_started","#), "{text}");
        let (pending, pending_text) = pending();
        for (kind, body, text) in [
            (RecordKind::TreeStarted, body, text),
            (RecordKind::EffectPending, pending, pending_text),
        ] {
            assert_eq!(decode(kind, &text).expect("decodes"), body, "{text}");
            let moved = kind_last(&text);
            assert_eq!(decode(kind, &moved).expect("decodes"), body, "{moved}");
            // A value's members are sorted, so its `kind` is rarely first.
            let value = serde_json::to_value(&body).expect("encodes");
            assert_eq!(
                serde_json::from_value::<RecordBody>(value).expect("decodes"),
                body
            );
        }
    }

    /// A start's program is written as its reference's own serialization
    /// whether this thread wrote it before or not: twice in a row, for more
    /// programs than a thread keeps the text of taken in turns, and for a
    /// program that differs from one just written only in its name.
    #[test]
    fn a_starts_program_is_written_as_itself_however_often() {
        let program = |n: u8, name: &str| crate::protocol::ProgramRef {
            name: crate::ids::Name::new(format!("{name}{n}")).expect("valid"),
            contract: Digest::of(Purpose::Contract, &[n]),
            implementation: Digest::ZERO,
            configuration: Digest::of(Purpose::Configuration, &[n]),
            children: (0..n % 3)
                .map(|c| Digest::of(Purpose::Program, &[n, c]))
                .collect(),
            digest: Digest::of(Purpose::Program, &[n]),
        };
        for _ in 0..2 {
            for n in 0..7 {
                for chosen in [program(n, "p"), program(n, "p"), program(n, "q")] {
                    let mut body = tree_started(Labels::default(), None, Payload::null());
                    if let RecordBody::TreeStarted { program: slot, .. } = &mut body {
                        **slot = chosen.clone();
                    }
                    let expected = serde_json::to_string(&chosen).expect("encodes");
                    let text =
                        String::from_utf8(Record::seal(1, Digest::ZERO, &body).body.to_vec())
                            .expect("utf-8");
                    assert!(
                        text.contains(&format!(r#","program":{expected},"input""#)),
                        "{text}"
                    );
                    // serde_json's own writer (the seal's fallback) agrees.
                    assert_eq!(serde_json::to_string(&body).expect("encodes"), text);
                    assert_eq!(
                        decode(RecordKind::TreeStarted, &text).expect("decodes"),
                        body
                    );
                    let value = serde_json::to_value(&body).expect("encodes");
                    assert_eq!(
                        value["program"],
                        serde_json::to_value(&chosen).expect("encodes")
                    );
                }
            }
        }
    }

    /// What the derived reader refused is refused on either path, naming
    /// what is wrong: an unknown member, an unknown kind, a second `kind`,
    /// no `kind`, a wrong type.
    #[test]
    fn a_malformed_body_is_refused_wherever_its_kind_is() {
        let (_, text) = pending();
        let open = &text[..text.len() - 1];
        let refused = |body: &str, expected: &str| {
            for body in [body.to_owned(), kind_last(body)] {
                let error = decode(RecordKind::EffectPending, &body)
                    .expect_err(&body)
                    .to_string();
                assert!(error.contains(expected), "{body}: {error}");
            }
        };
        refused(&format!(r#"{open},"extra":1}}"#), "unknown field `extra`");
        refused(
            &text.replace("effect_pending", "effect_pondering"),
            "unknown variant `effect_pondering`",
        );
        refused(&format!(r#"{open},"kind":"effect_pending"}}"#), "kind");
        refused(
            &text.replace(r#""kind":"effect_pending""#, r#""kind":7"#),
            "invalid type",
        );
        let without = text.replace(r#""kind":"effect_pending","#, "");
        let error = decode(RecordKind::EffectPending, &without).expect_err("no kind");
        assert!(
            error.to_string().contains("missing field `kind`"),
            "{error}"
        );
        for other in ["{}", "[]", "7", r#""kind""#] {
            assert!(decode(RecordKind::EffectPending, other).is_err(), "{other}");
        }
    }

    /// A start without labels or a start time writes the bytes it wrote
    /// before either existed, so older logs hash as they did; one with them
    /// records both.
    #[test]
    fn labels_and_start_time_are_omitted_when_absent() {
        let plain = started(Labels::new(), None);
        assert!(
            !plain.contains("labels") && !plain.contains("created"),
            "{plain}"
        );
        let labels = Labels::from_pairs([("team", "billing")]).expect("valid");
        let full = started(labels, Some(Timestamp(7)));
        assert!(
            full.contains(r#""created":7,"labels":{"team":"billing"}"#),
            "{full}"
        );
        let decoded = Record::from_parts(
            1,
            Digest::ZERO,
            RecordKind::TreeStarted,
            full.as_bytes().into(),
        )
        .decode()
        .expect("decodes");
        assert!(matches!(
            decoded,
            RecordBody::TreeStarted {
                created: Some(Timestamp(7)),
                ..
            }
        ));
    }
}
