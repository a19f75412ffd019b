//! The `mpi-observer` command; all logic lives in the library.
use std::process::ExitCode;

use mpi_observer::{cli, daemon::commands, one_line};

fn main() -> ExitCode {
    match commands::run(cli::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("mpi-observer: error: {}", one_line(&*e));
            ExitCode::FAILURE
        }
    }
}
