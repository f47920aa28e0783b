//! `ratewell-rls check`: envoyproxy/ratelimit's `config_check` tool, for CI pipelines that check
//! a configuration change before it ships. The same flags (`-config_dir DIR`,
//! `-merge_domain_configs`), the same lines on standard output, the same exit statuses: every
//! file of the directory (not its subdirectories: a directory among them is an error, as there)
//! read in name order, parsed and loaded as the service loads them, each error in the Go
//! service's words with the file's path; 0 when all are good, 1 on the first bad one, 2 on bad
//! flags.
//!
//! ```
//! let dir = tempfile::tempdir().unwrap();
//! std::fs::write(dir.path().join("a.yaml"), "domain: a\ndescriptors: []\n").unwrap();
//! let args = ["-config_dir".to_owned(), dir.path().display().to_string()];
//! let mut out = Vec::new();
//! assert_eq!(ratewell_rls::check::run(&args, &mut out), 0);
//! assert!(String::from_utf8(out).unwrap().ends_with("all rate limit configs ok\n"));
//! ```

use std::io::Write;
use std::path::Path;

use crate::configuration::config::{ConfigFile, RateLimitConfig};

/// The flags, as Go's `flag` package reads them: `-name value`, `-name=value`, and `--name` for
/// `-name`; a boolean flag takes no value but `=value`.
struct Flags {
    config_dir: String,
    merge: bool,
}

fn parse(args: &[String]) -> Result<Flags, String> {
    let mut flags = Flags { config_dir: String::new(), merge: false };
    let mut args = args.iter();
    while let Some(arg) = args.next() {
        let Some(name) = arg.strip_prefix("--").or_else(|| arg.strip_prefix('-')) else {
            // Go's flag parsing stops at the first argument that is not a flag.
            break;
        };
        let (name, value) = match name.split_once('=') {
            Some((n, v)) => (n, Some(v.to_owned())),
            None => (name, None),
        };
        match name {
            "config_dir" => {
                flags.config_dir = match value {
                    Some(v) => v,
                    None => args
                        .next()
                        .cloned()
                        .ok_or_else(|| "flag needs an argument: -config_dir".to_owned())?,
                }
            }
            "merge_domain_configs" => {
                flags.merge = match value.as_deref() {
                    None | Some("1" | "t" | "T" | "true" | "TRUE" | "True") => true,
                    Some("0" | "f" | "F" | "false" | "FALSE" | "False") => false,
                    Some(v) => {
                        return Err(format!(
                            "invalid boolean value {v:?} for -merge_domain_configs: parse error"
                        ));
                    }
                }
            }
            other => return Err(format!("flag provided but not defined: -{other}")),
        }
    }
    Ok(flags)
}

const USAGE: &str = "Usage of ratewell-rls check:
  -config_dir string
    \tpath to directory containing rate limit configs
  -merge_domain_configs
    \twhether to merge configurations, referencing the same domain
";

/// Run the check with `args` (what follows `check` on the command line), writing what
/// `config_check` writes to `out`; the exit status.
pub fn run(args: &[String], out: &mut impl Write) -> i32 {
    let flags = match parse(args) {
        Ok(flags) => flags,
        Err(e) => {
            let _ = write!(out, "{e}\n{USAGE}");
            return 2;
        }
    };
    match check(&flags, out) {
        Ok(()) => 0,
        Err(line) => {
            let _ = writeln!(out, "{line}");
            1
        }
    }
}

fn check(flags: &Flags, out: &mut impl Write) -> Result<(), String> {
    let _ = writeln!(out, "checking rate limit configs...");
    let _ = writeln!(out, "loading config directory: {}", flags.config_dir);
    let dir = Path::new(&flags.config_dir);
    let opening = |e: std::io::Error| format!("error opening directory {}: {e}", flags.config_dir);
    let mut names = std::fs::read_dir(dir)
        .map_err(opening)?
        .map(|entry| entry.map(|e| e.file_name()))
        .collect::<Result<Vec<_>, _>>()
        .map_err(opening)?;
    names.sort();
    let mut files = Vec::with_capacity(names.len());
    for name in names {
        let path = dir.join(&name).display().to_string();
        let _ = writeln!(out, "opening config file: {path}");
        let bytes = std::fs::read(&path).map_err(|e| format!("error reading file {path}: {e}"))?;
        let content = String::from_utf8_lossy(&bytes);
        let file = ConfigFile::parse(&path, &content)
            .map_err(|e| format!("error loading rate limit configs: {e}"))?;
        files.push(file);
    }
    RateLimitConfig::new(&files, flags.merge)
        .map_err(|e| format!("error loading rate limit configs: {e}"))?;
    let _ = writeln!(out, "all rate limit configs ok");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn flags_as_go_reads_them() {
        let f = parse(&args(&["-config_dir", "/d", "-merge_domain_configs"])).unwrap();
        assert_eq!((f.config_dir.as_str(), f.merge), ("/d", true));
        let f = parse(&args(&["--config_dir=/e", "-merge_domain_configs=false"])).unwrap();
        assert_eq!((f.config_dir.as_str(), f.merge), ("/e", false));
        assert_eq!(
            parse(&args(&["-config"])).err().unwrap(),
            "flag provided but not defined: -config"
        );
        assert_eq!(
            parse(&args(&["-config_dir"])).err().unwrap(),
            "flag needs an argument: -config_dir"
        );
        assert!(parse(&args(&["-merge_domain_configs=yes"])).is_err());
    }
}
