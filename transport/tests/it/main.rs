//! Every integration test of `uctel-transport` in one binary, a module per former `tests/*.rs`
//! file (one link step instead of one per file). One module alone:
//! `cargo test -p uctel-transport --test it -- engine_uc::`.

mod engine_device;
mod engine_props;
mod engine_rc;
mod engine_rxe_golden;
mod engine_uc;
mod idle_wake;
mod loopback_soft;
mod packet_pcap;
mod packet_props;
mod rc_device;
mod udp_gso_capture;
mod udp_loopback;
