//! The RDMA Extended Transport Header (IBTA Vol 1 §9.3.3: [`Reth`], [`RethRepr`]) and the
//! Immediate Data header (§9.3.4: [`ImmDt`]).

use super::{check_len, read_u32, read_u64, PacketError};
use super::{IMMDT_LEN, RETH_LEN};

/// Checked view of an RDMA Extended Transport Header (IBTA Vol 1 §9.3.3), 16 bytes:
/// VirtualAddress (8, bytes 0-7), R_Key (4, bytes 8-11), DMALength (4, bytes 12-15).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reth<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Reth<T> {
    /// Wraps `buffer` after checking it holds at least [`RETH_LEN`] bytes.
    pub fn new_checked(buffer: T) -> Result<Self, PacketError> {
        check_len(buffer.as_ref(), "RETH", 0, RETH_LEN)?;
        Ok(Reth { buffer })
    }

    /// Returns the wrapped buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    /// Remote virtual address the message starts at.
    pub fn virtual_addr(&self) -> u64 {
        read_u64(self.buffer.as_ref(), 0)
    }

    /// Remote key of the target memory region.
    pub fn rkey(&self) -> u32 {
        read_u32(self.buffer.as_ref(), 8)
    }

    /// Length of the whole message in bytes (not of this packet).
    pub fn dma_len(&self) -> u32 {
        read_u32(self.buffer.as_ref(), 12)
    }
}

/// Owned RETH fields (IBTA Vol 1 §9.3.3).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct RethRepr {
    /// Remote virtual address the message starts at.
    pub virtual_addr: u64,
    /// Remote key of the target memory region.
    pub rkey: u32,
    /// Length of the whole message in bytes.
    pub dma_len: u32,
}

impl RethRepr {
    /// Parses the first [`RETH_LEN`] bytes of `buf`.
    pub fn parse(buf: &[u8]) -> Result<RethRepr, PacketError> {
        let reth = Reth::new_checked(buf)?;
        Ok(RethRepr {
            virtual_addr: reth.virtual_addr(),
            rkey: reth.rkey(),
            dma_len: reth.dma_len(),
        })
    }

    /// The 16 wire bytes.
    pub fn to_bytes(&self) -> [u8; RETH_LEN] {
        let mut out = [0u8; RETH_LEN];
        out[0..8].copy_from_slice(&self.virtual_addr.to_be_bytes());
        out[8..12].copy_from_slice(&self.rkey.to_be_bytes());
        out[12..16].copy_from_slice(&self.dma_len.to_be_bytes());
        out
    }

    /// Appends the 16 wire bytes to `out`.
    pub fn emit(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.to_bytes());
    }
}

/// The Immediate Data extended header (IBTA Vol 1 §9.3.4): 4 bytes, delivered to the
/// responder's receive completion (`ibv_wc.imm_data`) in network byte order. The value here is
/// the big-endian interpretation of the 4 wire bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct ImmDt(pub u32);

impl ImmDt {
    /// Parses the first [`IMMDT_LEN`] bytes of `buf`.
    pub fn parse(buf: &[u8]) -> Result<ImmDt, PacketError> {
        check_len(buf, "ImmDt", 0, IMMDT_LEN)?;
        Ok(ImmDt(read_u32(buf, 0)))
    }

    /// The 4 wire bytes.
    pub fn to_bytes(self) -> [u8; IMMDT_LEN] {
        self.0.to_be_bytes()
    }
}
