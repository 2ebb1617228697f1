//! GGUF reading: round trips, the golden tiny model, and malformed files that must give an
//! error naming the problem (never a panic, never a huge allocation).

use nucleus::gguf::{GgufError, GgufFile, GgufWriter, MetaType, MetaValue};
use nucleus::quant::GgmlType;

fn small_file() -> GgufWriter {
    let mut w = GgufWriter::new();
    w.add_meta("general.architecture", MetaValue::String("llama".into()))
        .add_meta("llama.block_count", MetaValue::U32(2))
        .add_meta("some.f32", MetaValue::F32(0.5))
        .add_meta("some.bool", MetaValue::Bool(true))
        .add_meta("some.i64", MetaValue::I64(-7))
        .add_meta(
            "some.strings",
            MetaValue::Array(
                MetaType::String,
                vec![
                    MetaValue::String("a".into()),
                    MetaValue::String("bé".into()),
                ],
            ),
        )
        .add_tensor("t.f32", &[4, 2], GgmlType::F32, (0..32).collect())
        .add_tensor("t.q8", &[32], GgmlType::Q8_0, vec![1; 34]);
    w
}

#[test]
fn round_trip_metadata_and_tensors() {
    let file = GgufFile::from_bytes(small_file().to_bytes()).unwrap();
    assert_eq!(file.version, 3);
    assert_eq!(file.architecture(), Some("llama"));
    assert_eq!(file.metadata.get_u64("llama.block_count"), Some(2));
    assert_eq!(file.metadata.get_f32("some.f32"), Some(0.5));
    assert_eq!(file.metadata.get_bool("some.bool"), Some(true));
    assert_eq!(file.metadata.get("some.i64").unwrap().as_i64(), Some(-7));
    assert_eq!(
        file.metadata.get_str_array("some.strings").unwrap(),
        vec!["a", "bé"]
    );
    let t = file.tensor("t.f32").unwrap();
    assert_eq!(t.dims, vec![4, 2]);
    assert_eq!(t.size, 32);
    assert_eq!(file.tensor_data(t), (0..32).collect::<Vec<u8>>().as_slice());
    let q = file.tensor("t.q8").unwrap();
    assert_eq!(q.size, 34);
    assert_eq!(q.offset % 32, 0);
    assert!(file.tensor_data(q).iter().all(|&b| b == 1));
}

#[test]
fn reads_the_golden_tiny_model() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../../shared/golden/tiny-llama-random.gguf"
    );
    if !std::path::Path::new(path).exists() {
        eprintln!("skipped: ../shared/golden is absent");
        return;
    }
    let file = GgufFile::open(path).unwrap();
    assert_eq!(file.architecture(), Some("llama"));
    assert_eq!(file.tensors.len(), 30);
    assert_eq!(
        file.metadata
            .get_str_array("tokenizer.ggml.tokens")
            .unwrap()
            .len(),
        32000
    );
    let types: std::collections::HashSet<_> = file.tensors.iter().map(|t| t.ty).collect();
    for ty in [
        GgmlType::F32,
        GgmlType::F16,
        GgmlType::BF16,
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q5_1,
        GgmlType::Q8_0,
    ] {
        assert!(types.contains(&ty), "{ty} missing");
    }
}

/// Parses bytes that must be rejected; returns the error's message.
fn reject(bytes: Vec<u8>) -> String {
    let err = GgufFile::from_bytes(bytes).expect_err("malformed file was accepted");
    err.to_string()
}

fn header(version: u32, n_tensors: u64, n_kv: u64) -> Vec<u8> {
    let mut b = b"GGUF".to_vec();
    b.extend_from_slice(&version.to_le_bytes());
    b.extend_from_slice(&n_tensors.to_le_bytes());
    b.extend_from_slice(&n_kv.to_le_bytes());
    b
}

#[test]
fn malformed_files_give_clear_errors() {
    let good = small_file().to_bytes();
    assert!(GgufFile::from_bytes(good.clone()).is_ok());

    // Bad magic.
    let mut b = good.clone();
    b[0] = b'X';
    assert!(reject(b).contains("magic"));
    // Empty and tiny files.
    assert!(reject(vec![]).contains("truncated"));
    assert!(reject(b"GGU".to_vec()).contains("truncated"));
    // Unsupported version.
    let mut b = good.clone();
    b[4..8].copy_from_slice(&1u32.to_le_bytes());
    assert!(reject(b).contains("version 1"));
    // Truncated at every prefix length of the header region: an error each time, never a panic.
    let header_end = good.len() - 96;
    for cut in 0..header_end {
        assert!(
            GgufFile::from_bytes(good[..cut].to_vec()).is_err(),
            "prefix {cut} accepted"
        );
    }
    // Truncated tensor data.
    let msg = reject(good[..good.len() - 10].to_vec());
    assert!(msg.contains("outside") && msg.contains("t.q8"), "{msg}");
    // Absurd counts must be refused before allocating.
    assert!(reject(header(3, u64::MAX, 0)).contains("absurd tensor count"));
    assert!(reject(header(3, 0, 1 << 60)).contains("absurd metadata count"));
    let mut b = header(3, 0, 1);
    b.extend_from_slice(&(u64::MAX - 3).to_le_bytes()); // key length
    assert!(reject(b).contains("absurd"));
    let mut b = header(3, 0, 1);
    b.extend_from_slice(&1u64.to_le_bytes());
    b.push(b'k');
    b.extend_from_slice(&9u32.to_le_bytes()); // array
    b.extend_from_slice(&4u32.to_le_bytes()); // of u32
    b.extend_from_slice(&(1u64 << 62).to_le_bytes());
    assert!(reject(b).contains("absurd"));
    // Unknown metadata value type.
    let mut b = header(3, 0, 1);
    b.extend_from_slice(&1u64.to_le_bytes());
    b.push(b'k');
    b.extend_from_slice(&77u32.to_le_bytes());
    assert!(reject(b).contains("unknown value type 77"));
}

fn with_tensor(dims: &[u64], ty: u32, offset: u64, data_len: usize) -> Vec<u8> {
    let mut b = header(3, 1, 0);
    b.extend_from_slice(&4u64.to_le_bytes());
    b.extend_from_slice(b"bad!");
    b.extend_from_slice(&(dims.len() as u32).to_le_bytes());
    for d in dims {
        b.extend_from_slice(&d.to_le_bytes());
    }
    b.extend_from_slice(&ty.to_le_bytes());
    b.extend_from_slice(&offset.to_le_bytes());
    b.resize(b.len().div_ceil(32) * 32 + data_len, 0);
    b
}

#[test]
fn malformed_tensor_infos_give_clear_errors() {
    assert!(GgufFile::from_bytes(with_tensor(&[4, 2], 0, 0, 32)).is_ok());
    assert!(reject(with_tensor(&[4, 2], 99, 0, 32)).contains("unknown element type 99"));
    assert!(reject(with_tensor(&[4, 2], 0, 0, 31)).contains("outside"));
    assert!(reject(with_tensor(&[4, 2], 0, 64, 32)).contains("outside"));
    assert!(reject(with_tensor(&[4, 2], 0, 3, 64)).contains("alignment"));
    assert!(reject(with_tensor(&[4, 0], 0, 0, 32)).contains("zero"));
    assert!(reject(with_tensor(&[1, 1, 1, 1, 1], 0, 0, 32)).contains("dimensions"));
    assert!(reject(with_tensor(&[33], 8, 0, 64)).contains("block size"));
    assert!(reject(with_tensor(&[u64::MAX / 2, u64::MAX / 2], 0, 0, 32)).contains("overflow"));
    assert!(reject(with_tensor(&[4, 2], 0, u64::MAX - 31, 32)).contains("outside"));
    // Duplicate names and keys.
    let mut w = small_file();
    w.add_tensor("t.f32", &[4], GgmlType::F32, vec![0; 16]);
    assert!(matches!(
        GgufFile::from_bytes(w.to_bytes()),
        Err(GgufError::DuplicateTensor(_))
    ));
    let mut w = small_file();
    w.add_meta("some.f32", MetaValue::F32(1.0));
    assert!(matches!(
        GgufFile::from_bytes(w.to_bytes()),
        Err(GgufError::DuplicateKey(_))
    ));
    // Alignment that is not a power of two.
    let mut w = small_file();
    w.add_meta("general.alignment", MetaValue::U32(24));
    assert!(reject(w.to_bytes()).contains("alignment"));
}

#[test]
fn missing_file_is_an_io_error() {
    let err = GgufFile::open("/nonexistent/model.gguf").unwrap_err();
    assert!(err.to_string().contains("/nonexistent/model.gguf"));
}
