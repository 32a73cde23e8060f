//! Every integration test of `uctel-common` in one binary, a module per former `tests/*.rs`
//! file (one link step instead of one per file). One module alone:
//! `cargo test -p uctel-common --test it -- signals::`.

mod signals;
