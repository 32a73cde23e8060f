//! Prefetch for write: the one `unsafe` outside `verbs::ffi`, a CPU hint with no effect on
//! what any program can observe.

/// Cache line size assumed by [`for_write`] (x86-64; a wrong guess only prefetches more or
/// fewer lines).
const LINE: usize = 64;

/// Asks the CPU to bring the cache lines of `bytes` to this core in a writable state
/// (`PREFETCHW`, `_MM_HINT_ET0`), so that stores made soon after find them in cache instead
/// of waiting for ownership. A hint only: nothing is read or written, and on other
/// architectures it does nothing.
pub(crate) fn for_write(bytes: &[u8]) {
    #[cfg(target_arch = "x86_64")]
    for offset in (0..bytes.len()).step_by(LINE) {
        // SAFETY: `_mm_prefetch` needs SSE, which every x86-64 CPU has; a prefetch never
        // faults, reads or writes memory (it is a hint, dropped when the address is not
        // mapped), and the pointer is in bounds of `bytes` in any case.
        #[allow(unsafe_code)]
        unsafe {
            std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_ET0 }>(
                bytes.as_ptr().add(offset).cast(),
            );
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = bytes;
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_hint_changes_nothing() {
        let bytes: Vec<u8> = (0..=255u8).cycle().take(3000).collect();
        let before = bytes.clone();
        super::for_write(&bytes);
        super::for_write(&bytes[1..70]);
        super::for_write(&[]);
        assert_eq!(bytes, before);
    }
}
