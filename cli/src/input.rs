//! Access logs read as requests: one or more files (or standard input), each gzipped or not,
//! in order, through a [`LogFormat`]; lines that do not parse are counted and the first few
//! kept to show; times slightly out of order are decided at the latest time before them.

use std::cell::Cell;
use std::fs::File;
use std::io::{self, BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::rc::Rc;

use flate2::read::MultiGzDecoder;
use ratewell_cli::logs::LogFormat;
use ratewell_cli::trace::Request;

/// A line at most this much earlier than the latest before it is decided at that latest time
/// (logs are written when requests end, so a slow request's line comes after faster ones);
/// an earlier one is skipped and counted.
pub(crate) const REORDER_NS: u64 = 60 * 1_000_000_000;

/// Lines that failed to parse shown in the summary.
const SHOWN: usize = 5;

/// Counts the bytes read from a file (before any decompression), for the progress line.
struct Counted<R> {
    inner: R,
    count: Rc<Cell<u64>>,
}

impl<R: Read> Read for Counted<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.count.set(self.count.get() + n as u64);
        Ok(n)
    }
}

/// What the reader found, for the summary.
#[derive(Default)]
pub(crate) struct Found {
    pub(crate) requests: u64,
    pub(crate) skipped: u64,
    /// `file:line: why` of the first skipped lines.
    pub(crate) first_skipped: Vec<String>,
    /// Lines earlier than one before them by up to [`REORDER_NS`], and the most.
    pub(crate) reordered: u64,
    pub(crate) most_reordered_ns: u64,
    /// Lines earlier by more, skipped (counted in `skipped` too).
    pub(crate) too_early: u64,
    /// Requests at the same instant as the one before.
    pub(crate) same_instant: u64,
    /// The finest a time was written to: 0 whole seconds, 1 ms, 2 µs, 3 ns.
    pub(crate) finest: u8,
}

/// Access logs as requests.
pub(crate) struct LogInput {
    template: LogFormat,
    strict: bool,
    files: Vec<PathBuf>,
    next_file: usize,
    current: Option<(String, Box<dyn BufRead>)>,
    file_line: u64,
    read_bytes: Rc<Cell<u64>>,
    /// Bytes of the files before the current one.
    done_bytes: u64,
    lines: u64,
    line: Vec<u8>,
    key: Vec<u8>,
    spans: Vec<(usize, usize)>,
    origin: Option<u64>,
    latest: u64,
    pub(crate) found: Found,
}

/// The total size of regular files, when every input is one (not for standard input).
pub(crate) fn total_size(files: &[PathBuf]) -> Option<u64> {
    files.iter().map(|f| std::fs::metadata(f).ok().filter(|m| m.is_file()).map(|m| m.len())).sum()
}

impl LogInput {
    pub(crate) fn new(template: LogFormat, files: Vec<PathBuf>, strict: bool) -> Self {
        LogInput {
            template,
            strict,
            files,
            next_file: 0,
            current: None,
            file_line: 0,
            read_bytes: Rc::new(Cell::new(0)),
            done_bytes: 0,
            lines: 0,
            line: Vec::with_capacity(512),
            key: Vec::with_capacity(64),
            spans: Vec::with_capacity(32),
            origin: None,
            latest: 0,
            found: Found::default(),
        }
    }

    /// Open the next file: gzipped when it starts with gzip's magic bytes.
    fn open(&mut self, path: &Path) -> Result<(String, Box<dyn BufRead>), String> {
        let name =
            if path.as_os_str() == "-" { "stdin".to_string() } else { path.display().to_string() };
        self.read_bytes = Rc::new(Cell::new(0));
        let raw: Box<dyn Read> = if path.as_os_str() == "-" {
            Box::new(io::stdin())
        } else {
            let file = File::open(path).map_err(|e| format!("cannot read {name}: {e}"))?;
            if file.metadata().map_err(|e| format!("cannot read {name}: {e}"))?.is_dir() {
                return Err(format!("cannot read {name}: a directory"));
            }
            Box::new(file)
        };
        let counted = Counted { inner: raw, count: self.read_bytes.clone() };
        let mut buffered = BufReader::with_capacity(1 << 16, counted);
        let head = buffered.fill_buf().map_err(|e| format!("cannot read {name}: {e}"))?;
        let reader: Box<dyn BufRead> = if head.starts_with(&[0x1f, 0x8b]) {
            Box::new(BufReader::with_capacity(1 << 16, MultiGzDecoder::new(buffered)))
        } else {
            Box::new(buffered)
        };
        Ok((name, reader))
    }

    /// Bytes read from the files so far (compressed bytes for a gzipped one).
    pub(crate) fn bytes(&self) -> u64 {
        self.done_bytes + self.read_bytes.get()
    }

    /// Lines read so far.
    pub(crate) fn lines(&self) -> u64 {
        self.lines
    }

    /// The next request: its time in ns from the first one's, its key and its cost.
    pub(crate) fn next(&mut self) -> Result<Option<Request<'_>>, String> {
        loop {
            if self.current.is_none() {
                let Some(path) = self.files.get(self.next_file).cloned() else { return Ok(None) };
                self.next_file += 1;
                self.done_bytes += self.read_bytes.get();
                self.current = Some(self.open(&path)?);
                self.file_line = 0;
            }
            let (name, reader) = self.current.as_mut().expect("opened above");
            self.line.clear();
            let n = reader
                .read_until(b'\n', &mut self.line)
                .map_err(|e| format!("cannot read {name} after line {}: {e}", self.file_line))?;
            if n == 0 {
                self.current = None;
                continue;
            }
            self.file_line += 1;
            self.lines += 1;
            let mut content = self.line.strip_suffix(b"\n").unwrap_or(&self.line);
            content = content.strip_suffix(b"\r").unwrap_or(content);
            if content.is_empty() {
                continue;
            }
            let parsed = self.template.parse(content, &mut self.spans, &mut self.key);
            let line = match parsed {
                Ok(line) => line,
                Err(e) => {
                    let why = format!("{name}:{}: {e}", self.file_line);
                    if self.strict {
                        return Err(format!("{why} (--strict)"));
                    }
                    self.skip(why);
                    continue;
                }
            };
            let origin = *self.origin.get_or_insert(line.t);
            let t = line.t.saturating_sub(origin);
            if line.t < origin || t < self.latest {
                let early = (self.latest + origin).saturating_sub(line.t);
                if early > REORDER_NS {
                    self.found.too_early += 1;
                    let why = format!(
                        "{name}:{}: {} s earlier than a line before it (more than {} s)",
                        self.file_line,
                        early / 1_000_000_000,
                        REORDER_NS / 1_000_000_000
                    );
                    if self.strict {
                        return Err(format!("{why} (--strict)"));
                    }
                    self.skip(why);
                    continue;
                }
                self.found.reordered += 1;
                self.found.most_reordered_ns = self.found.most_reordered_ns.max(early);
            }
            let t = t.max(self.latest);
            if self.found.requests > 0 && t == self.latest {
                self.found.same_instant += 1;
            }
            let finest = match line.t {
                t if t % 1_000_000_000 == 0 => 0,
                t if t % 1_000_000 == 0 => 1,
                t if t % 1_000 == 0 => 2,
                _ => 3,
            };
            self.found.finest = self.found.finest.max(finest);
            self.latest = t;
            self.found.requests += 1;
            return Ok(Some(Request { t, key: &self.key, cost: line.cost }));
        }
    }

    fn skip(&mut self, why: String) {
        self.found.skipped += 1;
        if self.found.first_skipped.len() < SHOWN {
            self.found.first_skipped.push(why);
        }
    }

    /// What was read, for standard error: the lines skipped and why, the time's resolution and
    /// what it does to the comparison.
    pub(crate) fn summary(&self) -> String {
        let f = &self.found;
        let mut text = format!("{} lines read, {} requests", self.lines, f.requests);
        if f.skipped > 0 {
            text += &format!(", {} lines skipped", f.skipped);
            for why in &f.first_skipped {
                text += &format!("\n  {why}");
            }
            if f.skipped > f.first_skipped.len() as u64 {
                text += "\n  ...";
            }
        }
        if f.reordered > 0 {
            text += &format!(
                "\n{} requests earlier than one before them (by up to {} ms): decided at the \
                 latest time before them",
                f.reordered,
                f.most_reordered_ns.div_ceil(1_000_000)
            );
        }
        let resolution =
            ["whole seconds", "milliseconds", "microseconds", "nanoseconds"][usize::from(f.finest)];
        let share =
            if f.requests == 0 { 0.0 } else { f.same_instant as f64 * 100.0 / f.requests as f64 };
        text += &format!(
            "\ntimes in {resolution}: {} requests ({share:.1}%) at the same instant as the one \
             before, decided in the log's order at that instant",
            f.same_instant
        );
        if resolution == "whole seconds" && f.same_instant > 0 {
            text += " (a policy that refills within a second sees none of it between them)";
        }
        text
    }
}
