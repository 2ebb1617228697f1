//! `quant::quantize` against llama.cpp's llama-quantize: the committed fixture
//! (`tests/data/quantize/tiny-f16.gguf`, rows of 256, 512, 96 and 80, zero, constant, tiny and
//! outlier blocks) quantized to every type nucleus writes must give, tensor for tensor and file
//! for file, the bytes whose sha256 llama-quantize's output had
//! (`scripts/make_quantize_fixture.py` made both); the same for expert tensors on a tiny
//! gpt-oss (`tiny-moe-f16.gguf`). And failures leave no file behind.

use std::path::{Path, PathBuf};

use nucleus::gguf::{GgufFile, GgufWriter, MetaValue};
use nucleus::quant::quantize::{quantize_file, Mix, QuantizeError, MIXES};
use nucleus::quant::GgmlType;
use sha2::{Digest, Sha256};

fn data(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/quantize")
        .join(name)
}

fn hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// A fresh directory for one test's outputs.
fn scratch(test: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("nucleus-quantize-{test}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn leftovers(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains("partial"))
        .collect()
}

#[test]
fn every_type_matches_llama_quantize_byte_for_byte() {
    let n = check_against_llama_quantize("tiny-f16.gguf", "llama_quantize.json", "bytes");
    assert_eq!(n, MIXES.len(), "the fixture covers every mix");
}

/// Expert tensors (3-D, with llama-quantize's per-tensor rules for `ffn_*_exps` and the
/// `MXFP4_MOE` mix): the gpt-oss fixture dequantized to F16 (`tiny-moe-f16.gguf`), quantized
/// as llama-quantize quantized it (`scripts/make_quantize_fixture.py --moe`).
#[test]
fn expert_tensors_match_llama_quantize_byte_for_byte() {
    let n = check_against_llama_quantize("tiny-moe-f16.gguf", "llama_quantize_moe.json", "moe");
    assert!(n >= 6);
}

/// Quantizes fixture `src` to every mix of `json` and compares with llama-quantize's output;
/// returns how many mixes it checked.
fn check_against_llama_quantize(src: &str, json: &str, test: &str) -> usize {
    let expected: serde_json::Value =
        serde_json::from_slice(&std::fs::read(data(json)).unwrap()).unwrap();
    let expected = expected.as_object().unwrap();
    let dir = scratch(test);
    for (name, want) in expected {
        let mix = Mix::parse(name).unwrap();
        let out = dir.join(format!("{name}.gguf"));
        let mut seen = 0;
        quantize_file(&data(src), &out, &mix, 2, &mut |_| seen += 1).unwrap();
        let file = GgufFile::open(&out).unwrap();
        assert_eq!(seen, file.tensors.len());
        let want_tensors = want["tensors"].as_array().unwrap();
        assert_eq!(file.tensors.len(), want_tensors.len(), "{name}");
        for (t, w) in file.tensors.iter().zip(want_tensors) {
            let w: Vec<&str> = w
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_str().unwrap())
                .collect();
            assert_eq!(
                (t.name.as_str(), t.ty.name()),
                (w[0], w[1]),
                "{name}: name and type"
            );
            assert_eq!(
                hex(file.tensor_data(t)),
                w[2],
                "{name}: bytes of {}",
                t.name
            );
        }
        assert_eq!(
            file.metadata.get("general.file_type"),
            Some(&MetaValue::U32(mix.ftype)),
            "{name}"
        );
        let whole = hex(&std::fs::read(&out).unwrap());
        assert_eq!(
            whole,
            want["file_sha256"].as_str().unwrap(),
            "{name}: whole file"
        );
    }
    assert!(leftovers(&dir).is_empty());
    std::fs::remove_dir_all(&dir).unwrap();
    expected.len()
}

#[test]
fn a_failed_quantization_leaves_no_file_and_keeps_the_old_one() {
    let dir = scratch("fail");
    // A tensor nucleus cannot read, to be converted: refused before anything is written.
    let mut w = GgufWriter::new();
    w.add_meta("general.architecture", MetaValue::String("llama".into()));
    w.add_tensor(
        "blk.0.attn_q.weight",
        &[256, 2],
        GgmlType::IQ2_XXS,
        vec![0; 2 * 66],
    );
    let input = dir.join("in.gguf");
    std::fs::write(&input, w.to_bytes()).unwrap();
    let out = dir.join("out.gguf");
    std::fs::write(&out, b"old").unwrap();
    let err =
        quantize_file(&input, &out, &Mix::parse("Q8_0").unwrap(), 1, &mut |_| {}).unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains("blk.0.attn_q.weight") && msg.contains("IQ2_XXS"),
        "{msg}"
    );
    assert_eq!(std::fs::read(&out).unwrap(), b"old");

    // A failure after the whole file was written (the output is a non-empty directory that
    // the rename cannot replace): the temporary file is removed.
    let blocked = dir.join("blocked.gguf");
    std::fs::create_dir_all(blocked.join("inside")).unwrap();
    let err = quantize_file(
        &data("tiny-f16.gguf"),
        &blocked,
        &Mix::parse("Q4_0").unwrap(),
        1,
        &mut |_| {},
    )
    .unwrap_err();
    assert!(matches!(err, QuantizeError::Write { .. }), "{err}");
    assert!(leftovers(&dir).is_empty(), "{:?}", leftovers(&dir));

    // An input that is not a GGUF.
    std::fs::write(&out, b"not a model file, just text").unwrap();
    let err = quantize_file(
        &out,
        &dir.join("x.gguf"),
        &Mix::parse("Q8_0").unwrap(),
        1,
        &mut |_| {},
    )
    .unwrap_err();
    assert!(err.to_string().contains("not a GGUF"), "{err}");
    assert!(!dir.join("x.gguf").exists());
    assert!(leftovers(&dir).is_empty());
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn the_same_type_is_copied_and_the_order_is_llama_quantizes() {
    // F16 to F16: the F16 and 1-D tensors' bytes as they were, the 2-D F32 one converted,
    // the tensors sorted by layer then name.
    let dir = scratch("copy");
    let out = dir.join("f16.gguf");
    quantize_file(
        &data("tiny-f16.gguf"),
        &out,
        &Mix::parse("f16").unwrap(),
        1,
        &mut |_| {},
    )
    .unwrap();
    let (a, b) = (
        GgufFile::open(data("tiny-f16.gguf")).unwrap(),
        GgufFile::open(&out).unwrap(),
    );
    for t in &b.tensors {
        let orig = a.tensor(&t.name).unwrap();
        if t.name == "blk.2.ffn_up.weight" {
            assert_eq!((orig.ty, t.ty), (GgmlType::F32, GgmlType::F16));
            continue;
        }
        assert_eq!(t.ty, orig.ty, "{}", t.name);
        assert_eq!(b.tensor_data(t), a.tensor_data(orig), "{}", t.name);
    }
    let names: Vec<&str> = b.tensors.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(
        &names[..4],
        [
            "output.weight",
            "output_norm.weight",
            "token_embd.weight",
            "blk.0.attn_k.weight"
        ]
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
