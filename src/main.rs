//! `exactly`: parse the configuration, start logging, handle signals, run.

use std::io::Write;
use std::process::ExitCode;

use clap::Parser;
use tokio_util::sync::CancellationToken;
use tracing::{error, info};

use exactly::config::{Cli, Command};

// jq programs allocate for every value they touch; mimalloc takes about a quarter off the
// instructions per record of a jq transform (BENCHMARKS.md, "Profile").
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;
use exactly::error::Error;

fn main() -> ExitCode {
    let cli = Cli::parse();
    let args = match cli.command {
        Command::Run(args) => args,
        Command::Audit(args) => end(audit(*args)),
        Command::Offsets(args) => end(offsets(*args)),
    };
    exactly::telemetry::init(args.log_format, &args.log_level);
    let config = match args.validate() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let code = runtime.block_on(async_main(config));
    // Dropping the runtime would wait for blocking tasks (a lag query can take seconds); the
    // process is done, and the shutdown grace must hold.
    runtime.shutdown_background();
    end(code)
}

/// Ends the process with `code`, without C exit handlers.
///
/// librdkafka's threads may still run at this point: the lag clients being dropped on a
/// runtime worker, the pipeline's consumer (closed, then deliberately not dropped: rust-rdkafka
/// would close it again), the loop itself after a missed grace. Exit handlers must not run beside
/// them: OpenSSL's `OPENSSL_cleanup` frees memory they still use, and the process then dies of
/// SIGSEGV instead of exiting with its code (CI saw it; 7 in 900 failed start-ups here).
/// Nothing of exactly's needs an exit handler: logs are written as they happen, and stdout and
/// stderr are flushed here.
fn end(code: u8) -> ! {
    let _ = std::io::stdout().flush();
    let _ = std::io::stderr().flush();
    // SAFETY: ends the process at once; every log line has been written and flushed.
    unsafe { libc::_exit(i32::from(code)) }
}

/// The run's exit code.
async fn async_main(config: exactly::config::Config) -> u8 {
    let grace = config.shutdown_grace;
    let shutdown = CancellationToken::new();
    let mut run = tokio::spawn(exactly::run(config, shutdown.clone()));
    let finished = tokio::select! {
        // Biased: if the run has already ended, report that rather than a late signal.
        biased;
        r = &mut run => Some(r),
        s = signal() => {
            info!(signal = s, "shutting down: committing the open transaction and leaving the group");
            shutdown.cancel();
            None
        }
    };
    let result = match finished {
        Some(r) => r,
        None => match tokio::time::timeout(grace, &mut run).await {
            Ok(r) => r,
            Err(_) => {
                error!(
                    ?grace,
                    "shutdown did not finish within the grace period; exiting hard"
                );
                return 3;
            }
        },
    };
    match result {
        Ok(Ok(())) => 0,
        Ok(Err(e)) => {
            error!("{e}");
            match e {
                Error::Config(_) | Error::Jq(_) => 2,
                _ => 1,
            }
        }
        Err(join) => {
            error!(error = %join, "the pipeline task failed");
            1
        }
    }
}

/// `exactly audit`: 0 clean, 1 anomalies, 2 bad options, 3 could not complete.
fn audit(args: exactly::config::AuditArgs) -> u8 {
    exactly::telemetry::init(exactly::config::LogFormat::Text, "warn");
    let config = match args.validate() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: {e}");
            return 2;
        }
    };
    let json = config.json;
    match exactly::audit(config) {
        Ok(report) => {
            if json {
                match serde_json::to_string_pretty(&report) {
                    Ok(s) => println!("{s}"),
                    Err(e) => eprintln!("error: {e}"),
                }
            } else {
                print!("{}", report.summary());
            }
            if report.anomalies() == 0 { 0 } else { 1 }
        }
        Err(e) => {
            eprintln!("error: {e}");
            match e {
                Error::Config(_) | Error::Jq(_) => 2,
                _ => 3,
            }
        }
    }
}

/// `exactly offsets`: 0 done, 2 bad options or a validation error, 3 could not complete.
fn offsets(args: exactly::config::offsets::OffsetsArgs) -> u8 {
    use exactly::config::offsets::OffsetsCommand;
    use exactly::offsets::{migrate, open};
    exactly::telemetry::init(exactly::config::LogFormat::Text, "warn");
    let result = (|| match args.command {
        OffsetsCommand::Show(a) => migrate::show(&a.group.target()?),
        OffsetsCommand::Import(a) => {
            let target = a.group.target()?;
            let store = open(&a.from, &a.store.options(&target)?)?;
            migrate::import(&target, store.as_ref(), a.missing, a.clamp, a.dry_run)
        }
        OffsetsCommand::Export(a) => {
            let target = a.group.target()?;
            let store = open(&a.to, &a.store.options(&target)?)?;
            migrate::export(&target, store.as_ref(), a.dry_run)
        }
    })();
    match result {
        Ok(text) => {
            print!("{text}");
            0
        }
        Err(e) => {
            eprintln!("error: {e}");
            if matches!(e, Error::Config(_)) { 2 } else { 3 }
        }
    }
}

/// Resolves on SIGTERM or SIGINT, with the signal's name.
async fn signal() -> &'static str {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        // Without signal handling the process can still be killed; never resolve.
        return std::future::pending().await;
    };
    tokio::select! {
        _ = term.recv() => "SIGTERM",
        _ = int.recv() => "SIGINT",
    }
}
