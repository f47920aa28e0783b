//! A one-line progress indicator on standard error, shown only when it is a terminal.

use std::io::{self, IsTerminal};
use std::time::{Duration, Instant};

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

/// Progress through an input: bytes and lines read, the rate, and for a file of known size the
/// share done and the time left; redrawn at most four times a second.
pub(crate) struct FileProgress {
    progress: Progress,
    total: Option<u64>,
    start: Instant,
    /// Bytes at the last look at the clock.
    looked: u64,
    drawn_at: Instant,
}

/// Bytes between two looks at the clock.
const STEP: u64 = 1 << 20;

impl FileProgress {
    /// Shown for inputs of unknown size, and for files of at least `min_bytes`.
    pub(crate) fn new(label: &'static str, total: Option<u64>, min_bytes: u64) -> Self {
        let mut progress = Progress::new(label);
        progress.shown &= total.is_none_or(|t| t >= min_bytes);
        let now = Instant::now();
        FileProgress { progress, total, start: now, looked: 0, drawn_at: now }
    }

    #[inline]
    pub(crate) fn update(&mut self, bytes: u64, lines: u64) {
        if self.progress.shown && bytes.saturating_sub(self.looked) >= STEP {
            self.looked = bytes;
            let now = Instant::now();
            if now.duration_since(self.drawn_at) >= Duration::from_millis(250) {
                self.drawn_at = now;
                let text = self.text(bytes, lines, now);
                self.progress.update(&text);
            }
        }
    }

    fn text(&self, bytes: u64, lines: u64, now: Instant) -> String {
        let seconds = now.duration_since(self.start).as_secs_f64().max(1e-3);
        let rate = bytes as f64 / seconds;
        let mib = |b: f64| b / f64::from(1u32 << 20);
        let mut text =
            format!("{:.0} MiB, {lines} lines, {:.1} MiB/s", mib(bytes as f64), mib(rate));
        if let Some(total) = self.total.filter(|&t| t > 0) {
            let left = total.saturating_sub(bytes) as f64 / rate.max(1.0);
            text = format!(
                "{:3}% of {:.0} MiB: {text}, {:.0} s left",
                bytes.min(total) * 100 / total,
                mib(total as f64),
                left.ceil()
            );
        }
        text
    }

    pub(crate) fn finish(&mut self, lines: u64) {
        let seconds = self.start.elapsed().as_secs_f64();
        self.progress.finish(&format!("{lines} lines in {seconds:.1} s"));
    }
}
