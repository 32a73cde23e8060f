//! Registered memory ([`VerbsMr`], the API's [`MrOps`]) and the check that turns an API
//! [`Sge`] into the address, length and lkey of a verbs SGE.

use std::any::Any;
use std::fmt;
use std::sync::Arc;

use crate::api::backend::MrOps;
use crate::api::{AccessFlags, MemoryAccessError, Sge};

use super::ffi;

/// A registered memory region ([`MrOps`]).
pub(super) struct VerbsMr {
    pub(super) mr: ffi::Mr,
    pub(super) access: AccessFlags,
}

impl fmt::Debug for VerbsMr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("VerbsMr")
            .field("addr", &format_args!("{:#x}", self.mr.addr()))
            .field("len", &self.mr.len())
            .field("lkey", &format_args!("{:#x}", self.mr.lkey()))
            .field("rkey", &format_args!("{:#x}", self.mr.rkey()))
            .field("access", &self.access)
            .finish()
    }
}

impl MrOps for VerbsMr {
    fn addr(&self) -> u64 {
        self.mr.addr()
    }

    fn length(&self) -> usize {
        self.mr.len()
    }

    fn lkey(&self) -> u32 {
        self.mr.lkey()
    }

    fn rkey(&self) -> u32 {
        self.mr.rkey()
    }

    fn access(&self) -> AccessFlags {
        self.access
    }

    fn read_at(&self, offset: usize, out: &mut [u8]) -> Result<(), MemoryAccessError> {
        if self.mr.read(offset, out) {
            Ok(())
        } else {
            Err(MemoryAccessError {
                lkey: self.mr.lkey(),
                offset,
                len: out.len(),
                mr_len: self.mr.len(),
            })
        }
    }

    fn write_at(&self, offset: usize, data: &[u8]) -> Result<(), MemoryAccessError> {
        if self.mr.write(offset, data) {
            Ok(())
        } else {
            Err(MemoryAccessError {
                lkey: self.mr.lkey(),
                offset,
                len: data.len(),
                mr_len: self.mr.len(),
            })
        }
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// Why an SGE cannot be used by a QP of `pd`.
pub(super) enum SgeProblem {
    Foreign {
        lkey: u32,
    },
    OutOfBounds {
        lkey: u32,
        offset: usize,
        length: u32,
        mr_len: usize,
    },
    NoLocalWrite {
        lkey: u32,
    },
}

/// `(addr, length, lkey)` of an SGE whose MR is a verbs MR of `pd`, inside its bounds.
pub(super) fn resolve_sge(
    sge: &Sge<'_>,
    pd: &Arc<ffi::Pd>,
    need_local_write: bool,
) -> Result<(u64, u32, u32), SgeProblem> {
    let lkey = sge.mr.lkey();
    let mr = sge
        .mr
        .backend()
        .as_any()
        .downcast_ref::<VerbsMr>()
        .filter(|m| Arc::ptr_eq(m.mr.pd(), pd))
        .ok_or(SgeProblem::Foreign { lkey })?;
    if !sge.in_bounds() {
        return Err(SgeProblem::OutOfBounds {
            lkey,
            offset: sge.offset,
            length: sge.length,
            mr_len: mr.mr.len(),
        });
    }
    if need_local_write && !mr.access.contains(AccessFlags::LOCAL_WRITE) {
        return Err(SgeProblem::NoLocalWrite { lkey });
    }
    let addr = mr.mr.addr().saturating_add(sge.offset as u64);
    Ok((addr, sge.length, mr.mr.lkey()))
}
