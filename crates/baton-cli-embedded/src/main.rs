//! `acme`: a host's own command line, as a user writes it.
//!
//! Two programs of the host's own, both activities whose outside call moves
//! money and so may never be sent twice (replay policy `Never`):
//!
//! - `acme.refund` asks a person to approve each refund first (an addressed
//!   wait answered with `{"decision": "approve"}`), then refunds;
//! - `acme.charge` charges at once.
//!
//! The call writes a line to the host's ledger (the file `ledger.txt` in the
//! working directory, or `$ACME_LEDGER`) keyed by the call's idempotency
//! key, and reports on stderr when it starts and when it is done, so the
//! tests can stop the process while a call is in flight. The host's hooks
//! settle a call that a crash left unknown when the ledger shows it
//! happened; any other is left for `acme resolve`.
//!
//! Everything else is `baton_cli::main`.

use std::io::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use baton::run::{Payload, Settlement};
use baton::workflow::{Activity, ActivityConfig, ActivityContext, ActivityError, Approval};
use baton_cli::{HostHooks, LostEffect, Registry, Resolution};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// What to refund or charge.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct Order {
    /// The order.
    order: String,
    /// The amount, in cents.
    amount_cents: u64,
    /// How long the payment provider takes before it moves the money.
    #[serde(default)]
    delay_ms: u64,
    /// How long it takes to answer after it moved the money.
    #[serde(default)]
    hold_ms: u64,
}

/// The provider's receipt.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct Receipt {
    /// The receipt id.
    receipt: String,
}

fn main() -> ExitCode {
    match registry() {
        Ok(registry) => baton_cli::main(registry),
        Err(error) => {
            eprintln!("error: {error}");
            ExitCode::FAILURE
        }
    }
}

fn registry() -> Result<Registry, Box<dyn std::error::Error>> {
    let refund = payment(
        "acme.refund",
        "Refund an order once a person approves.",
        Approval::Required,
    )?;
    let charge = payment("acme.charge", "Charge an order.", Approval::NotRequired)?;
    Ok(Registry::builder()
        .program(&refund.program())
        .program(&charge.program())
        .default_scope("acme")
        .hooks(Ledger)
        .build()?)
}

/// A payment activity: one call to the provider, never sent twice.
fn payment(
    name: &str,
    description: &str,
    approval: Approval,
) -> Result<Activity<Order, Receipt>, Box<dyn std::error::Error>> {
    let config = ActivityConfig {
        build: "acme payments 1".into(),
        approval,
        timeout: Duration::from_secs(300),
        ..ActivityConfig::new(name, description)
    };
    Ok(Activity::new(config, move_money)?)
}

/// The provider call: waits `delay_ms`, writes the ledger line, waits
/// `hold_ms`, answers with the receipt.
async fn move_money(order: Order, context: ActivityContext) -> Result<Receipt, ActivityError> {
    let key = context.idempotency_key();
    let clock = context.clock().clone();
    eprintln!("acme: moving money for {} ({key})", order.order);
    clock
        .sleep_until(clock.now().plus(Duration::from_millis(order.delay_ms)))
        .await;
    let receipt = format!("r-{}", order.order);
    let mut ledger = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(ledger_path())
        .map_err(|error| ActivityError::new(format!("cannot open the ledger: {error}")))?;
    writeln!(
        ledger,
        "{key} {} {} {receipt}",
        order.order, order.amount_cents
    )
    .and_then(|()| ledger.sync_all())
    .map_err(|error| ActivityError::new(format!("cannot write the ledger: {error}")))?;
    eprintln!("acme: moved money for {} ({key})", order.order);
    clock
        .sleep_until(clock.now().plus(Duration::from_millis(order.hold_ms)))
        .await;
    Ok(Receipt { receipt })
}

fn ledger_path() -> PathBuf {
    std::env::var_os("ACME_LEDGER").map_or_else(|| PathBuf::from("ledger.txt"), PathBuf::from)
}

/// The host's hooks: a payment a crash left unknown happened exactly when
/// the ledger holds its idempotency key.
struct Ledger;

impl HostHooks for Ledger {
    fn resolve_lost(&self, lost: &LostEffect<'_>) -> Option<Resolution> {
        let ledger = std::fs::read_to_string(ledger_path()).ok()?;
        let key = lost.effect.to_string();
        let line = ledger.lines().find(|line| line.starts_with(&key))?;
        let receipt = line.split(' ').nth(3)?.to_owned();
        Some(Resolution {
            settlement: Settlement::ok(Payload::encode(&Receipt { receipt }).ok()?),
            note: "a payment the ledger shows was made".to_owned(),
        })
    }
}
