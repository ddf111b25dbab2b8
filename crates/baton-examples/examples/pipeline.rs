//! A workflow of two pure stages on the embedded SQLite store; see
//! [`baton_examples::pipeline`].
//!
//! Run it with `cargo run -p baton-examples --example pipeline`.

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    for line in baton_examples::pipeline::run().await? {
        println!("{line}");
    }
    Ok(())
}
