//! Every integration test of `uctel-transport` in one binary, a module per former `tests/*.rs`
//! file (one link step instead of one per file). One module alone:
//! `cargo test -p uctel-transport --test it -- engine_uc::`.
//!
//! `udp_gso_capture` is in `tests/slow/`: its `AF_PACKET` socket sees every interface's frames,
//! and the loopback traffic of the other modules' tests, running beside it here, filled its
//! receive buffer (none of the veth's frames captured).

mod engine_device;
mod engine_props;
mod engine_rc;
mod engine_rxe_golden;
mod engine_uc;
mod idle_wake;
mod loopback_soft;
mod packet_pcap;
mod packet_props;
mod post_send_batch;
mod rc_device;
mod shared_srq;
mod udp_loopback;
