//! `uctel-transport`: the verbs-shaped transport API and its implementations.
//!
//! uctel pushes telemetry frames over RDMA **Unreliable Connection** (UC) queue pairs. Agent and
//! collector code is written once against [`api`] and runs on either transport, chosen at run
//! time from configuration ([`api::DeviceConfig`]):
//!
//! * **soft** ([`soft`]) — RoCEv2 UC in user space over a UDP socket: real BTH/RETH/ImmDt
//!   headers and ICRC, wire-compatible with the Linux `rdma_rxe` driver. Runs anywhere; the
//!   default.
//! * **verbs** (`verbs`, cargo feature `verbs`) — real RDMA through libibverbs (`rdma-sys`); the
//!   only module allowed `unsafe` code.
//!
//! # Layout
//!
//! ```text
//! api.rs            Device → ProtectionDomain → MemoryRegion / CompletionQueue / QueuePair,
//!                   SendWr / RecvWr / WorkCompletion, QpEndpoint, errors, UcDropReason,
//!                   the object-safe backend traits both transports implement
//! soft/packet.rs    UC packet views and reprs (BTH, RETH, ImmDt), parse / emit
//! soft/icrc.rs      RoCEv2 ICRC over the rebuilt IP/UDP pseudo header
//! soft/engine.rs    sans-IO UC queue pair: state machine, requester segmentation,
//!                   responder rules of rxe_resp.c, drop counting
//! soft/memory.rs    soft memory regions and the lkey/rkey table
//! soft/device.rs    the soft "NIC": QPN demux, ICRC check, CQs, async events, progress modes
//! soft/link.rs      the datagram Link trait and the in-memory MemoryLink
//! soft/udp.rs       UdpLink (recvmmsg / sendmmsg) and the UdpSink baseline
//! soft/fault.rs     seeded FaultInjector (drop, corrupt, duplicate, reorder, delay)
//! verbs/            libibverbs transport (feature `verbs`)
//! ```
//!
//! # Example
//!
//! Two soft devices joined by an in-memory link; the collector side registers a ring and the
//! agent side RDMA-writes a frame into it with an immediate.
//!
//! ```
//! use uctel_transport::api::*;
//! use uctel_transport::soft::device::{ProgressMode, SoftConfig, SoftDevice};
//! use uctel_transport::soft::link::MemoryLink;
//!
//! let (la, lb) = MemoryLink::pair("10.0.0.1:4791".parse()?, "10.0.0.2:4791".parse()?);
//! let cfg = SoftConfig { progress: ProgressMode::BusyPoll, ..SoftConfig::default() };
//! let agent = Device::from(SoftDevice::with_link(&cfg, Box::new(la))?);
//! let collector = Device::from(SoftDevice::with_link(&cfg, Box::new(lb))?);
//!
//! let (apd, cpd) = (agent.alloc_pd()?, collector.alloc_pd()?);
//! let (acq, ccq) = (agent.create_cq(64)?, collector.create_cq(64)?);
//! let attr = |cq, access| QpInitAttr {
//!     send_cq: cq, recv_cq: cq, max_send_wr: 32, max_recv_wr: 32, access, max_mtu: None,
//! };
//! let aqp = apd.create_qp(&attr(&acq, AccessFlags::LOCAL_WRITE))?;
//! let cqp = cpd.create_qp(&attr(&ccq, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE))?;
//! let ring = cpd.reg_mr(4096, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)?;
//! cqp.post_recv(&[RecvWr::zero_length(0)])?;
//! aqp.connect(&cqp.local_endpoint())?;
//! cqp.connect(&aqp.local_endpoint())?;
//!
//! let src = apd.reg_mr(64, AccessFlags::LOCAL_WRITE)?;
//! src.write_at(0, b"frame #7")?;
//! aqp.post_send(&[SendWr::write_with_imm(7, Some(Sge::new(&src, 0, 8)), ring.addr() + 512, ring.rkey(), 7)])?;
//!
//! let mut wcs = [WorkCompletion::default(); 4];
//! let mut n = 0;
//! for _ in 0..1000 {
//!     n = ccq.poll(&mut wcs); // busy-poll mode: polling drives the device
//!     if n > 0 { break; }
//! }
//! assert_eq!((n, wcs[0].opcode, wcs[0].imm), (1, WcOpcode::RecvRdmaWithImm, Some(7)));
//! let mut got = [0u8; 8];
//! ring.read_at(512, &mut got)?;
//! assert_eq!(&got, b"frame #7");
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

pub mod api;
pub mod device;
pub mod soft;
mod sync;
pub mod verbs;
mod wake;
