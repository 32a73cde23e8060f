//! The `uctel-transport` integration tests that must not run beside the others:
//! `udp_gso_capture` reads an `AF_PACKET` socket that sees the frames of every interface, so
//! the other modules' loopback traffic would fill its receive buffer and crowd out the veth's
//! frames it captures. `cargo test -p uctel-transport --test slow`.

mod udp_gso_capture;
