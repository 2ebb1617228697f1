//! A GGUF file from arbitrary bytes: header, metadata, tensor index and its validation, the
//! tokenizer from the metadata, the model (hyperparameters, weights), its memory plan, and a
//! short forward pass when it loads. Errors are expected; a panic, an abort or a huge
//! allocation is a bug.
#![no_main]

use std::sync::Arc;

use nucleus::engine::Session;
use nucleus::gguf::GgufFile;
use nucleus::kv_cache::KvType;
use nucleus::model::Model;
use nucleus::tokenizer::Tokenizer;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let Ok(file) = GgufFile::from_bytes(data.to_vec()) else {
        return;
    };
    let file = Arc::new(file);
    if let Ok(tok) = Tokenizer::from_gguf(&file.metadata) {
        if let Ok(ids) = tok.encode("Hello <s> wörld", true, true) {
            let _ = tok.decode(&ids, false);
        }
    }
    let Ok(model) = Model::from_file(file, 1) else {
        return;
    };
    let _ = model.memory_plan(64, KvType::F16, 16, 8);
    // Keep the forward small: the fuzzer's models are tiny, a large one only wastes time.
    let hp = &model.hp;
    if hp.n_layers * hp.n_embd.max(hp.n_ff) > 1 << 16 || hp.n_vocab == 0 {
        return;
    }
    let mut s = Session::new(&model, 8);
    let ids = [0, (hp.n_vocab - 1) as u32];
    if let Ok(logits) = s.feed(&ids, 1, false) {
        assert_eq!(logits.len(), hp.n_vocab);
    }
});
