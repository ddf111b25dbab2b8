//! An interaction whose tools come from the reference MCP server; see
//! [`baton_examples::mcp_tools`].
//!
//! Run it with `cargo run -p baton-examples --example mcp_tools` once the
//! reference server is installed (`.ci/run` installs it; `BATON_MCP_SERVER`
//! names another launcher).

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    for line in baton_examples::mcp_tools::run().await? {
        println!("{line}");
    }
    Ok(())
}
