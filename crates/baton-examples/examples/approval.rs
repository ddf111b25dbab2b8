//! A program that waits for a person's answer; see [`baton_examples::approval`].
//!
//! Run it with `cargo run -p baton-examples --example approval`.

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    for line in baton_examples::approval::run().await? {
        println!("{line}");
    }
    Ok(())
}
