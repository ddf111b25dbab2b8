//! The tests of `baton-server`: the HTTP API on a real server over loopback
//! (`api`), the web console without a browser (`console`), its OpenAPI
//! document (`openapi`), and `serve` processes killed and interrupted
//! (`process`).

// The helpers beside the tests panic on a broken setup, as the tests may (clippy.toml allows
// `unwrap` only inside the test functions themselves).
#![allow(clippy::unwrap_used)]

mod api;
mod console;
mod forward;
mod openapi;
mod process;
mod support;
