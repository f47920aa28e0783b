//! Access logs read as requests: one or more files (or standard input), each gzipped or not,
//! in order, through a [`LogFormat`]; lines that do not parse are counted and the first few
//! kept to show; times slightly out of order are decided at the latest time before them.

use std::cell::Cell;
use std::fs::File;
use std::io::{self, BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::rc::Rc;

use flate2::read::MultiGzDecoder;
use ratewell_cli::logs::{COMBINED, ENVOY_DEFAULT, JsonTemplate, LogFormat, Template};
use ratewell_cli::trace::{Reader, Request};

/// The options that read access logs instead of a trace, shared by `replay` and `compare`.
#[derive(clap::Args)]
pub(crate) struct LogArgs {
    /// Read access logs instead of a trace: `nginx` (with --log-format, else nginx's predefined
    /// `combined`), `combined`, `envoy` (with --log-format, else Envoy's default format) or
    /// `json` (one object a line; see --time-field).
    #[arg(long, value_enum, value_name = "FORMAT")]
    pub(crate) log: Option<LogKind>,
    /// The format the log was written with: nginx's `log_format` string (e.g. '$remote_addr
    /// [$time_local] "$request" $status'; its time `$msec`, `$time_iso8601` or `$time_local`)
    /// or Envoy's (`%START_TIME%` its time, in Envoy's default format).
    #[arg(long, value_name = "FORMAT", requires = "log")]
    log_format: Option<String>,
    /// With --log, what a request's key is: variables of the format with any text between
    /// (`$remote_addr`, `$http_x_api_key $uri`; Envoy's `%REQ(X-FORWARDED-FOR)%`; JSON fields
    /// as `$name`, `$a.b` or `${any name}`). Default: `$remote_addr`, Envoy's
    /// `%REQ(X-FORWARDED-FOR)%`, JSON's `$remote_addr`. For `replay` with several policies,
    /// once for every layer, or once per --policy, in order (the key of each layer).
    #[arg(long, requires = "log")]
    key: Vec<String>,
    /// With --log, the variable whose value is a request's cost (e.g. `$body_bytes_sent`; `-`
    /// and 0 count as 1). Default: 1 a request.
    #[arg(long, value_name = "VARIABLE", requires = "log")]
    cost: Option<String>,
    /// With --log json, the field of a line's time (a path through objects: `a.b`).
    #[arg(long, value_name = "FIELD", default_value = "time", requires = "log")]
    time_field: String,
    /// With --log json, how the time is written: `rfc3339` (a string), or a number of `s`,
    /// `ms`, `us` or `ns` since the epoch.
    #[arg(long, value_name = "UNIT", default_value = "rfc3339", requires = "log")]
    time_unit: String,
    /// With --log, stop at the first line that does not parse instead of counting it.
    #[arg(long, requires = "log")]
    pub(crate) strict: bool,
}

/// The access-log formats of --log.
#[derive(Clone, Copy, clap::ValueEnum)]
pub(crate) enum LogKind {
    /// nginx's `log_format` (--log-format), `combined` by default.
    Nginx,
    /// nginx's predefined `combined` format.
    Combined,
    /// Envoy's access log format (--log-format), its default by default.
    Envoy,
    /// JSON lines (--time-field, --time-unit).
    Json,
}

impl LogArgs {
    /// The formats of --log, one per --key (at most `keys` of them, or one), or `None` for a
    /// trace.
    pub(crate) fn formats(&self, keys: usize) -> Result<Option<Vec<LogFormat>>, String> {
        let Some(kind) = self.log else { return Ok(None) };
        let (json, envoy) = (matches!(kind, LogKind::Json), matches!(kind, LogKind::Envoy));
        if !json && (self.time_field != "time" || self.time_unit != "rfc3339") {
            return Err("--time-field and --time-unit are for --log json".into());
        }
        match self.key.len() {
            0 | 1 => {}
            n if n == keys => {}
            n if keys == 1 => {
                return Err(format!("--key given {n} times: a request has one key"));
            }
            n => {
                return Err(format!(
                    "--key given {n} times for {keys} policies: give one key for every layer, \
                     or one per --policy"
                ));
            }
        }
        let format = match (kind, &self.log_format) {
            (LogKind::Combined, Some(_)) => {
                return Err("--log combined is a format of its own: give --log nginx with \
                            --log-format"
                    .into());
            }
            (LogKind::Json, Some(_)) => {
                return Err(
                    "--log json has no --log-format: name its fields (--key, --time-field)".into(),
                );
            }
            (_, Some(f)) => f.as_str(),
            (LogKind::Envoy, None) => ENVOY_DEFAULT,
            (_, None) => COMBINED,
        };
        let default = if envoy { "%REQ(X-FORWARDED-FOR)%" } else { "$remote_addr" };
        let keys: Vec<&str> = if self.key.is_empty() {
            vec![default]
        } else {
            self.key.iter().map(String::as_str).collect()
        };
        let cost = self.cost.as_deref();
        keys.into_iter()
            .map(|key| {
                Ok(match kind {
                    LogKind::Json => LogFormat::Json(JsonTemplate::new(
                        &self.time_field,
                        &self.time_unit,
                        key,
                        cost,
                    )?),
                    LogKind::Envoy => LogFormat::Text(Template::envoy(format, key, cost)?),
                    LogKind::Nginx | LogKind::Combined => {
                        LogFormat::Text(Template::nginx(format, key, cost)?)
                    }
                })
            })
            .collect::<Result<Vec<_>, String>>()
            .map(Some)
    }
}

/// In a request read from logs with one --key per layer, the byte between one layer's key and
/// the next: a line never holds it, so no key does.
pub(crate) const LAYER_SEPARATOR: u8 = b'\n';

/// Requests read one at a time, from a trace or from access logs.
pub(crate) trait Requests {
    /// The next request; `None` at the end.
    fn next_request(&mut self) -> Result<Option<Request<'_>>, String>;
    /// Lines read so far.
    fn lines(&self) -> u64;
    /// Bytes read so far.
    fn bytes(&self) -> u64;
}

impl<R: BufRead> Requests for Reader<R> {
    #[inline]
    fn next_request(&mut self) -> Result<Option<Request<'_>>, String> {
        self.next().map_err(|e| e.to_string())
    }

    fn lines(&self) -> u64 {
        Reader::lines(self)
    }

    fn bytes(&self) -> u64 {
        Reader::bytes(self)
    }
}

impl Requests for LogInput {
    #[inline]
    fn next_request(&mut self) -> Result<Option<Request<'_>>, String> {
        self.next()
    }

    fn lines(&self) -> u64 {
        LogInput::lines(self)
    }

    fn bytes(&self) -> u64 {
        LogInput::bytes(self)
    }
}

/// How to read an input again from its start (for `--find-capacity`).
pub(crate) type Reopen<'a> = dyn Fn() -> Result<Box<dyn Requests>, String> + 'a;

/// How to read an input again from its start, if it can be: logs (`formats`, `files`,
/// `strict`) from their files, not from standard input; else the trace at `trace` (its file, or
/// the copy kept of standard input).
pub(crate) fn reopener<'a>(
    logs: Option<(&'a [LogFormat], &'a [PathBuf], bool)>,
    trace: Option<&'a Path>,
) -> Option<Box<Reopen<'a>>> {
    match logs {
        Some((_, files, _)) if files.iter().any(|f| f.as_os_str() == "-") => None,
        Some((formats, files, strict)) => Some(Box::new(move || {
            Ok(Box::new(LogInput::new(formats.to_vec(), files.to_vec(), strict))
                as Box<dyn Requests>)
        })),
        None => trace.map(|path| {
            Box::new(move || {
                let file =
                    File::open(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
                Ok(Box::new(Reader::new(BufReader::with_capacity(1 << 16, file)))
                    as Box<dyn Requests>)
            }) as Box<Reopen<'a>>
        }),
    }
}

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
    /// The formats of the second and later layers' keys (`--key` once per layer), each read
    /// from the same line and appended after a [`LAYER_SEPARATOR`].
    layers: Vec<LogFormat>,
    layer_key: Vec<u8>,
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
    /// Logs read with `formats` (the first gives each request's time, cost and key, the others
    /// the keys of further layers), from `files` in order (`-` is standard input).
    pub(crate) fn new(formats: Vec<LogFormat>, files: Vec<PathBuf>, strict: bool) -> Self {
        let mut formats = formats.into_iter();
        let template = formats.next().expect("one format at least");
        LogInput {
            template,
            layers: formats.collect(),
            layer_key: Vec::new(),
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
            let mut parsed = self
                .template
                .parse(content, &mut self.spans, &mut self.key)
                .map_err(|e| e.to_string());
            for (i, layer) in self.layers.iter().enumerate() {
                if parsed.is_err() {
                    break;
                }
                match layer.parse(content, &mut self.spans, &mut self.layer_key) {
                    Ok(_) => {
                        self.key.push(LAYER_SEPARATOR);
                        self.key.extend_from_slice(&self.layer_key);
                    }
                    Err(e) => parsed = Err(format!("the key of layer {}: {e}", i + 2)),
                }
            }
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
