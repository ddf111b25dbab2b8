//! The worked example of the team specification; see
//! [`baton_examples::team_review`].
//!
//! Run it with `cargo run -p baton-examples --example team_review`.

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("{}", baton_examples::team_review::run().await?);
    Ok(())
}
