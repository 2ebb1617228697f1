//! The HTTP tests of `nucleus-server`, one test binary (a binary each cost 15 s of compiling
//! and linking): the real server over loopback with the tiny random model, one module per
//! subject. `cargo test --release -p nucleus-server --test http [MODULE::]`.

mod common;

mod access;
mod apis;
mod choices;
mod community_http;
mod editor_fields;
mod errors;
mod explain;
mod fields;
mod infill;
mod kv_cache;
mod lifecycle;
mod limits;
mod model_server_protocol;
mod page;
mod routes;
mod speculation;
mod structured;
mod tokens;
mod tool_calls;
