//! The `mpi-observer` command; all logic lives in the library.
use std::process::ExitCode;

use mpi_observer::{cli, daemon::commands, one_line};

fn main() -> ExitCode {
    let cli = cli::parse();
    mpi_observer::os::logger::init(cli.log_level);
    match commands::run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            log::error!("{}", one_line(&*e));
            ExitCode::FAILURE
        }
    }
}
