//! Packed weights in huge pages (`NUCLEUS_HUGE_PAGES`, `nucleus serve`'s default): the same
//! bits as in ordinary pages, and the memory really in huge pages where the kernel has them.
//! One test, since the setting is the process's.

mod common;

use nucleus::kernels::interleaved::huge_pages;
use nucleus::model::Model;

fn logits_bits(model: &Model) -> Vec<u32> {
    let ids = [
        2, 818, 5279, 529, 7001, 563, 496, 236743, 236812, 236771, 236778, 1473,
    ];
    let st = common::prompt_forward(model, &ids);
    st.logits().iter().map(|x| x.to_bits()).collect()
}

/// Huge pages the kernel could not find and replaced by small ones (`/proc/vmstat`).
fn fallbacks() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/vmstat").ok()?;
    let line = text
        .lines()
        .find(|l| l.starts_with("thp_fault_fallback "))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

#[test]
fn huge_pages_give_the_same_bits() {
    // The output projection (gemma's tied embeddings, 178 MB packed) is large enough to be
    // mapped apart; the tiny model's matrices are not.
    let gemma = common::golden_model_path("gemma-3-270m-q4_k_m");
    if !common::require(&gemma, "model") {
        return;
    }
    std::env::remove_var("NUCLEUS_HUGE_PAGES");
    huge_pages::set_default(false);
    let before = nucleus::model::resident_huge_bytes().unwrap_or(0);
    let want = logits_bits(&Model::load(&gemma, 2).unwrap());

    huge_pages::set_default(true);
    assert!(huge_pages::wanted());
    let fell_back = fallbacks();
    let model = Model::load(&gemma, 2).unwrap();
    // Packed now, as a server packs (a load leaves the matrices waiting for their use).
    model.finish_packing();
    let held = nucleus::model::resident_huge_bytes().unwrap_or(0);
    assert_eq!(logits_bits(&model), want, "huge pages changed the logits");

    let mode =
        std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled").unwrap_or_default();
    if mode.contains("[never]") || mode.is_empty() {
        eprintln!("skipped the page check: the kernel has no transparent huge pages ({mode:?})");
    } else if fallbacks() != fell_back {
        eprintln!("skipped the page check: the kernel found no free huge pages for some");
    } else {
        assert!(
            held >= before + (100 << 20),
            "{held} bytes in huge pages, {before} before the load"
        );
    }
    huge_pages::set_default(false);
}
