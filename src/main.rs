//! `exactly`: parse the command line, start logging, handle signals, dispatch.

use std::io::Write;
use std::process::ExitCode;

use clap::Parser;
use tokio_util::sync::CancellationToken;
use tracing::{error, info};

use exactly::config::{Cli, Command, RunArgs};

// jq programs allocate for every value they touch; mimalloc takes about a quarter off the
// instructions per record of a jq transform (BENCHMARKS.md, "Profile").
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// mysql_async keeps up to 128 I/O buffers of up to 4 MiB each for reuse by default: one
/// connection needs a few, and the default pool held half of the peak RSS (1,000,000 records
/// into MariaDB: 106 MB; 71 MB with 8 buffers), so 8 of at most 1 MiB.
const MYSQL_BUFFERS: [(&str, &str); 2] = [
    ("MYSQL_ASYNC_BUFFER_POOL_CAP", "8"),
    ("MYSQL_ASYNC_BUFFER_SIZE_CAP", "1048576"),
];

fn main() -> ExitCode {
    for (name, value) in MYSQL_BUFFERS {
        if std::env::var_os(name).is_none() {
            // SAFETY: the first thing the process does: no other thread exists yet to read
            // the environment.
            unsafe { std::env::set_var(name, value) };
        }
    }
    let code = match Cli::parse().command {
        Command::Run(args) => run(*args),
        Command::Audit(args) => exactly::audit::command(*args),
        Command::Offsets(args) => exactly::offsets::command(*args),
        Command::State(args) => exactly::state_command::command(*args),
    };
    end(code)
}

/// `exactly run`: its exit code (`Error::exit_code`, or 3 when the shutdown grace ran out).
fn run(args: RunArgs) -> u8 {
    exactly::telemetry::init(args.log_format, &args.log_level);
    let config = match args.validate() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: {e}");
            return e.exit_code();
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
            return 1;
        }
    };
    let code = runtime.block_on(async_main(config));
    // Dropping the runtime would wait for blocking tasks (a lag query can take seconds); the
    // process is done, and the shutdown grace must hold.
    runtime.shutdown_background();
    code
}

/// Ends the process with `code`, without C exit handlers.
///
/// librdkafka's threads may still run at this point: the lag clients being dropped on a
/// runtime worker, the pipeline's consumer (closed, then deliberately not dropped: rust-rdkafka
/// would close it again), the loop itself after a missed grace. Exit handlers must not run beside
/// them: OpenSSL's `OPENSSL_cleanup` frees memory they still use, and the process then dies of
/// SIGSEGV instead of exiting with its code.
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
            e.exit_code()
        }
        Err(join) => {
            error!(error = %join, "the pipeline task failed");
            1
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
