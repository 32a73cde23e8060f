//! The `uctel-agent` integration tests that must have the process to themselves: `idle`
//! measures the CPU time of the whole process (`/proc/self/stat`), so no other test may
//! run beside it. `cargo test -p uctel-agent --test slow`.

mod idle;
