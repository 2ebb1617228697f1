//! What the CLI's tests share: the tiny model of `../shared`, running the `nucleus` binary,
//! and its one-line errors.
// Each test file uses some of these.
#![allow(dead_code)]

use std::ffi::OsStr;
use std::fmt::Debug;
use std::path::PathBuf;
use std::process::Command;

/// `../shared/golden/tiny-llama-random.gguf`, or `None` (and a note) where it is absent; in CI
/// its absence fails the test.
pub fn tiny() -> Option<String> {
    let p = PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../../shared/golden/tiny-llama-random.gguf"
    ));
    if p.exists() {
        return Some(p.to_string_lossy().into_owned());
    }
    assert!(
        std::env::var_os("CI").is_none(),
        "the tiny model is missing"
    );
    eprintln!("skipped: the tiny model is absent at {}", p.display());
    None
}

/// Runs `nucleus ARGS`; (exit code, stdout, stderr).
pub fn nucleus<S: AsRef<OsStr> + Debug>(args: &[S]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_nucleus"))
        .args(args)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `nucleus ARGS` exits with 1 and one line of error that contains `want`.
pub fn fails_with<S: AsRef<OsStr> + Debug>(args: &[S], want: &str) {
    let (code, _, err) = nucleus(args);
    assert_eq!(code, 1, "{args:?} should fail: {err}");
    assert!(err.contains(want), "{args:?}: {err:?} lacks {want:?}");
    assert_eq!(err.trim().lines().count(), 1, "one line: {err}");
}
