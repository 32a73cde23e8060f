//! `uctel-transport`: the verbs-shaped transport API and its two implementations.
//!
//! uctel pushes telemetry frames over RDMA **Unreliable Connection** (UC) queue pairs. Agent and
//! collector code is written once against [`api`] and runs on either transport, chosen at run
//! time from configuration ([`device::DeviceConfig`], opened with
//! [`Device::open`](api::Device::open)):
//!
//! * **soft** ([`soft`]) — RoCEv2 UC in user space over a UDP socket: real BTH/RETH/ImmDt
//!   headers and ICRC, wire-compatible with the Linux `rdma_rxe` driver. Runs anywhere; the
//!   default.
//! * **verbs** ([`verbs`], cargo feature `verbs`) — real RDMA through libibverbs (`rdma-sys`).
//!   Without the feature only its configuration type is built.
//!
//! # Layout
//!
//! ```text
//! api/              the leaf every other module builds on; names neither transport
//!   types.rs        constants (RoCEv2 port, PSN/QPN masks, IBTA message limit), AccessFlags,
//!                   Mtu, QpState, GID <-> IP, QpEndpoint, PortAttr
//!   error.rs        one error enum per operation
//!   stats.rs        UcDropReason, DropCounters, QpStats, DeviceStats
//!   event.rs        AsyncEvent, QpErrorCause
//!   mr.rs wr.rs cq.rs qp.rs pd.rs context.rs
//!                   one file per verbs object: its handle (MemoryRegion, SendWr/RecvWr/
//!                   WorkCompletion, CompletionQueue/CompletionChannel, QueuePair,
//!                   ProtectionDomain, Device) and the object-safe backend trait behind it
//! device.rs         DeviceConfig and Device::open: the only module naming both transports
//! soft/             the soft transport
//!   packet/         packet views and reprs, parse / emit, one file per header: bth.rs (BTH
//!                   view, BthRepr over either opcode set), opcode.rs (UC Opcode, RcOpcode),
//!                   reth.rs (RETH, ImmDt), aeth.rs (AETH, NAK codes, RNR timer); uc.rs
//!                   PacketRepr, rc.rs RcPacketRepr
//!   psn.rs          Psn: 24-bit PSN arithmetic modulo 2^24 (IBTA 9.7.1)
//!   icrc.rs         RoCEv2 ICRC over the rebuilt IP/UDP pseudo header
//!   qp.rs           QpCore, what UC and RC queue pairs share: state machine, post checks,
//!                   flush-to-error, error events, WRITE placement, SEND scatter, request
//!                   layout; the WR, CQ and error types of both
//!   engine.rs       sans-IO UC queue pair on QpCore: segmentation, the UC responder rules
//!                   of rxe_resp.c (resync, drop until FIRST), drop counting
//!   rc/             sans-IO RC queue pair on QpCore: PSN window, ACK/NAK/RNR NAK, go-back-N,
//!                   retransmit and RNR timers (poll_timeout / handle_timeout), rxe's rules;
//!                   requester.rs (requester, completer), responder.rs
//!   memory.rs       soft memory regions and the lkey/rkey table
//!   device/         the soft "NIC": SoftConfig, shared state, progress rounds (QPN demux,
//!                   ICRC check, receive path), QP/CQ/MR/PD handles, progress modes
//!   link.rs         the datagram Link trait and the in-memory MemoryLink
//!   udp/            UdpLink (recvmmsg / sendmmsg, GSO / GRO); sink.rs: the UdpSink baseline
//!   fault.rs        seeded FaultInjector (drop, corrupt, duplicate, reorder, delay)
//! verbs/            the libibverbs transport (feature `verbs`); ffi.rs holds all its unsafe
//! wake.rs           eventfd waker and poll(2) sleep, shared by both transports
//! sync.rs           the poison-tolerant lock both transports use
//! prefetch.rs       prefetch-for-write hint the soft RDMA WRITE placement uses
//! ```
//!
//! Imports between these modules go one way: `api` ← `soft`, `verbs` ← `device`, with `wake`
//! and `sync` below the transports; no module imports one that imports it back.
//!
//! # Lints
//!
//! The workspace denies `unsafe_code`; this crate also warns on `missing_docs`,
//! `unreachable_pub` and `clippy::undocumented_unsafe_blocks` (clippy runs with `-D
//! warnings`). Every module but `verbs::ffi` and `prefetch` is `forbid(unsafe_code)`, so an
//! `unsafe` block can only ever be added there, next to the other libibverbs calls, with a
//! `// SAFETY:` note; `prefetch` holds one, a CPU prefetch hint (no memory is accessed).
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
//!     qp_type: QpType::Uc,
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

#![warn(missing_docs)]
#![warn(unreachable_pub)]
#![warn(clippy::undocumented_unsafe_blocks)]

#[forbid(unsafe_code)]
pub mod api;
#[forbid(unsafe_code)]
pub mod device;
mod prefetch;
#[forbid(unsafe_code)]
pub mod soft;
#[forbid(unsafe_code)]
mod sync;
pub mod verbs;
#[forbid(unsafe_code)]
mod wake;
