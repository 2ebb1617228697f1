//! `nucleus quantize` from the command line: a quantized file and one summary line (no
//! progress bar when stderr is not a terminal), and one-line errors with a non-zero exit for
//! an unknown type, a missing input, an input that is not a GGUF and an output directory that
//! does not exist, leaving no output.

use std::path::{Path, PathBuf};
use std::process::Command;

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../nucleus/tests/data/quantize/tiny-f16.gguf")
}

fn scratch(test: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "nucleus-cli-quantize-{test}-{}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Runs `nucleus quantize ARGS`; (exit code, stderr).
fn quantize(args: &[&str]) -> (i32, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_nucleus"))
        .arg("quantize")
        .args(args)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn quantizes_and_reports_in_one_line() {
    let dir = scratch("ok");
    let out = dir.join("q4km.gguf");
    let (code, err) = quantize(&[fixture().to_str().unwrap(), out.to_str().unwrap(), "q4_k"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(
        err.contains("(Q4_K_M)") && err.contains("39 tensors"),
        "{err}"
    );
    let file = nucleus::gguf::GgufFile::open(&out).unwrap();
    assert_eq!(file.metadata.get_u64("general.file_type"), Some(15));
    std::fs::remove_dir_all(&dir).unwrap();
}

fn fails_with(args: &[&str], want: &[&str]) {
    let (code, err) = quantize(args);
    assert_eq!(code, 1, "{args:?} should fail: {err}");
    assert!(
        want.iter().all(|w| err.contains(w)),
        "{args:?}: {err:?} lacks {want:?}"
    );
    assert_eq!(err.trim().lines().count(), 1, "one line: {err}");
}

#[test]
fn bad_input_is_one_line_and_no_output() {
    let dir = scratch("bad");
    let out = dir.join("out.gguf");
    let o = out.to_str().unwrap();
    let f = fixture();
    fails_with(
        &[f.to_str().unwrap(), o, "Q9_K"],
        &["unknown quantization type \"Q9_K\"", "IQ4_XS"],
    );
    fails_with(
        &[dir.join("absent.gguf").to_str().unwrap(), o, "Q8_0"],
        &["absent.gguf"],
    );
    let text = dir.join("text.gguf");
    std::fs::write(&text, "this is not a model file at all").unwrap();
    fails_with(&[text.to_str().unwrap(), o, "Q8_0"], &["not a GGUF"]);
    let nowhere = dir.join("no-such-dir/out.gguf");
    fails_with(
        &[f.to_str().unwrap(), nowhere.to_str().unwrap(), "Q8_0"],
        &["cannot write", "no-such-dir/out.gguf"],
    );
    assert!(!out.exists());
    let names: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names.len(), 1, "only text.gguf: {names:?}");
    std::fs::remove_dir_all(&dir).unwrap();
}
