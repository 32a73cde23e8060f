//! Owned libibverbs objects: one RAII type per verbs object, each freeing its handle in `Drop`
//! and holding an `Arc` of its parent so the parent outlives it (a QP keeps its PD and CQs, a
//! PD keeps its device context, ...). Everything `unsafe` of the verbs transport is in this
//! file; the types here expose safe methods with plain Rust values.
//!
//! Calls and structures are those of `infiniband/verbs.h` (rdma-core 44, as bound by
//! `rdma-sys` 0.3.0). Thread safety: libibverbs and its providers serialise concurrent calls on
//! one object internally (rdma-core `libibverbs/man/ibv_*` "thread safe"; rxe's provider takes
//! a spinlock per queue), so the wrappers are `Send + Sync`.

use std::alloc::{self, Layout};
use std::ffi::CStr;
use std::io;
use std::mem::MaybeUninit;
use std::os::raw::{c_int, c_uint, c_void};
use std::ptr::{self, NonNull};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use rdma_sys as sys;

use super::codes::qp_mask;
use crate::api::RcAttr;

// The shared receive queue (`ibv_create_srq`), in its own file for size; same rules.
mod srq;
pub(crate) use srq::Srq;

/// `struct ibv_async_event` with the event type as a plain integer. rdma-sys binds the type as
/// a Rust enum, and a value the kernel adds later would be undefined behaviour there.
#[repr(C)]
struct AsyncEventRaw {
    element: AsyncElement,
    event_type: c_uint,
}

/// The `element` union of `struct ibv_async_event` (cq, qp, srq, wq pointers or `port_num`).
#[repr(C)]
#[derive(Clone, Copy)]
union AsyncElement {
    ptr: *mut c_void,
    port_num: c_int,
}

// Layout equality with the bound struct (a pointer-sized union, then a 4-byte enum).
const _: () =
    assert!(std::mem::size_of::<AsyncEventRaw>() == std::mem::size_of::<sys::ibv_async_event>());

extern "C" {
    /// `_ibv_query_gid_ex` (libibverbs, symbol version IBVERBS_1.11): the C `ibv_query_gid_ex`
    /// is a `static inline` wrapper around it, and rdma-sys's allowlist (`ibv_.*`) misses the
    /// leading underscore, so it is declared here with the C prototype.
    fn _ibv_query_gid_ex(
        context: *mut sys::ibv_context,
        port_num: u32,
        gid_index: u32,
        entry: *mut sys::ibv_gid_entry,
        flags: u32,
        entry_size: usize,
    ) -> c_int;

    /// `ibv_get_async_event`, declared with [`AsyncEventRaw`] (same layout as the bound one).
    #[link_name = "ibv_get_async_event"]
    fn ibv_get_async_event_raw(context: *mut sys::ibv_context, event: *mut AsyncEventRaw) -> c_int;

    /// `ibv_ack_async_event`, declared with [`AsyncEventRaw`].
    #[link_name = "ibv_ack_async_event"]
    fn ibv_ack_async_event_raw(event: *mut AsyncEventRaw);
}

/// The OS error left in `errno` by the last failed verbs call; `EIO` when the call failed
/// without setting it (some providers return NULL with errno 0).
fn last_error() -> io::Error {
    let e = io::Error::last_os_error();
    match e.raw_os_error() {
        Some(0) | None => io::Error::from_raw_os_error(libc::EIO),
        Some(_) => e,
    }
}

/// An error from a verbs call that returns the errno value itself (`ibv_modify_qp`,
/// `ibv_post_send`, ...): a positive value is the errno, a negative one its negation, and 0
/// with a failure still means something went wrong.
fn error_from_ret(ret: c_int) -> io::Error {
    match ret {
        r if r > 0 => io::Error::from_raw_os_error(r),
        r if r < 0 => io::Error::from_raw_os_error(r.saturating_neg()),
        _ => last_error(),
    }
}

/// Sets `O_NONBLOCK` on a file descriptor owned by libibverbs.
fn set_nonblocking(fd: c_int) -> io::Result<()> {
    // SAFETY: fcntl on a descriptor we do not close; F_GETFL/F_SETFL have no memory effects.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    if flags < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: as above.
    if unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Waits until `fd` is readable or `timeout` passes; `Ok(true)` when readable. `EINTR` counts
/// as "not readable yet" (the caller loops).
fn wait_readable(fd: c_int, timeout: Duration) -> io::Result<bool> {
    let mut pfd = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    let ms = c_int::try_from(timeout.as_millis()).unwrap_or(c_int::MAX);
    // SAFETY: `pfd` is a valid pollfd for the duration of the call; nfds = 1.
    let n = unsafe { libc::poll(&mut pfd, 1, ms) };
    if n < 0 {
        let e = io::Error::last_os_error();
        return if e.kind() == io::ErrorKind::Interrupted {
            Ok(false)
        } else {
            Err(e)
        };
    }
    Ok(n > 0 && pfd.revents & libc::POLLIN != 0)
}

/// Waits until one of `fds` is readable or `timeout` passes; sets `ready[i]` for each readable
/// (or failed: the caller's next call finds out) descriptor `fds[i]`. `EINTR` returns with
/// nothing set (the caller re-polls its CQs anyway).
pub(crate) fn poll_readable(
    fds: &[c_int],
    timeout: Duration,
    ready: &mut Vec<bool>,
) -> io::Result<()> {
    let mut pfds: Vec<libc::pollfd> = fds
        .iter()
        .map(|&fd| libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    ready.clear();
    ready.resize(fds.len(), false);
    // Round up, so that a wait shorter than a millisecond still sleeps.
    let ms = c_int::try_from(timeout.as_micros().div_ceil(1000)).unwrap_or(c_int::MAX);
    let nfds = libc::nfds_t::try_from(pfds.len()).unwrap_or(libc::nfds_t::MAX);
    // SAFETY: `pfds` holds `nfds` valid pollfd entries for the duration of the call.
    let n = unsafe { libc::poll(pfds.as_mut_ptr(), nfds, ms) };
    if n < 0 {
        let e = io::Error::last_os_error();
        return if e.kind() == io::ErrorKind::Interrupted {
            Ok(())
        } else {
            Err(e)
        };
    }
    for (r, p) in ready.iter_mut().zip(&pfds) {
        *r = p.revents & (libc::POLLIN | libc::POLLERR | libc::POLLHUP | libc::POLLNVAL) != 0;
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Devices
// ---------------------------------------------------------------------------------------------

/// The RDMA devices present (`ibv_get_device_list`), freed on drop.
pub(crate) struct DeviceList {
    list: NonNull<*mut sys::ibv_device>,
    len: usize,
}

impl DeviceList {
    /// Lists the devices. A host without RDMA support makes libibverbs return NULL (errno
    /// `ENOSYS` when the kernel has no RDMA at all) or an empty list; both come back as an
    /// empty list here, with the OS error for the first case.
    pub(crate) fn new() -> (Option<Self>, Option<io::Error>) {
        let mut n: c_int = 0;
        // SAFETY: `n` is a valid out-pointer; the returned array is owned by us until
        // ibv_free_device_list.
        let p = unsafe { sys::ibv_get_device_list(&mut n) };
        match NonNull::new(p) {
            None => (None, Some(last_error())),
            Some(list) => (
                Some(Self {
                    list,
                    len: usize::try_from(n).unwrap_or(0),
                }),
                None,
            ),
        }
    }

    /// Number of devices.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Name of device `i` (`ibv_get_device_name`), `None` past the end.
    pub(crate) fn name(&self, i: usize) -> Option<String> {
        let dev = self.device(i)?;
        // SAFETY: `dev` is an element of the live list; the name is a NUL-terminated string
        // owned by the device, copied out before the list can be freed.
        let name = unsafe { sys::ibv_get_device_name(dev) };
        if name.is_null() {
            return None;
        }
        // SAFETY: non-null, NUL-terminated (libibverbs stores `char name[IBV_SYSFS_NAME_MAX]`).
        Some(
            unsafe { CStr::from_ptr(name) }
                .to_string_lossy()
                .into_owned(),
        )
    }

    fn device(&self, i: usize) -> Option<*mut sys::ibv_device> {
        if i >= self.len {
            return None;
        }
        // SAFETY: the list holds `len` device pointers followed by NULL; `i < len`.
        let dev = unsafe { *self.list.as_ptr().add(i) };
        (!dev.is_null()).then_some(dev)
    }

    /// Opens device `i` (`ibv_open_device`).
    pub(crate) fn open(&self, i: usize) -> io::Result<Context> {
        let name = self.name(i).unwrap_or_default();
        let dev = self
            .device(i)
            .ok_or_else(|| io::Error::from_raw_os_error(libc::ENODEV))?;
        // SAFETY: `dev` is valid while the list lives; the context stays valid after the list
        // is freed (ibv_free_device_list(3): "the devices opened remain usable").
        let ctx = unsafe { sys::ibv_open_device(dev) };
        let ptr = NonNull::new(ctx).ok_or_else(last_error)?;
        Ok(Context { ptr, name })
    }
}

impl Drop for DeviceList {
    fn drop(&mut self) {
        // SAFETY: the list came from ibv_get_device_list and is freed once.
        unsafe { sys::ibv_free_device_list(self.list.as_ptr()) };
    }
}

/// Device capabilities used by the transport (`ibv_query_device`).
#[derive(Clone, Copy, Debug)]
pub(crate) struct DeviceCaps {
    pub(crate) max_qp_wr: u32,
    pub(crate) max_cqe: u32,
    pub(crate) max_mr_size: u64,
    pub(crate) phys_port_cnt: u8,
    /// `max_srq`: 0 on a device without shared receive queues.
    pub(crate) max_srq: u32,
    /// `max_srq_wr`.
    pub(crate) max_srq_wr: u32,
}

/// Port attributes used by the transport (`ibv_query_port`).
#[derive(Clone, Copy, Debug)]
pub(crate) struct PortInfo {
    /// `enum ibv_port_state` (4 = ACTIVE).
    pub(crate) state: u32,
    /// `enum ibv_mtu` of the active MTU (1 = 256 … 5 = 4096).
    pub(crate) active_mtu: u32,
    pub(crate) max_msg_sz: u32,
    pub(crate) gid_tbl_len: u32,
    /// `IBV_LINK_LAYER_*` (2 = Ethernet).
    pub(crate) link_layer: u8,
}

/// One GID table entry (`struct ibv_gid_entry`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct GidEntry {
    pub(crate) gid: [u8; 16],
    pub(crate) index: u32,
    /// `enum ibv_gid_type` (0 = IB, 1 = RoCE v1, 2 = RoCE v2).
    pub(crate) gid_type: u32,
    /// ifindex of the netdev the GID belongs to (0 for IB).
    pub(crate) ndev_ifindex: u32,
}

/// An asynchronous event, read with the element it names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum RawAsyncEvent {
    /// `IBV_EVENT_CQ_ERR`, with the CQ's handle.
    CqError { cq_handle: u32 },
    /// A QP event (`IBV_EVENT_QP_FATAL`, `_REQ_ERR`, `_ACCESS_ERR`, …) with the QP number.
    Qp { event_type: u32, qpn: u32 },
    /// A port event (`IBV_EVENT_PORT_ACTIVE`, `_PORT_ERR`, `_GID_CHANGE`, …).
    Port { event_type: u32, port: u32 },
    /// `IBV_EVENT_DEVICE_FATAL`.
    DeviceFatal,
    /// An SRQ event (`IBV_EVENT_SRQ_ERR`, `IBV_EVENT_SRQ_LIMIT_REACHED`) with the SRQ's handle.
    Srq { event_type: u32, srq_handle: u32 },
    /// Anything else (WQ events, which this transport does not create objects for).
    Other { event_type: u32 },
}

/// `enum ibv_event_type` values (verbs.h), as integers.
pub(crate) mod event_type {
    pub(crate) const CQ_ERR: u32 = 0;
    pub(crate) const QP_FATAL: u32 = 1;
    pub(crate) const QP_REQ_ERR: u32 = 2;
    pub(crate) const QP_ACCESS_ERR: u32 = 3;
    pub(crate) const COMM_EST: u32 = 4;
    pub(crate) const SQ_DRAINED: u32 = 5;
    pub(crate) const PATH_MIG: u32 = 6;
    pub(crate) const PATH_MIG_ERR: u32 = 7;
    pub(crate) const DEVICE_FATAL: u32 = 8;
    pub(crate) const PORT_ACTIVE: u32 = 9;
    pub(crate) const PORT_ERR: u32 = 10;
    pub(crate) const LID_CHANGE: u32 = 11;
    pub(crate) const PKEY_CHANGE: u32 = 12;
    pub(crate) const SM_CHANGE: u32 = 13;
    pub(crate) const SRQ_ERR: u32 = 14;
    pub(crate) const SRQ_LIMIT_REACHED: u32 = 15;
    pub(crate) const QP_LAST_WQE_REACHED: u32 = 16;
    pub(crate) const CLIENT_REREGISTER: u32 = 17;
    pub(crate) const GID_CHANGE: u32 = 18;
}

/// An opened device (`struct ibv_context`), closed on drop.
pub(crate) struct Context {
    ptr: NonNull<sys::ibv_context>,
    name: String,
}

// SAFETY: an ibv_context may be used from any thread; libibverbs serialises its internal state
// (rdma-core: "all verbs are thread safe").
unsafe impl Send for Context {}
// SAFETY: as above; no method takes `&mut self` and the struct holds no Rust-side mutable state.
unsafe impl Sync for Context {}

impl Context {
    /// Device name (`rxe0`, `mlx5_0`).
    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    fn raw(&self) -> *mut sys::ibv_context {
        self.ptr.as_ptr()
    }

    /// `ibv_query_device`.
    pub(crate) fn query_device(&self) -> io::Result<DeviceCaps> {
        // SAFETY: ibv_device_attr is plain old data; all-zero is a valid value.
        let mut attr: sys::ibv_device_attr = unsafe { std::mem::zeroed() };
        // SAFETY: live context, valid out-pointer.
        let ret = unsafe { sys::ibv_query_device(self.raw(), &mut attr) };
        if ret != 0 {
            return Err(error_from_ret(ret));
        }
        Ok(DeviceCaps {
            max_qp_wr: u32::try_from(attr.max_qp_wr).unwrap_or(0),
            max_cqe: u32::try_from(attr.max_cqe).unwrap_or(0),
            max_mr_size: attr.max_mr_size,
            phys_port_cnt: attr.phys_port_cnt,
            max_srq: u32::try_from(attr.max_srq).unwrap_or(0),
            max_srq_wr: u32::try_from(attr.max_srq_wr).unwrap_or(0),
        })
    }

    /// `ibv_query_port` (through rdma-sys's `___ibv_query_port`, which fills the full
    /// `struct ibv_port_attr` including `link_layer`).
    pub(crate) fn query_port(&self, port: u8) -> io::Result<PortInfo> {
        // SAFETY: ibv_port_attr is plain old data; all-zero is a valid value.
        let mut attr: sys::ibv_port_attr = unsafe { std::mem::zeroed() };
        // SAFETY: live context, valid out-pointer of the size the provider is told.
        let ret = unsafe { sys::___ibv_query_port(self.raw(), port, &mut attr) };
        if ret != 0 {
            return Err(error_from_ret(ret));
        }
        Ok(PortInfo {
            state: attr.state,
            active_mtu: attr.active_mtu,
            max_msg_sz: attr.max_msg_sz,
            gid_tbl_len: u32::try_from(attr.gid_tbl_len).unwrap_or(0),
            link_layer: attr.link_layer,
        })
    }

    /// `ibv_query_gid_ex(ctx, port, index, &entry, 0)`. An unused table slot fails with
    /// `ENODATA`.
    pub(crate) fn query_gid_ex(&self, port: u8, index: u32) -> io::Result<GidEntry> {
        // SAFETY: ibv_gid_entry is plain old data; all-zero is a valid value.
        let mut e: sys::ibv_gid_entry = unsafe { std::mem::zeroed() };
        // SAFETY: live context; `e` is a valid out-pointer of `size_of::<ibv_gid_entry>()`
        // bytes, which is what the entry_size argument tells libibverbs.
        let ret = unsafe {
            _ibv_query_gid_ex(
                self.raw(),
                u32::from(port),
                index,
                &mut e,
                0,
                std::mem::size_of::<sys::ibv_gid_entry>(),
            )
        };
        if ret != 0 {
            return Err(error_from_ret(ret));
        }
        // SAFETY: every bit pattern of the union is a valid `[u8; 16]`.
        let gid = unsafe { e.gid.raw };
        Ok(GidEntry {
            gid,
            index: e.gid_index,
            gid_type: e.gid_type,
            ndev_ifindex: e.ndev_ifindex,
        })
    }

    /// Makes [`Context::next_async_event`] non-blocking (`O_NONBLOCK` on `async_fd`, as
    /// ibv_get_async_event(3) describes).
    pub(crate) fn set_async_nonblocking(&self) -> io::Result<()> {
        // SAFETY: reading a plain field of the live context.
        let fd = unsafe { (*self.raw()).async_fd };
        set_nonblocking(fd)
    }

    /// Takes one asynchronous event if one is pending (`ibv_get_async_event` on the
    /// non-blocking fd), acknowledging it at once. `None` when there is none.
    pub(crate) fn next_async_event(&self) -> Option<RawAsyncEvent> {
        let mut ev = AsyncEventRaw {
            element: AsyncElement {
                ptr: ptr::null_mut(),
            },
            event_type: 0,
        };
        // SAFETY: live context; `ev` has the layout of `struct ibv_async_event`.
        let ret = unsafe { ibv_get_async_event_raw(self.raw(), &mut ev) };
        if ret != 0 {
            return None;
        }
        let out = match ev.event_type {
            event_type::CQ_ERR => {
                // SAFETY: for CQ events the union holds the CQ pointer.
                let cq = unsafe { ev.element.ptr }.cast::<sys::ibv_cq>();
                let cq_handle = if cq.is_null() {
                    0
                } else {
                    // SAFETY: for CQ events the element is the CQ, alive until the event is
                    // acked (ibv_destroy_cq waits for acknowledged async events).
                    unsafe { (*cq).handle }
                };
                RawAsyncEvent::CqError { cq_handle }
            }
            t @ (event_type::QP_FATAL
            | event_type::QP_REQ_ERR
            | event_type::QP_ACCESS_ERR
            | event_type::COMM_EST
            | event_type::SQ_DRAINED
            | event_type::PATH_MIG
            | event_type::PATH_MIG_ERR
            | event_type::QP_LAST_WQE_REACHED) => {
                // SAFETY: for QP events the union holds the QP pointer.
                let qp = unsafe { ev.element.ptr }.cast::<sys::ibv_qp>();
                let qpn = if qp.is_null() {
                    0
                } else {
                    // SAFETY: for QP events the element is the QP, alive until the event is
                    // acked.
                    unsafe { (*qp).qp_num }
                };
                RawAsyncEvent::Qp { event_type: t, qpn }
            }
            t @ (event_type::PORT_ACTIVE
            | event_type::PORT_ERR
            | event_type::LID_CHANGE
            | event_type::PKEY_CHANGE
            | event_type::SM_CHANGE
            | event_type::CLIENT_REREGISTER
            | event_type::GID_CHANGE) => {
                // SAFETY: for port events the union holds the port number.
                let port = u32::try_from(unsafe { ev.element.port_num }).unwrap_or(0);
                RawAsyncEvent::Port {
                    event_type: t,
                    port,
                }
            }
            t @ (event_type::SRQ_ERR | event_type::SRQ_LIMIT_REACHED) => {
                // SAFETY: for SRQ events the union holds the SRQ pointer.
                let srq = unsafe { ev.element.ptr }.cast::<sys::ibv_srq>();
                let srq_handle = if srq.is_null() {
                    0
                } else {
                    // SAFETY: for SRQ events the element is the SRQ, alive until the event is
                    // acked (ibv_destroy_srq waits for acknowledged async events).
                    unsafe { (*srq).handle }
                };
                RawAsyncEvent::Srq {
                    event_type: t,
                    srq_handle,
                }
            }
            event_type::DEVICE_FATAL => RawAsyncEvent::DeviceFatal,
            t => RawAsyncEvent::Other { event_type: t },
        };
        // SAFETY: every event taken with ibv_get_async_event must be acked exactly once.
        unsafe { ibv_ack_async_event_raw(&mut ev) };
        Some(out)
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        // SAFETY: every child holds an Arc<Context>, so none is alive any more; closed once.
        unsafe { sys::ibv_close_device(self.raw()) };
    }
}

// ---------------------------------------------------------------------------------------------
// Protection domain and memory regions
// ---------------------------------------------------------------------------------------------

/// A protection domain (`ibv_alloc_pd`), deallocated on drop.
pub(crate) struct Pd {
    ptr: NonNull<sys::ibv_pd>,
    ctx: Arc<Context>,
}

// SAFETY: see `Context`: verbs objects may be used from any thread.
unsafe impl Send for Pd {}
// SAFETY: no Rust-side mutable state.
unsafe impl Sync for Pd {}

impl Pd {
    /// `ibv_alloc_pd`.
    pub(crate) fn new(ctx: &Arc<Context>) -> io::Result<Arc<Self>> {
        // SAFETY: live context.
        let p = unsafe { sys::ibv_alloc_pd(ctx.raw()) };
        let ptr = NonNull::new(p).ok_or_else(last_error)?;
        Ok(Arc::new(Self {
            ptr,
            ctx: Arc::clone(ctx),
        }))
    }

    /// The device context.
    pub(crate) fn context(&self) -> &Arc<Context> {
        &self.ctx
    }
}

impl Drop for Pd {
    fn drop(&mut self) {
        // SAFETY: MRs and QPs hold an Arc<Pd>, so none is alive; deallocated once.
        unsafe { sys::ibv_dealloc_pd(self.ptr.as_ptr()) };
    }
}

/// A registered memory region that owns its bytes: a zeroed, page-aligned allocation
/// registered with `ibv_reg_mr`. Deregistered, then freed, on drop.
///
/// The bytes are never exposed as a Rust reference: the device may write them at any time
/// (inbound RDMA WRITE, receive WRs), so all access is by raw-pointer copies.
pub(crate) struct Mr {
    mr: NonNull<sys::ibv_mr>,
    buf: NonNull<u8>,
    layout: Layout,
    lkey: u32,
    rkey: u32,
    pd: Arc<Pd>,
}

// SAFETY: the region is accessed only through raw-pointer copies; the verbs handle is
// thread-safe (see `Context`).
unsafe impl Send for Mr {}
// SAFETY: as above; concurrent copies in and out race only on the bytes, as with the device.
unsafe impl Sync for Mr {}

/// Alignment of registered buffers (one page).
const MR_ALIGN: usize = 4096;

impl Mr {
    /// Allocates `len` zeroed bytes and registers them with `access` (`ibv_access_flags`
    /// bits). `len` must be at least 1.
    pub(crate) fn new(pd: &Arc<Pd>, len: usize, access: u32) -> io::Result<Self> {
        let layout = Layout::from_size_align(len.max(1), MR_ALIGN)
            .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
        // SAFETY: the layout has a non-zero size.
        let raw = unsafe { alloc::alloc_zeroed(layout) };
        let buf = NonNull::new(raw).ok_or_else(|| io::Error::from_raw_os_error(libc::ENOMEM))?;
        let access = c_int::try_from(access).unwrap_or(0);
        // SAFETY: `buf` points to `len` writable bytes that stay allocated until after
        // ibv_dereg_mr (Drop deregisters first, then frees).
        let mr = unsafe { sys::ibv_reg_mr(pd.ptr.as_ptr(), raw.cast(), len, access) };
        let Some(mr) = NonNull::new(mr) else {
            let e = last_error();
            // SAFETY: allocated above with this layout, not registered, freed once.
            unsafe { alloc::dealloc(raw, layout) };
            return Err(e);
        };
        // SAFETY: a successfully registered MR; lkey/rkey are plain fields.
        let (lkey, rkey) = unsafe { ((*mr.as_ptr()).lkey, (*mr.as_ptr()).rkey) };
        Ok(Self {
            mr,
            buf,
            layout,
            lkey,
            rkey,
            pd: Arc::clone(pd),
        })
    }

    /// Virtual address of byte 0 (what the peer puts in RETH and what SGEs use).
    pub(crate) fn addr(&self) -> u64 {
        self.buf.as_ptr() as u64
    }

    /// Length in bytes.
    pub(crate) fn len(&self) -> usize {
        self.layout.size()
    }

    pub(crate) fn lkey(&self) -> u32 {
        self.lkey
    }

    pub(crate) fn rkey(&self) -> u32 {
        self.rkey
    }

    /// The PD the region is registered in.
    pub(crate) fn pd(&self) -> &Arc<Pd> {
        &self.pd
    }

    /// Copies `out.len()` bytes at `offset` out of the region; `false` when out of bounds.
    pub(crate) fn read(&self, offset: usize, out: &mut [u8]) -> bool {
        if offset
            .checked_add(out.len())
            .is_none_or(|end| end > self.len())
        {
            return false;
        }
        // SAFETY: bounds checked above; the source is inside our allocation and `out` is a
        // distinct Rust buffer. The device may be writing the same bytes concurrently: that is
        // the documented snapshot semantics (callers validate sequence and CRC), and no Rust
        // reference to the region exists.
        unsafe {
            ptr::copy_nonoverlapping(self.buf.as_ptr().add(offset), out.as_mut_ptr(), out.len())
        };
        true
    }

    /// Copies `data` into the region at `offset`; `false` when out of bounds.
    pub(crate) fn write(&self, offset: usize, data: &[u8]) -> bool {
        if offset
            .checked_add(data.len())
            .is_none_or(|end| end > self.len())
        {
            return false;
        }
        // SAFETY: bounds checked above; destination inside our allocation, source a distinct
        // Rust slice; see `read` for concurrent device access.
        unsafe {
            ptr::copy_nonoverlapping(data.as_ptr(), self.buf.as_ptr().add(offset), data.len())
        };
        true
    }
}

impl Drop for Mr {
    fn drop(&mut self) {
        // SAFETY: deregistered once. After ibv_dereg_mr returns the device no longer accesses
        // the pages (verbs semantics: WRs still naming the lkey fail with a protection error),
        // so freeing the buffer afterwards is sound.
        unsafe {
            sys::ibv_dereg_mr(self.mr.as_ptr());
            alloc::dealloc(self.buf.as_ptr(), self.layout);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Completion channel and completion queue
// ---------------------------------------------------------------------------------------------

/// A completion event channel (`ibv_create_comp_channel`), destroyed on drop.
pub(crate) struct CompChannel {
    ptr: NonNull<sys::ibv_comp_channel>,
    _ctx: Arc<Context>,
}

// SAFETY: see `Context`.
unsafe impl Send for CompChannel {}
// SAFETY: no Rust-side mutable state.
unsafe impl Sync for CompChannel {}

impl CompChannel {
    /// `ibv_create_comp_channel`, with its fd made non-blocking.
    pub(crate) fn new(ctx: &Arc<Context>) -> io::Result<Arc<Self>> {
        // SAFETY: live context.
        let p = unsafe { sys::ibv_create_comp_channel(ctx.raw()) };
        let ptr = NonNull::new(p).ok_or_else(last_error)?;
        let ch = Arc::new(Self {
            ptr,
            _ctx: Arc::clone(ctx),
        });
        set_nonblocking(ch.fd())?;
        Ok(ch)
    }

    fn fd(&self) -> c_int {
        // SAFETY: reading a plain field of the live channel.
        unsafe { (*self.ptr.as_ptr()).fd }
    }
}

impl Drop for CompChannel {
    fn drop(&mut self) {
        // SAFETY: CQs using the channel hold an Arc to it, so none is alive; destroyed once.
        unsafe { sys::ibv_destroy_comp_channel(self.ptr.as_ptr()) };
    }
}

/// A work completion as read from `ibv_poll_cq` (`struct ibv_wc`, the fields UC fills).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct RawWc {
    pub(crate) wr_id: u64,
    /// `enum ibv_wc_status`.
    pub(crate) status: u32,
    /// `enum ibv_wc_opcode`.
    pub(crate) opcode: u32,
    pub(crate) byte_len: u32,
    /// The immediate in host order, when `IBV_WC_WITH_IMM` is set.
    pub(crate) imm: Option<u32>,
    pub(crate) qp_num: u32,
    pub(crate) vendor_err: u32,
}

/// `IBV_WC_WITH_IMM` (enum ibv_wc_flags).
const WC_WITH_IMM: c_uint = 1 << 1;

/// How many completions `Cq::poll` reads per `ibv_poll_cq` call.
pub(crate) const POLL_BATCH: usize = 32;

/// A completion queue bound to a completion channel (`ibv_create_cq`), destroyed on drop.
pub(crate) struct Cq {
    ptr: NonNull<sys::ibv_cq>,
    channel: Arc<CompChannel>,
    depth: u32,
    /// Completion events taken with ibv_get_cq_event and not acknowledged yet.
    unacked: AtomicU32,
}

// SAFETY: see `Context`; the provider serialises poll_cq/req_notify_cq on one CQ.
unsafe impl Send for Cq {}
// SAFETY: the only Rust-side mutable state is atomic.
unsafe impl Sync for Cq {}

/// Completion events acknowledged in one `ibv_ack_cq_events` call (the call takes a mutex;
/// ibv_get_cq_event(3) recommends batching).
const ACK_BATCH: u32 = 64;

impl Cq {
    /// `ibv_create_cq(ctx, depth, NULL, channel, 0)`.
    pub(crate) fn new(ctx: &Arc<Context>, depth: u32) -> io::Result<Arc<Self>> {
        let channel = CompChannel::new(ctx)?;
        let cqe = c_int::try_from(depth).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
        // SAFETY: live context and channel; no cq_context.
        let p =
            unsafe { sys::ibv_create_cq(ctx.raw(), cqe, ptr::null_mut(), channel.ptr.as_ptr(), 0) };
        let ptr = NonNull::new(p).ok_or_else(last_error)?;
        // SAFETY: plain field of the live CQ: the provider may round the depth up.
        let actual = unsafe { (*ptr.as_ptr()).cqe };
        let depth = u32::try_from(actual).unwrap_or(depth).max(depth);
        Ok(Arc::new(Self {
            ptr,
            channel,
            depth,
            unacked: AtomicU32::new(0),
        }))
    }

    pub(crate) fn raw(&self) -> *mut sys::ibv_cq {
        self.ptr.as_ptr()
    }

    /// Capacity in completions (as granted by the provider).
    pub(crate) fn depth(&self) -> u32 {
        self.depth
    }

    /// The kernel's handle of this CQ (`ibv_cq.handle`), as named by CQ async events.
    pub(crate) fn handle(&self) -> u32 {
        // SAFETY: plain field of the live CQ.
        unsafe { (*self.raw()).handle }
    }

    /// `ibv_poll_cq`: reads up to `min(out.len(), POLL_BATCH)` completions into `out`;
    /// returns how many, or the provider's error.
    pub(crate) fn poll(&self, out: &mut [RawWc]) -> io::Result<usize> {
        let mut wcs = [const { MaybeUninit::<sys::ibv_wc>::uninit() }; POLL_BATCH];
        let want = out.len().min(POLL_BATCH);
        let n_in = c_int::try_from(want).unwrap_or(0);
        // SAFETY: live CQ; `wcs` has room for `want` entries, which the provider writes.
        let n = unsafe { sys::ibv_poll_cq(self.raw(), n_in, wcs.as_mut_ptr().cast()) };
        if n < 0 {
            return Err(error_from_ret(n));
        }
        let n = usize::try_from(n).unwrap_or(0).min(want);
        for (wc, slot) in wcs.iter().take(n).zip(out.iter_mut()) {
            // SAFETY: ibv_poll_cq returned `n`: entries 0..n were written by the provider.
            let wc = unsafe { wc.assume_init_ref() };
            let imm = if wc.wc_flags & WC_WITH_IMM != 0 {
                // SAFETY: IBV_WC_WITH_IMM says the union holds imm_data (network order).
                Some(u32::from_be(unsafe {
                    wc.imm_data_invalidated_rkey_union.imm_data
                }))
            } else {
                None
            };
            *slot = RawWc {
                wr_id: wc.wr_id,
                status: wc.status,
                opcode: wc.opcode,
                byte_len: wc.byte_len,
                imm,
                qp_num: wc.qp_num,
                vendor_err: wc.vendor_err,
            };
        }
        Ok(n)
    }

    /// `ibv_req_notify_cq(cq, 0)`: the next completion raises a completion event.
    pub(crate) fn arm(&self) -> io::Result<()> {
        // SAFETY: live CQ.
        let ret = unsafe { sys::ibv_req_notify_cq(self.raw(), 0) };
        if ret != 0 {
            return Err(error_from_ret(ret));
        }
        Ok(())
    }

    /// Waits up to `timeout` for a completion event on this CQ's channel and consumes it
    /// (`ibv_get_cq_event`; acknowledged in batches). `Ok(true)` when an event arrived. Arm
    /// with [`Cq::arm`] first.
    pub(crate) fn wait_event(&self, timeout: Duration) -> io::Result<bool> {
        if !wait_readable(self.channel.fd(), timeout)? {
            return Ok(false);
        }
        self.take_event()
    }

    /// The descriptor of this CQ's completion channel: readable while a completion event
    /// waits (for [`poll_readable`] over many CQs; then [`Cq::take_event`]).
    pub(crate) fn channel_fd(&self) -> c_int {
        self.channel.fd()
    }

    /// Takes one completion event from this CQ's channel without blocking
    /// (`ibv_get_cq_event` on the non-blocking fd; acknowledged in batches). `Ok(false)`
    /// when there was none.
    pub(crate) fn take_event(&self) -> io::Result<bool> {
        let mut cq: *mut sys::ibv_cq = ptr::null_mut();
        let mut cq_ctx: *mut c_void = ptr::null_mut();
        // SAFETY: live channel (non-blocking fd); valid out-pointers.
        let ret = unsafe { sys::ibv_get_cq_event(self.channel.ptr.as_ptr(), &mut cq, &mut cq_ctx) };
        if ret != 0 {
            let e = last_error();
            return if e.kind() == io::ErrorKind::WouldBlock {
                Ok(false)
            } else {
                Err(e)
            };
        }
        // The channel belongs to this CQ alone, so the event is ours.
        let pending = self
            .unacked
            .fetch_add(1, Ordering::AcqRel)
            .saturating_add(1);
        if pending >= ACK_BATCH {
            let n = self.unacked.swap(0, Ordering::AcqRel);
            if n > 0 {
                // SAFETY: acknowledges `n` events taken from this CQ and not yet acked.
                unsafe { sys::ibv_ack_cq_events(self.raw(), n) };
            }
        }
        Ok(true)
    }
}

impl Drop for Cq {
    fn drop(&mut self) {
        let n = self.unacked.swap(0, Ordering::AcqRel);
        // SAFETY: QPs using this CQ hold an Arc to it, so none is alive. ibv_destroy_cq waits
        // for every completion event to be acknowledged, which happens just before.
        unsafe {
            if n > 0 {
                sys::ibv_ack_cq_events(self.raw(), n);
            }
            sys::ibv_destroy_cq(self.raw());
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Queue pair
// ---------------------------------------------------------------------------------------------

/// The RTR address vector and path of a QP (RoCE: a GRH is always present).
#[derive(Clone, Copy, Debug)]
pub(crate) struct RtrAttr {
    pub(crate) port: u8,
    pub(crate) dgid: [u8; 16],
    pub(crate) sgid_index: u8,
    pub(crate) hop_limit: u8,
    /// `enum ibv_mtu`.
    pub(crate) path_mtu: u32,
    pub(crate) dest_qpn: u32,
    pub(crate) rq_psn: u32,
    /// RC: `max_dest_rd_atomic` and `min_rnr_timer` come from here ([`qp_mask::RTR_RC`]);
    /// `None` for UC ([`qp_mask::RTR`]).
    pub(crate) rc: Option<RcAttr>,
}

/// A UC or RC queue pair (`ibv_create_qp` with `IBV_QPT_UC` / `IBV_QPT_RC`), destroyed on
/// drop.
pub(crate) struct Qp {
    ptr: NonNull<sys::ibv_qp>,
    qpn: u32,
    _pd: Arc<Pd>,
    _send_cq: Arc<Cq>,
    _recv_cq: Arc<Cq>,
    /// The SRQ the QP takes its receive WRs from: destroyed after the QP (field order does
    /// not matter, `Drop for Qp` runs before the fields are dropped).
    _srq: Option<Arc<Srq>>,
}

// SAFETY: see `Context`; the provider serialises post_send/post_recv per queue.
unsafe impl Send for Qp {}
// SAFETY: no Rust-side mutable state.
unsafe impl Sync for Qp {}

/// A send WR as the transport builds it, before it becomes a `struct ibv_send_wr`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct SendWrRaw {
    pub(crate) wr_id: u64,
    /// `enum ibv_wr_opcode`.
    pub(crate) opcode: u32,
    /// `(addr, length, lkey)` of the single SGE, if any.
    pub(crate) sge: Option<(u64, u32, u32)>,
    pub(crate) signaled: bool,
    /// Immediate in host order (for the *_WITH_IMM opcodes).
    pub(crate) imm: u32,
    pub(crate) remote_addr: u64,
    pub(crate) rkey: u32,
}

/// A receive WR as the transport builds it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct RecvWrRaw {
    pub(crate) wr_id: u64,
    pub(crate) sge: Option<(u64, u32, u32)>,
}

/// Largest number of WRs chained into one `ibv_post_send`/`ibv_post_recv` call.
pub(crate) const POST_BATCH: usize = 32;

impl Qp {
    /// `ibv_create_qp(pd, {send_cq, recv_cq, srq, cap, IBV_QPT_UC or IBV_QPT_RC, sq_sig_all =
    /// 0})`, one SGE per WR, no inline data. With `srq` the QP has no receive queue of its own
    /// (`max_recv_wr`/`max_recv_sge` are ignored, ibv_create_qp(3)) and the provider may
    /// refuse the combination (the man page allows an SRQ only on RC and UD; rxe and mlx5
    /// accept UC, DESIGN.md §6). Returns the QP and the capacities granted by the provider
    /// `(max_send_wr, max_recv_wr)` (`max_recv_wr` 0 on an SRQ).
    pub(crate) fn new(
        pd: &Arc<Pd>,
        cqs: (&Arc<Cq>, &Arc<Cq>),
        srq: Option<&Arc<Srq>>,
        depths: (u32, u32),
        rc: bool,
    ) -> io::Result<(Self, u32, u32)> {
        let (max_send_wr, max_recv_wr) = depths;
        let max_recv_wr = if srq.is_some() { 0 } else { max_recv_wr };
        let (send_cq, recv_cq) = cqs;
        // SAFETY: ibv_qp_init_attr is plain old data; all-zero (null pointers) is valid.
        let mut init: sys::ibv_qp_init_attr = unsafe { std::mem::zeroed() };
        init.send_cq = send_cq.raw();
        init.recv_cq = recv_cq.raw();
        init.srq = srq.map_or(ptr::null_mut(), |q| q.ptr.as_ptr());
        init.cap.max_send_wr = max_send_wr;
        init.cap.max_recv_wr = max_recv_wr;
        init.cap.max_send_sge = 1;
        init.cap.max_recv_sge = u32::from(srq.is_none());
        init.cap.max_inline_data = 0;
        init.qp_type = if rc {
            sys::ibv_qp_type::IBV_QPT_RC
        } else {
            sys::ibv_qp_type::IBV_QPT_UC
        };
        init.sq_sig_all = 0;
        // SAFETY: live PD, CQs and SRQ of the same context; `init` is valid for the call and is
        // updated in place with the granted capacities.
        let p = unsafe { sys::ibv_create_qp(pd.ptr.as_ptr(), &mut init) };
        let ptr = NonNull::new(p).ok_or_else(last_error)?;
        // SAFETY: plain field of the live QP.
        let qpn = unsafe { (*ptr.as_ptr()).qp_num };
        let qp = Self {
            ptr,
            qpn,
            _pd: Arc::clone(pd),
            _send_cq: Arc::clone(send_cq),
            _recv_cq: Arc::clone(recv_cq),
            _srq: srq.map(Arc::clone),
        };
        let granted_recv = if srq.is_some() {
            0
        } else {
            init.cap.max_recv_wr.max(max_recv_wr)
        };
        Ok((qp, init.cap.max_send_wr.max(max_send_wr), granted_recv))
    }

    pub(crate) fn qpn(&self) -> u32 {
        self.qpn
    }

    fn modify(&self, attr: &mut sys::ibv_qp_attr, mask: u32) -> io::Result<()> {
        let mask = c_int::try_from(mask).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
        // SAFETY: live QP; `attr` is valid for the call.
        let ret = unsafe { sys::ibv_modify_qp(self.ptr.as_ptr(), attr, mask) };
        if ret != 0 {
            return Err(error_from_ret(ret));
        }
        Ok(())
    }

    fn zeroed_attr() -> sys::ibv_qp_attr {
        // SAFETY: ibv_qp_attr is plain old data; all-zero is a valid value.
        unsafe { std::mem::zeroed() }
    }

    /// RESET → INIT with [`qp_mask::INIT`].
    pub(crate) fn modify_to_init(&self, port: u8, access: u32) -> io::Result<()> {
        let mut a = Self::zeroed_attr();
        a.qp_state = sys::ibv_qp_state::IBV_QPS_INIT;
        a.pkey_index = 0;
        a.port_num = port;
        a.qp_access_flags = access;
        self.modify(&mut a, qp_mask::INIT)
    }

    /// INIT → RTR with [`qp_mask::RTR`] (UC) or [`qp_mask::RTR_RC`].
    pub(crate) fn modify_to_rtr(&self, r: &RtrAttr) -> io::Result<()> {
        let mut a = Self::zeroed_attr();
        a.qp_state = sys::ibv_qp_state::IBV_QPS_RTR;
        a.path_mtu = r.path_mtu;
        a.dest_qp_num = r.dest_qpn;
        a.rq_psn = r.rq_psn;
        a.ah_attr.is_global = 1;
        a.ah_attr.grh.dgid = sys::ibv_gid { raw: r.dgid };
        a.ah_attr.grh.sgid_index = r.sgid_index;
        a.ah_attr.grh.hop_limit = r.hop_limit;
        a.ah_attr.grh.flow_label = 0;
        a.ah_attr.grh.traffic_class = 0;
        a.ah_attr.dlid = 0;
        a.ah_attr.sl = 0;
        a.ah_attr.src_path_bits = 0;
        a.ah_attr.port_num = r.port;
        let mask = match &r.rc {
            None => qp_mask::RTR,
            Some(rc) => {
                a.max_dest_rd_atomic = rc.max_dest_rd_atomic;
                a.min_rnr_timer = rc.min_rnr_timer;
                qp_mask::RTR_RC
            }
        };
        self.modify(&mut a, mask)
    }

    /// RTR → RTS with [`qp_mask::RTS`] (UC, `rc` = `None`) or [`qp_mask::RTS_RC`] (the
    /// requester's ACK timeout, retry counts and READ/atomic depth from `rc`).
    pub(crate) fn modify_to_rts(&self, sq_psn: u32, rc: Option<&RcAttr>) -> io::Result<()> {
        let mut a = Self::zeroed_attr();
        a.qp_state = sys::ibv_qp_state::IBV_QPS_RTS;
        a.sq_psn = sq_psn;
        let mask = match rc {
            None => qp_mask::RTS,
            Some(rc) => {
                a.timeout = rc.timeout;
                a.retry_cnt = rc.retry_cnt;
                a.rnr_retry = rc.rnr_retry;
                a.max_rd_atomic = rc.max_rd_atomic;
                qp_mask::RTS_RC
            }
        };
        self.modify(&mut a, mask)
    }

    /// Any state → ERROR (`IBV_QP_STATE` only).
    pub(crate) fn modify_to_error(&self) -> io::Result<()> {
        let mut a = Self::zeroed_attr();
        a.qp_state = sys::ibv_qp_state::IBV_QPS_ERR;
        self.modify(&mut a, qp_mask::STATE)
    }

    /// `ibv_query_qp(IBV_QP_STATE)`: the current `enum ibv_qp_state`.
    pub(crate) fn query_state(&self) -> io::Result<u32> {
        let mut a = Self::zeroed_attr();
        // SAFETY: ibv_qp_init_attr is plain old data; all-zero is a valid value.
        let mut init: sys::ibv_qp_init_attr = unsafe { std::mem::zeroed() };
        let mask = c_int::try_from(qp_mask::STATE).unwrap_or(1);
        // SAFETY: live QP; valid out-pointers.
        let ret = unsafe { sys::ibv_query_qp(self.ptr.as_ptr(), &mut a, mask, &mut init) };
        if ret != 0 {
            return Err(error_from_ret(ret));
        }
        Ok(a.qp_state)
    }

    /// `ibv_post_send` of up to [`POST_BATCH`] WRs chained in order. Returns `Ok(())` when all
    /// were posted, else the number posted before the one the provider rejected and its error.
    pub(crate) fn post_send(&self, wrs: &[SendWrRaw]) -> Result<(), (usize, io::Error)> {
        let n = wrs.len().min(POST_BATCH);
        if n == 0 {
            return Ok(());
        }
        // Only the first `n` entries are initialised (no memset of the whole batch per post).
        let mut sges = [const { MaybeUninit::<sys::ibv_sge>::uninit() }; POST_BATCH];
        let mut raw = [const { MaybeUninit::<sys::ibv_send_wr>::uninit() }; POST_BATCH];
        let base = raw.as_mut_ptr().cast::<sys::ibv_send_wr>();
        let sge_base = sges.as_mut_ptr().cast::<sys::ibv_sge>();
        for (i, w) in wrs.iter().take(n).enumerate() {
            // SAFETY: ibv_send_wr is plain old data; all-zero is a valid value.
            let mut r: sys::ibv_send_wr = unsafe { std::mem::zeroed() };
            r.wr_id = w.wr_id;
            r.opcode = w.opcode;
            r.send_flags = if w.signaled {
                sys::ibv_send_flags::IBV_SEND_SIGNALED.0
            } else {
                0
            };
            r.imm_data_invalidated_rkey_union.imm_data = w.imm.to_be();
            r.wr.rdma = sys::rdma_t {
                remote_addr: w.remote_addr,
                rkey: w.rkey,
            };
            if let Some((addr, length, lkey)) = w.sge {
                // SAFETY: i < n <= POST_BATCH: inside `sges`; written before it is read.
                unsafe { sge_base.add(i).write(sys::ibv_sge { addr, length, lkey }) };
                // SAFETY: as above.
                r.sg_list = unsafe { sge_base.add(i) };
                r.num_sge = 1;
            }
            r.next = if i + 1 < n {
                // SAFETY: i + 1 < n <= POST_BATCH: inside `raw` (initialised next round).
                unsafe { base.add(i + 1) }
            } else {
                ptr::null_mut()
            };
            // SAFETY: i < n <= POST_BATCH: inside `raw`.
            unsafe { base.add(i).write(r) };
        }
        let mut bad: *mut sys::ibv_send_wr = ptr::null_mut();
        // SAFETY: live QP; entries 0..n of the chain and their SGEs are initialised and live on
        // this stack frame for the call (the provider copies WRs into its queue before
        // returning); SGE addresses lie inside registered MRs (checked by the caller).
        let ret = unsafe { sys::ibv_post_send(self.ptr.as_ptr(), base, &mut bad) };
        if ret == 0 {
            return Ok(());
        }
        let posted = if bad.is_null() {
            0
        } else {
            // SAFETY: `bad` is not null, so the provider set it to the rejected WR, which is in
            // the chain at `base`: offset_from two pointers into one array.
            unsafe { bad.offset_from(base) }
        };
        Err((
            usize::try_from(posted).unwrap_or(0).min(n),
            error_from_ret(ret),
        ))
    }

    /// `ibv_post_recv` of up to [`POST_BATCH`] WRs chained in order; as [`Qp::post_send`].
    pub(crate) fn post_recv(&self, wrs: &[RecvWrRaw]) -> Result<(), (usize, io::Error)> {
        let qp = self.ptr.as_ptr();
        // SAFETY: live QP; the chain and its SGEs are valid for the call (`post_recv_chain`).
        post_recv_chain(wrs, |wr, bad| unsafe { sys::ibv_post_recv(qp, wr, bad) })
    }
}

/// Builds a chain of up to [`POST_BATCH`] receive WRs on the stack and hands it to `post`
/// (`ibv_post_recv` or `ibv_post_srq_recv`, which share the `bad_wr` convention). Returns
/// `Ok(())` when all were posted, else the number posted before the rejected one and its
/// error.
fn post_recv_chain(
    wrs: &[RecvWrRaw],
    post: impl FnOnce(*mut sys::ibv_recv_wr, *mut *mut sys::ibv_recv_wr) -> c_int,
) -> Result<(), (usize, io::Error)> {
    let n = wrs.len().min(POST_BATCH);
    if n == 0 {
        return Ok(());
    }
    let mut sges = [const { MaybeUninit::<sys::ibv_sge>::uninit() }; POST_BATCH];
    let mut raw = [const { MaybeUninit::<sys::ibv_recv_wr>::uninit() }; POST_BATCH];
    let base = raw.as_mut_ptr().cast::<sys::ibv_recv_wr>();
    let sge_base = sges.as_mut_ptr().cast::<sys::ibv_sge>();
    for (i, w) in wrs.iter().take(n).enumerate() {
        let (sg_list, num_sge) = match w.sge {
            Some((addr, length, lkey)) => {
                // SAFETY: i < n <= POST_BATCH: inside `sges`; written before it is read.
                unsafe { sge_base.add(i).write(sys::ibv_sge { addr, length, lkey }) };
                // SAFETY: as above.
                (unsafe { sge_base.add(i) }, 1)
            }
            None => (ptr::null_mut(), 0),
        };
        let next = if i + 1 < n {
            // SAFETY: i + 1 < n <= POST_BATCH: inside `raw` (initialised next round).
            unsafe { base.add(i + 1) }
        } else {
            ptr::null_mut()
        };
        // SAFETY: i < n <= POST_BATCH: inside `raw`.
        unsafe {
            base.add(i).write(sys::ibv_recv_wr {
                wr_id: w.wr_id,
                next,
                sg_list,
                num_sge,
            })
        };
    }
    let mut bad: *mut sys::ibv_recv_wr = ptr::null_mut();
    // Entries 0..n are initialised and live for the call; the SGEs lie inside registered
    // MRs with LOCAL_WRITE (checked by the caller).
    let ret = post(base, &mut bad);
    if ret == 0 {
        return Ok(());
    }
    let posted = if bad.is_null() {
        0
    } else {
        // SAFETY: as in `post_send`: a non-null `bad` points into the chain at `base`.
        unsafe { bad.offset_from(base) }
    };
    Err((
        usize::try_from(posted).unwrap_or(0).min(n),
        error_from_ret(ret),
    ))
}

impl Drop for Qp {
    fn drop(&mut self) {
        // SAFETY: destroyed once; the PD, CQs and SRQ it uses are kept alive by the Arcs in
        // `self` until after this call.
        unsafe { sys::ibv_destroy_qp(self.ptr.as_ptr()) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn struct_layouts_match_c() {
        // Sizes from rdma-core 44 (crates.md): ibv_wc 48, ibv_send_wr 128, ibv_qp_attr 144.
        assert_eq!(std::mem::size_of::<sys::ibv_wc>(), 48);
        assert_eq!(std::mem::size_of::<sys::ibv_send_wr>(), 128);
        assert_eq!(std::mem::size_of::<sys::ibv_qp_attr>(), 144);
        assert_eq!(std::mem::size_of::<sys::ibv_gid_entry>(), 32);
        assert_eq!(std::mem::size_of::<AsyncEventRaw>(), 16);
        // ibv_srq_attr: max_wr, max_sge, srq_limit; ibv_srq_init_attr: a context pointer and it.
        assert_eq!(std::mem::size_of::<sys::ibv_srq_attr>(), 12);
        assert_eq!(std::mem::size_of::<sys::ibv_srq_init_attr>(), 24);
    }

    #[test]
    fn errno_conversion_keeps_the_code() {
        assert_eq!(
            error_from_ret(libc::ENOMEM).raw_os_error(),
            Some(libc::ENOMEM)
        );
        assert_eq!(
            error_from_ret(-libc::EINVAL).raw_os_error(),
            Some(libc::EINVAL)
        );
    }
}
