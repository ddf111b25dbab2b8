//! The tests of `baton-server`: the HTTP API on a real server over loopback
//! (`api`), its OpenAPI document (`openapi`), and `serve` processes killed
//! and interrupted (`process`).

mod api;
mod openapi;
mod process;
mod support;
