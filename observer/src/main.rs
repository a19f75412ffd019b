//! The `mpi-observer` command; all logic lives in the library.
use std::process::ExitCode;

use mpi_observer::{cli, daemon, functions, launcher, one_line};
use observer_common::FUNCTIONS;

fn main() -> ExitCode {
    let result = match cli::parse().command {
        cli::Command::Attach(args) => {
            daemon::run(args).map_err(|e| Box::new(e) as Box<dyn std::error::Error>)
        }
        cli::Command::ShimPath => launcher::shim_path()
            .map(|p| println!("{}", p.display()))
            .map_err(|e| Box::new(e) as Box<dyn std::error::Error>),
        cli::Command::Run { tools, cmd } => match launcher::run(tools.as_deref(), &cmd) {
            Ok(never) => match never {},
            Err(e) => Err(Box::new(e) as Box<dyn std::error::Error>),
        },
        cli::Command::Sites { library } => mpi_observer::symbols::read_library(&library)
            .map(|lib| {
                for e in lib.entries.values() {
                    let hex: Vec<String> =
                        e.first_bytes.iter().map(|b| format!("{b:02x}")).collect();
                    let class = if e.first_insn_emulated {
                        "emulated"
                    } else {
                        "single-stepped"
                    };
                    let f = &FUNCTIONS[e.id as usize];
                    let d = if functions::is_default(e.id) {
                        "default"
                    } else {
                        "-"
                    };
                    println!(
                        "{:<40} {:#010x} {} {class:<14} {d}",
                        f.name,
                        e.file_offset,
                        hex.join(" ")
                    );
                }
            })
            .map_err(|e| Box::new(e) as Box<dyn std::error::Error>),
        cli::Command::Functions { functions: list } => functions::select(list.as_deref())
            .map(|ids| {
                for id in ids {
                    let f = &FUNCTIONS[id as usize];
                    let d = if functions::is_default(id) {
                        "default"
                    } else {
                        "-"
                    };
                    println!("{:<40} {:<11} {d}", f.name, f.family.as_str());
                }
            })
            .map_err(|e| Box::new(e) as Box<dyn std::error::Error>),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("mpi-observer: error: {}", one_line(&*e));
            ExitCode::FAILURE
        }
    }
}
