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
