//! The `uctel-collector` integration tests that must have the process to themselves: `idle`
//! measures the CPU time of the whole process (`/proc/self/stat`), so no other test may
//! run beside it. `cargo test -p uctel-collector --test slow`.

mod idle;
#[path = "../it/support/mod.rs"]
mod support;
