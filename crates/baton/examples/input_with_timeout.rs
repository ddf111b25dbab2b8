//! "Input with timeout" through the facade: an input gate races a deadline
//! inside `FirstSuccess`. The program is the coordination crate's example;
//! run it with `cargo run -p baton --example input_with_timeout`.

#[path = "../../baton-coordination/examples/input_with_timeout.rs"]
mod race;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    race::main()
}
