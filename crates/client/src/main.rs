//! `statestore-cli`: the state store from a shell. Keys and values through the MQTT broker, as
//! any SDK client would; cluster administration over the nodes' HTTP API.
//!
//! Exit codes: 0 done (found, applied), 1 not found, 2 not applied (a condition or a fencing
//! token refused the write, or a lock is held by another), 3 error, 64 bad usage; `lock ... --
//! CMD` exits with CMD's code.

mod cli;

use std::process::ExitCode;

fn main() -> ExitCode {
    let args = match cli::Args::parse_command_line() {
        Ok(args) => args,
        Err(e) => {
            let usage = e.use_stderr();
            let _ = e.print();
            return if usage { ExitCode::from(cli::Outcome::Usage.code()) } else { ExitCode::SUCCESS };
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build() {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("statestore-cli: cannot start the async runtime: {e}");
            return ExitCode::from(cli::Outcome::Error.code());
        }
    };
    let outcome = runtime.block_on(cli::run(args));
    runtime.shutdown_timeout(std::time::Duration::from_millis(500));
    ExitCode::from(outcome.code())
}
