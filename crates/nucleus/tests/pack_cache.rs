//! `NUCLEUS_PACK_CACHE`: a load that finds the file of a model's packed weights maps it and
//! computes the same bits as one that packs the model; the file is really read (a changed
//! byte in it changes the logits), a damaged or stale one is rebuilt, never used. One test,
//! since the setting is the process's environment.

mod common;

use std::path::{Path, PathBuf};

use nucleus::model::Model;

/// The bits of every prompt row's logits for a fixed token list.
fn logits_bits(path: &Path) -> Vec<u32> {
    let model = Model::load(path, 2).unwrap();
    let ids = [
        1, 450, 4996, 17354, 1701, 29916, 432, 17204, 975, 278, 17366, 11203,
    ];
    let st = common::prompt_forward(&model, &ids);
    st.logits().iter().map(|x| x.to_bits()).collect()
}

fn cache_files(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|d| d.map(|e| e.unwrap().path()).collect())
        .unwrap_or_default();
    v.sort();
    v
}

fn set_cache(dir: Option<&Path>) {
    // One test in this binary: nothing else reads the environment meanwhile.
    match dir {
        Some(d) => std::env::set_var("NUCLEUS_PACK_CACHE", d),
        None => std::env::remove_var("NUCLEUS_PACK_CACHE"),
    }
}

#[test]
fn packed_weights_file_gives_the_same_bits_and_is_rebuilt_when_stale() {
    let tiny = common::golden_model_path("tiny-llama-random");
    if !common::require(&tiny, "model") {
        return;
    }
    let tmp = std::env::temp_dir().join(format!("nucleus-pack-cache-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp).unwrap();
    let model = tmp.join("tiny.gguf");
    std::fs::copy(&tiny, &model).unwrap();
    let dir = tmp.join("cache");

    set_cache(None);
    let want = logits_bits(&model);
    set_cache(Some(&dir));
    assert_eq!(logits_bits(&model), want, "the load that writes the file");
    let files = cache_files(&dir);
    assert_eq!(files.len(), 1, "{files:?}");
    let file = files[0].clone();
    let written = std::fs::read(&file).unwrap();
    assert_eq!(logits_bits(&model), want, "the load that maps the file");

    // A changed byte of the first matrix (page 1: the header of a model this small fits in
    // page 0) changes the logits: the load read the file rather than the model's tensors.
    let mut changed = written.clone();
    changed[4096 + 40] ^= 0x11;
    std::fs::write(&file, &changed).unwrap();
    assert_ne!(
        logits_bits(&model),
        want,
        "a changed packed byte was not read"
    );

    // A damaged header: rebuilt, not used.
    std::fs::write(&file, &written[..100]).unwrap();
    assert_eq!(logits_bits(&model), want, "a truncated file");
    assert_eq!(
        std::fs::read(&file).unwrap(),
        written,
        "the file was not rebuilt"
    );

    // Another file of another build or model under the same name: rebuilt.
    let mut other = written.clone();
    other[8] ^= 1; // the format version
    std::fs::write(&file, &other).unwrap();
    assert_eq!(logits_bits(&model), want, "a file of another format");
    assert_eq!(std::fs::read(&file).unwrap(), written);

    // The model file rewritten (a new modification time): a file of its own.
    let f = std::fs::File::options().write(true).open(&model).unwrap();
    f.set_modified(std::time::SystemTime::now() + std::time::Duration::from_secs(5))
        .unwrap();
    drop(f);
    assert_eq!(logits_bits(&model), want);
    assert_eq!(cache_files(&dir).len(), 2);

    // K-quants (Q4_K, Q6_K) and the output projection, where the catalog model is pulled.
    let gemma = common::golden_model_path("gemma-3-270m-q4_k_m");
    if common::require(&gemma, "model") {
        set_cache(None);
        let want = logits_bits(&gemma);
        set_cache(Some(&dir));
        assert_eq!(logits_bits(&gemma), want, "gemma, writing");
        assert_eq!(cache_files(&dir).len(), 3);
        assert_eq!(logits_bits(&gemma), want, "gemma, mapped");
    }
    set_cache(None);
    std::fs::remove_dir_all(&tmp).unwrap();
}
