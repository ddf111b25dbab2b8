//! "Input with timeout": an input gate races a deadline inside
//! `FirstSuccess` under a manual clock; see
//! [`baton_examples::input_with_timeout`].
//!
//! Run it with `cargo run -p baton-examples --example input_with_timeout`.

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    for line in baton_examples::input_with_timeout::run().await? {
        println!("{line}");
    }
    Ok(())
}
