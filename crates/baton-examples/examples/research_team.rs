//! A research team with tools that touch the world; see
//! [`baton_examples::research_team`].
//!
//! Run it with `cargo run -p baton-examples --example research_team`
//! (offline), or with `OPENAI_MODEL`/`OPENAI_API_KEY`/`OPENAI_BASE_URL` or
//! `ANTHROPIC_MODEL`/`ANTHROPIC_API_KEY` set to use a real model.

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    for line in baton_examples::research_team::run().await? {
        println!("{line}");
    }
    Ok(())
}
