//! Files written whole or not at all: a temporary file next to the target, renamed over it once
//! complete, so an error (or a crash) never leaves a half-written chart under the output's name.

use std::fs::{self, File};
use std::io::Write;
use std::path::{Path, PathBuf};

/// An output file being prepared. Dropping it without [`commit`](Self::commit) removes the
/// temporary file and leaves the target untouched.
pub(crate) struct AtomicFile {
    target: PathBuf,
    temp: PathBuf,
    file: Option<File>,
}

impl AtomicFile {
    /// Create the temporary file now, so that an unwritable destination is reported before any
    /// work is done.
    pub(crate) fn create(target: &Path, flag: &str) -> Result<Self, String> {
        let shown = target.display();
        let name = target
            .file_name()
            .ok_or_else(|| format!("{flag} {shown}: expected a file name, not a directory"))?;
        if target.is_dir() {
            return Err(format!("{flag} {shown}: is a directory"));
        }
        let mut temp_name = std::ffi::OsString::from(".");
        temp_name.push(name);
        temp_name.push(format!(".ratewell-{}.tmp", std::process::id()));
        let temp = target.with_file_name(temp_name);
        let file = File::create_new(&temp)
            .map_err(|e| format!("{flag} {shown}: cannot write there: {e}"))?;
        Ok(AtomicFile { target: target.to_path_buf(), temp, file: Some(file) })
    }

    /// Write `bytes` and move the file into place.
    pub(crate) fn commit(mut self, bytes: &[u8]) -> Result<(), String> {
        let shown = self.target.display().to_string();
        let mut file = self.file.take().expect("committed once");
        file.write_all(bytes)
            .and_then(|()| file.sync_all())
            .map_err(|e| format!("cannot write {shown}: {e}"))?;
        drop(file);
        fs::rename(&self.temp, &self.target).map_err(|e| format!("cannot write {shown}: {e}"))?;
        self.temp = PathBuf::new();
        Ok(())
    }
}

impl Drop for AtomicFile {
    fn drop(&mut self) {
        if !self.temp.as_os_str().is_empty() {
            let _ = fs::remove_file(&self.temp);
        }
    }
}
