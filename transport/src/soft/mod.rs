//! The soft transport: RoCEv2 UC in user space over UDP, and a sans-IO RC engine ([`rc`]).

pub mod capacity;
pub mod device;
pub mod engine;
pub mod fault;
pub mod icrc;
pub mod link;
pub mod memory;
pub mod packet;
pub mod psn;
pub mod qp;
pub mod rc;
pub mod udp;
