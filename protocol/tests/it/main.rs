//! Every integration test of `uctel-protocol` in one binary, a module per former `tests/*.rs`
//! file (one link step instead of one per file). One module alone:
//! `cargo test -p uctel-protocol --test it -- frame_props::`.

mod adversarial_decoders;
mod control_messages;
mod frame_props;
mod frame_size;
mod tracker_props;
