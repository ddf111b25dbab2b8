//! The MCP example (`baton-examples`' `mcp_tools`) against the reference
//! server `@modelcontextprotocol/server-everything`, which `.ci/run`
//! installs: the model adds through one tool and echoes through another,
//! and each call is charged one `mcp_calls`.

#[tokio::test]
async fn the_mcp_example_adds_and_echoes_through_the_reference_server() {
    let lines = baton_examples::mcp_tools::run()
        .await
        .unwrap_or_else(|error| panic!("the example runs: {error}"));
    assert_eq!(
        lines,
        [
            "tools: ev_echo, ev_get-sum",
            "answer: The server said: Echo: the sum is 42",
            "charged: 2 mcp_calls of 5",
        ]
    );
}
