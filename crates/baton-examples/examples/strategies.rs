//! The strategy scenarios; see [`baton_examples::strategies`].
//!
//! Run one with `cargo run -p baton-examples --example strategies -- NAME`
//! (sequential, parallel, router, planner, swarm or hierarchy), or every
//! one without a name.

use baton_examples::strategies::{Scenario, run};

#[tokio::main]
async fn main() -> Result<(), baton_examples::strategies::Failure> {
    let scenarios = match std::env::args().nth(1) {
        Some(name) => vec![Scenario::named(&name).ok_or(format!("no scenario {name}"))?],
        None => Scenario::ALL.to_vec(),
    };
    for scenario in scenarios {
        println!("{}", run(scenario).await?);
    }
    Ok(())
}
