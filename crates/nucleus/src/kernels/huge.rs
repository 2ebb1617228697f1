//! Zeroed byte buffers for repacked weights, backed by transparent huge pages where the kernel
//! offers them (`MADV_HUGEPAGE`; most distributions enable THP only for memory that asks, as
//! this does). A 2 MiB page costs one fault where 512 small ones cost 512 at load, and one TLB
//! entry where 512 small ones miss as decode streams a model of gigabytes through the cores.
//! Off unless `NUCLEUS_HUGE_PAGES=1`: where the kernel compacts memory on a huge page fault
//! (THP `defrag` set to `madvise`, the usual default) a load into a page cache full of model
//! files stalled on compaction, 3.5 s becoming 11–21 s for a 7B file (2 vCPUs, 2026-11-26).

use std::ops::{Deref, DerefMut};

/// Buffers from this size on are mapped on their own and advised huge; smaller ones are plain
/// vectors.
const MAPPED_FROM: usize = 2 << 20;

/// A zeroed, fixed-size byte buffer.
#[derive(Debug)]
pub enum ZeroedBuf {
    Vec(Vec<u8>),
    Mapped(memmap2::MmapMut),
}

impl ZeroedBuf {
    /// `len` zero bytes. A mapping that fails (address space, overcommit policy) falls back to a
    /// vector, whose allocation failure aborts as any allocation does: callers size it first.
    pub fn zeroed(len: usize) -> ZeroedBuf {
        if len >= MAPPED_FROM && huge_pages_wanted() {
            if let Ok(m) = memmap2::MmapMut::map_anon(len) {
                // Advice only: where THP is off, or the advice fails, small pages serve the
                // same bytes.
                #[cfg(target_os = "linux")]
                let _ = m.advise(memmap2::Advice::HugePage);
                return ZeroedBuf::Mapped(m);
            }
        }
        ZeroedBuf::Vec(vec![0u8; len])
    }
}

/// True when the environment variable `NUCLEUS_HUGE_PAGES` is `1`.
fn huge_pages_wanted() -> bool {
    static WANTED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *WANTED.get_or_init(|| std::env::var("NUCLEUS_HUGE_PAGES").is_ok_and(|v| v.trim() == "1"))
}

impl Deref for ZeroedBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            ZeroedBuf::Vec(v) => v,
            ZeroedBuf::Mapped(m) => m,
        }
    }
}

impl DerefMut for ZeroedBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        match self {
            ZeroedBuf::Vec(v) => v,
            ZeroedBuf::Mapped(m) => m,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_and_large_buffers_are_zeroed_and_writable() {
        for len in [0, 1, 4096, MAPPED_FROM, MAPPED_FROM + 12345] {
            let mut b = ZeroedBuf::zeroed(len);
            assert_eq!(b.len(), len);
            assert!(b.iter().all(|&x| x == 0));
            if len > 0 {
                b[len - 1] = 7;
                assert_eq!(b[len - 1], 7);
            }
            let mapped = len >= MAPPED_FROM && huge_pages_wanted();
            assert_eq!(matches!(b, ZeroedBuf::Mapped(_)), mapped);
        }
    }
}
