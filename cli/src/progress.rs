//! A one-line progress indicator on standard error, shown only when it is a terminal.

use std::io::{self, IsTerminal};

/// Redraws `label: what` in place; silent when standard error is not a terminal.
pub(crate) struct Progress {
    label: &'static str,
    shown: bool,
    drawn: bool,
}

impl Progress {
    pub(crate) fn new(label: &'static str) -> Self {
        Progress { label, shown: io::stderr().is_terminal(), drawn: false }
    }

    pub(crate) fn update(&mut self, what: &str) {
        if self.shown {
            // Clear to the end of the line: a shorter message must not leave a tail behind.
            eprint!("\r{}: {what}\x1b[K", self.label);
            self.drawn = true;
        }
    }

    /// End the line (a final message stays on screen).
    pub(crate) fn finish(&mut self, what: &str) {
        if self.shown {
            eprintln!("\r{}: {what}\x1b[K", self.label);
            self.drawn = false;
        }
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        // An error message must not start in the middle of the progress line.
        if self.drawn {
            eprintln!();
        }
    }
}

/// Progress through a file of `total` bytes, redrawn at each whole percent.
pub(crate) struct FileProgress {
    progress: Progress,
    total: u64,
    reported: u64,
}

impl FileProgress {
    /// Shown for files of at least `min_bytes` only.
    pub(crate) fn new(label: &'static str, total: Option<u64>, min_bytes: u64) -> Self {
        let mut progress = Progress::new(label);
        let total = total.unwrap_or(0);
        progress.shown &= total >= min_bytes;
        FileProgress { progress, total, reported: 0 }
    }

    #[inline]
    pub(crate) fn update(&mut self, bytes: u64, lines: u64) {
        if self.progress.shown && bytes - self.reported >= self.total / 100 {
            self.reported = bytes;
            self.progress.update(&format!("{:3}% ({lines} lines)", bytes * 100 / self.total));
        }
    }

    pub(crate) fn finish(&mut self, lines: u64) {
        self.progress.finish(&format!("100% ({lines} lines)"));
    }
}
