//! The configuration directory: every file under `RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/
//! RUNTIME_APPDIRECTORY` (recursively; dotfiles skipped with `RUNTIME_IGNOREDOTFILES`), read
//! as one snapshot, and watched for changes.
//!
//! The watch compares a digest of the directory's files (their names and contents, read through
//! the root, so a swapped symlink is followed) at every `RELOAD_INTERVAL`: it catches both of the
//! Go service's watch modes, a root symlink swapped to a new directory (`RUNTIME_WATCH_ROOT=true`,
//! how Kubernetes updates a mounted ConfigMap) and files written, created or removed in the
//! directory (`RUNTIME_WATCH_ROOT=false`), and cannot miss an event the way a notification
//! watch on a replaced directory can. A snapshot is loaded whole or not at all: one bad file
//! keeps the configuration in force, and is counted and logged once per change.

use std::hash::{DefaultHasher, Hash, Hasher};
use std::io;
use std::path::Path;

use crate::configuration::config::{ConfigError, ConfigFile, RateLimitConfig};

/// One file of the directory: its name (`config.basic.yaml`, as envoyproxy/ratelimit's runtime
/// names it: the application directory, then the path below it, joined with dots) and content.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct RuntimeFile {
    /// The file's name in errors.
    pub name: String,
    /// Its content.
    pub content: String,
}

/// Read every file of `dir` (a missing directory has none), named under `prefix`.
pub fn read_dir(dir: &Path, prefix: &str, ignore_dotfiles: bool) -> io::Result<Vec<RuntimeFile>> {
    let mut files = Vec::new();
    match std::fs::metadata(dir) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(files),
        Err(e) => return Err(e),
        Ok(_) => {}
    }
    walk(dir, prefix, ignore_dotfiles, &mut files)?;
    files.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(files)
}

fn walk(
    dir: &Path,
    prefix: &str,
    ignore_dotfiles: bool,
    out: &mut Vec<RuntimeFile>,
) -> io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let file_name = entry.file_name().to_string_lossy().into_owned();
        if ignore_dotfiles && file_name.starts_with('.') {
            continue;
        }
        let name = if prefix.is_empty() { file_name } else { format!("{prefix}.{file_name}") };
        // Followed through links, as the Go loader does (a ConfigMap's files are links).
        let meta = match std::fs::metadata(entry.path()) {
            Ok(meta) => meta,
            // A dangling link, or a file removed meanwhile: not part of the snapshot.
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e),
        };
        if meta.is_dir() {
            walk(&entry.path(), &name, ignore_dotfiles, out)?;
        } else if meta.is_file() {
            let bytes = match std::fs::read(entry.path()) {
                Ok(bytes) => bytes,
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => return Err(e),
            };
            out.push(RuntimeFile { name, content: String::from_utf8_lossy(&bytes).into_owned() });
        }
    }
    Ok(())
}

/// A digest of a snapshot, to tell a change.
pub fn digest(files: &[RuntimeFile]) -> u64 {
    let mut h = DefaultHasher::new();
    files.hash(&mut h);
    h.finish()
}

/// Load a snapshot: every file parsed, then the configuration built (`MERGE_DOMAIN_CONFIG`
/// as `merge_domains`).
pub fn load(files: &[RuntimeFile], merge_domains: bool) -> Result<RateLimitConfig, ConfigError> {
    let parsed = files
        .iter()
        .map(|f| ConfigFile::parse(&f.name, &f.content))
        .collect::<Result<Vec<_>, _>>()?;
    RateLimitConfig::new(&parsed, merge_domains)
}
