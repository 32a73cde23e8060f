//! Soft memory region handles ([`SoftMrHandle`]) over the device's [`MrTable`].

use std::any::Any;
use std::sync::Arc;

use crate::api::backend::MrOps;
use crate::api::{AccessFlags, MemoryAccessError};
use crate::soft::memory::{MrTable, SoftMr};

/// A soft MR handle; deregisters its region when dropped.
#[derive(Debug)]
pub struct SoftMrHandle {
    pub(super) mr: Arc<SoftMr>,
    pub(super) table: Arc<MrTable>,
}

impl Drop for SoftMrHandle {
    fn drop(&mut self) {
        self.table.deregister(self.mr.key());
    }
}

impl MrOps for SoftMrHandle {
    fn addr(&self) -> u64 {
        self.mr.addr()
    }
    fn length(&self) -> usize {
        self.mr.len()
    }
    fn lkey(&self) -> u32 {
        self.mr.key()
    }
    fn rkey(&self) -> u32 {
        self.mr.key()
    }
    fn access(&self) -> AccessFlags {
        self.mr.access()
    }
    fn read_at(&self, offset: usize, out: &mut [u8]) -> Result<(), MemoryAccessError> {
        self.mr.read_at(offset, out)
    }
    fn write_at(&self, offset: usize, data: &[u8]) -> Result<(), MemoryAccessError> {
        self.mr.write_at(offset, data)
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}
