//! Whether packed weights live in 2 MiB pages, and the memory they get.
//!
//! A token's decode streams every weight once. From 4 KiB pages that costs a TLB miss per
//! 4 KiB, and on a VM each miss walks two page tables: this Xeon guest read 25.7–30.3 GB/s
//! from 4 KiB pages and 29.7–31.4 GB/s from 2 MiB pages (`scripts/machine_limits.c`), and the
//! real-size shapes decode 1–12 % faster from them. But fresh huge pages can cost more to hand
//! out than small ones (on a VM the host may have to back them anew), and a load writes
//! gigabytes of fresh memory: up to a second more on the 7B shape. So huge pages are the choice
//! of processes that load once and decode for long: `nucleus serve` asks for them, other
//! commands do not, and `--huge-pages` (`NUCLEUS_HUGE_PAGES=1|0`) overrides either.
//! Figures and commands: docs/src/memory.md.
//!
//! Linux's transparent huge pages default to "when advised" (`madvise`): the memory is mapped
//! apart and advised; where the kernel has them "always" or "never" the advice changes nothing.

use std::sync::atomic::{AtomicBool, Ordering};

/// Matrices from this size on are mapped apart when huge pages are asked for.
const HUGE_FROM: usize = 4 << 20;

static WANTED: AtomicBool = AtomicBool::new(false);

/// Sets this process's default (off until set); `NUCLEUS_HUGE_PAGES` still overrides it.
pub fn set_default(on: bool) {
    WANTED.store(on, Ordering::Relaxed);
}

/// Whether matrices packed now get huge pages: `NUCLEUS_HUGE_PAGES` (`1`/`on`/`true`,
/// `0`/`off`/`false`) if set, else the default.
pub fn wanted() -> bool {
    // Empty counts as unset, as for NUCLEUS_PACK_CACHE.
    match std::env::var("NUCLEUS_HUGE_PAGES")
        .ok()
        .filter(|v| !v.is_empty())
        .as_deref()
        .map(parse)
    {
        Some(Ok(on)) => on,
        Some(Err(v)) => {
            warn_once(&v);
            WANTED.load(Ordering::Relaxed)
        }
        None => WANTED.load(Ordering::Relaxed),
    }
}

fn parse(v: &str) -> Result<bool, String> {
    match v.trim().to_ascii_lowercase().as_str() {
        "1" | "on" | "true" | "yes" => Ok(true),
        "0" | "off" | "false" | "no" => Ok(false),
        _ => Err(v.to_string()),
    }
}

fn warn_once(v: &str) {
    static WARNED: std::sync::Once = std::sync::Once::new();
    WARNED
        .call_once(|| eprintln!("nucleus: NUCLEUS_HUGE_PAGES={v:?} is not 1/on or 0/off: ignored"));
}

/// `len` zeroed bytes mapped apart and advised into huge pages, when they are wanted and
/// `len` is large enough to hold some; `None` otherwise (the caller allocates as usual).
pub(super) fn fresh_map(len: usize) -> Option<memmap2::MmapMut> {
    if len < HUGE_FROM || !wanted() {
        return None;
    }
    let map = memmap2::MmapMut::map_anon(len).ok()?;
    // Refused advice (a kernel without transparent huge pages) leaves ordinary pages.
    #[cfg(target_os = "linux")]
    let _ = map.advise(memmap2::Advice::HugePage);
    Some(map)
}

/// One mapping, advised into huge pages, in which many matrices' packed bytes lie side by side:
/// a mixture's experts are about 1 MB each, too small for huge pages of their own (each
/// allocation then sat in 4 KiB pages, and the Qwen3-30B-A3B shape decoded no faster with
/// huge pages asked for), and so are a 7B's `attn_k` and `attn_v`. Each matrix owns a disjoint
/// part ([`Arena::parts`]) and writes it once, when it is packed.
pub(crate) struct Arena {
    /// The mapping's start: valid for `len` bytes while `_map` lives. Every access goes through
    /// a part's range, never through the whole map, so a part being written never aliases a
    /// part being read.
    base: *mut u8,
    len: usize,
    _map: memmap2::MmapMut,
}

// SAFETY: the mapping is plain memory owned by the arena; the parts handed out are disjoint,
// and each is written only by the one packing of its matrix (`PackedMatrix::finish`, inside
// its `OnceLock`) before anyone reads it.
unsafe impl Send for Arena {}
unsafe impl Sync for Arena {}

impl std::fmt::Debug for Arena {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Arena({} bytes)", self.len)
    }
}

/// Where a part starts: on a cache line.
const PART_ALIGN: usize = 64;

/// The offsets of parts of `lens` bytes laid side by side, each on a cache line, and the
/// length they take; `None` where it overflows.
pub(super) fn part_offsets(lens: &[usize]) -> Option<(Vec<usize>, usize)> {
    let mut offsets = Vec::with_capacity(lens.len());
    let mut end = 0usize;
    for &len in lens {
        offsets.push(end);
        end = end.checked_add(len)?.checked_next_multiple_of(PART_ALIGN)?;
    }
    Some((offsets, end))
}

impl Arena {
    /// An arena for parts of `lens` bytes, and each part's offset, where huge pages are wanted
    /// and the parts add up to enough to hold some; `None` otherwise (each matrix gets memory
    /// of its own) or where the mapping fails.
    pub(crate) fn parts(lens: &[usize]) -> Option<(std::sync::Arc<Arena>, Vec<usize>)> {
        let (offsets, end) = part_offsets(lens)?;
        let mut map = fresh_map(end)?;
        let base = map.as_mut_ptr();
        Some((
            std::sync::Arc::new(Arena {
                base,
                len: end,
                _map: map,
            }),
            offsets,
        ))
    }

    /// An arena of `len` bytes whatever the wishes (for tests).
    #[cfg(test)]
    pub(super) fn of_len(len: usize) -> std::sync::Arc<Arena> {
        let mut map = memmap2::MmapMut::map_anon(len.max(1)).expect("an anonymous map");
        let base = map.as_mut_ptr();
        std::sync::Arc::new(Arena {
            base,
            len,
            _map: map,
        })
    }

    /// Where the arena starts (for tests).
    #[cfg(test)]
    pub(super) fn base_address(&self) -> usize {
        self.base as usize
    }

    /// The part at `offset`, `len` bytes.
    ///
    /// # Safety
    /// No one writes the part meanwhile ([`Arena::part_mut`]'s contract).
    pub(super) unsafe fn part(&self, offset: usize, len: usize) -> &[u8] {
        assert!(offset.checked_add(len).is_some_and(|end| end <= self.len));
        // SAFETY: inside the mapping (checked above), which lives as long as self; not
        // written meanwhile (the caller's contract).
        unsafe { std::slice::from_raw_parts(self.base.add(offset), len) }
    }

    /// The part at `offset`, `len` bytes, to write.
    ///
    /// # Safety
    /// The part overlaps no other part in use, and no one reads or writes it meanwhile (each
    /// matrix writes its own part once, when it is packed, before it is read).
    #[allow(clippy::mut_from_ref)]
    pub(super) unsafe fn part_mut(&self, offset: usize, len: usize) -> &mut [u8] {
        assert!(offset.checked_add(len).is_some_and(|end| end <= self.len));
        // SAFETY: as for `part`, and exclusive (the caller's contract).
        unsafe { std::slice::from_raw_parts_mut(self.base.add(offset), len) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_parse() {
        for v in ["1", "on", "TRUE", " yes "] {
            assert_eq!(parse(v), Ok(true), "{v}");
        }
        for v in ["0", "off", "False", "no"] {
            assert_eq!(parse(v), Ok(false), "{v}");
        }
        assert_eq!(parse("maybe"), Err("maybe".to_string()));
    }
}
