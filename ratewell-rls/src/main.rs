//! `ratewell-rls`: the Envoy rate limit service, configured by environment variables as
//! envoyproxy/ratelimit is (`--help` lists them); `ratewell-rls check -config_dir DIR` checks a
//! configuration directory as that service's `config_check` does.

use std::collections::HashMap;
use std::process::ExitCode;

use ratewell_rls::clock::EpochClock;
use ratewell_rls::settings::{Settings, help};

/// Whether `arg` names this executable: what a container runs when its image's entrypoint is
/// the binary and its manifest's command is the binary too (the Go image's `ENTRYPOINT`, and
/// `command: /bin/ratelimit` in envoyproxy/ratelimit's docker-compose files).
fn is_this_binary(arg: &str) -> bool {
    let (Ok(this), Ok(named)) = (std::env::current_exe(), std::fs::canonicalize(arg)) else {
        return false;
    };
    std::fs::canonicalize(this).is_ok_and(|this| this == named)
}

fn main() -> ExitCode {
    let mut args: Vec<String> = std::env::args().collect();
    // The binary named again as its own first argument is skipped, as the Go binary (which
    // reads no argument) ignores it.
    if args.len() > 1 && is_this_binary(&args[1]) {
        args.remove(1);
    }
    if args.get(1).map(String::as_str) == Some("check") {
        // envoyproxy/ratelimit's `config_check`: its flags, its lines, its exit statuses.
        let status = ratewell_rls::check::run(&args[2..], &mut std::io::stdout().lock());
        return ExitCode::from(u8::try_from(status).unwrap_or(1));
    }
    if args.iter().skip(1).any(|a| a == "--help" || a == "-h") {
        print!("{}", help());
        return ExitCode::SUCCESS;
    }
    if let Some(arg) = args.get(1) {
        eprintln!(
            "ratewell-rls: unknown argument {arg:?} (the settings are environment variables: see --help)"
        );
        return ExitCode::from(2);
    }
    let env: HashMap<String, String> = std::env::vars().collect();
    let settings = match Settings::from_env(&env) {
        Ok(settings) => settings,
        Err(e) => {
            eprintln!("ratewell-rls: {e}");
            return ExitCode::from(2);
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("ratewell-rls: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let json = settings.log_json;
    runtime.block_on(async {
        let running = match ratewell_rls::server::start(settings, EpochClock::new()).await {
            Ok(running) => running,
            Err(e) => {
                eprintln!("ratewell-rls: {e}");
                return ExitCode::FAILURE;
            }
        };
        // Caught from here on: the listening lines below tell a supervisor (and the tests) that
        // a signal now stops the service with its drain.
        let signals = StopSignals::new();
        // Tests read these lines to find the ports they asked the system for (port 0).
        let grpc = match &running.grpc_uds {
            Some(path) => format!("unix:{}", path.display()),
            None => running.grpc.to_string(),
        };
        let listening = format!(
            "ratewell-rls listening: grpc={grpc} http={} debug={}",
            running.http, running.debug
        );
        announce(json, &listening);
        if let Some(addr) = running.prometheus {
            announce(json, &format!("ratewell-rls listening: prometheus={addr}"));
        }
        signals.wait().await;
        running.stop().await;
        ExitCode::SUCCESS
    })
}

/// A startup line: as it is in plain text, a JSON log line with `LOG_FORMAT=json`.
fn announce(json: bool, line: &str) {
    if json {
        ratewell_rls::logging::emit(true, "info", line);
    } else {
        eprintln!("{line}");
    }
}

/// SIGTERM, SIGINT or SIGHUP: the signals the Go service stops on (its runner's), each
/// handled from the moment this is made.
struct StopSignals([Option<tokio::signal::unix::Signal>; 3]);

impl StopSignals {
    fn new() -> StopSignals {
        use tokio::signal::unix::{SignalKind, signal};
        StopSignals([
            signal(SignalKind::terminate()).ok(),
            signal(SignalKind::interrupt()).ok(),
            signal(SignalKind::hangup()).ok(),
        ])
    }

    /// Until one of them arrives (one that could not be handled keeps its default action,
    /// which ends the process).
    async fn wait(self) {
        let [mut term, mut int, mut hup] = self.0;
        tokio::select! {
            _ = arrival(&mut term) => {}
            _ = arrival(&mut int) => {}
            _ = arrival(&mut hup) => {}
        }
    }
}

/// The next arrival of `signal`, or never.
async fn arrival(signal: &mut Option<tokio::signal::unix::Signal>) {
    match signal {
        Some(signal) => {
            signal.recv().await;
        }
        None => std::future::pending().await,
    }
}
