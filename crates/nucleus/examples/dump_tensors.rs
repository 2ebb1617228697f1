//! Feeds token ids to a model as one prompt and writes its intermediate tensors (the forward
//! pass's `NUCLEUS_DUMP_DIR` hook, llama.cpp's callback names) for a layer-by-layer comparison
//! with llama.cpp (see `scripts/tensor_dumps/README.md`).
//!
//! Usage: NUCLEUS_DUMP_DIR=DIR cargo run --release --example dump_tensors -- MODEL.gguf 1,2,3

use nucleus::engine::Session;
use nucleus::model::Model;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let [_, model, tokens] = &args[..] else {
        return Err("usage: dump_tensors MODEL.gguf TOKEN,TOKEN,...".into());
    };
    let model = Model::load(model, 1)?;
    let tokens: Vec<u32> = tokens
        .split(',')
        .map(|t| t.trim().parse())
        .collect::<Result<_, _>>()?;
    let mut session = Session::new(&model, tokens.len() + 1);
    session.feed(&tokens, 512, false)?;
    Ok(())
}
