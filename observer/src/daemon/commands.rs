//! The subcommands other than `attach`'s daemon: dispatch and the listings.

use std::io::{self, Write};

use observer_common::FUNCTIONS;

use crate::{
    attach::first_insn::FirstInsn, attach::functions, attach::symbols, cli, collect::launcher,
    daemon,
};

/// Runs one parsed command line.
pub fn run(cli: cli::Cli) -> Result<(), Box<dyn std::error::Error>> {
    match cli.command {
        cli::Command::Attach(args) => daemon::run(args)?,
        cli::Command::Report(args) => crate::client::report::command::run(&args)?,
        cli::Command::Top(args) => crate::client::top::run(&args)?,
        cli::Command::Record(args) => crate::record::command::run(&args)?,
        cli::Command::Simulate(args) => crate::export::simulate::run(&args)?,
        cli::Command::Symbolizer => {
            crate::attach::symbolizer::serve(crate::attach::symbolizer::CHILD_FD)?
        }
        cli::Command::ShimPath => println!("{}", launcher::shim_path()?.display()),
        cli::Command::QmpiFlags { cflags, libs } => {
            println!("{}", crate::collect::qmpi_flags::run(cflags, libs)?)
        }
        cli::Command::Run { tools, cmd } => match launcher::run(tools.as_deref(), &cmd)? {},
        cli::Command::Sites { library } => {
            let lib = symbols::read_library(&library)?;
            let mut all: Vec<&symbols::Entry> =
                lib.entries.values().chain(lib.refused.values()).collect();
            all.sort_by_key(|e| e.id);
            listing(|out| {
                for e in all {
                    let hex: Vec<String> =
                        e.first_bytes.iter().map(|b| format!("{b:02x}")).collect();
                    let class = match (e.first_insn, e.skipped) {
                        (FirstInsn::Emulated, n) if n > 0 => format!("emulated(+{n})"),
                        (c, _) => c.as_str().to_string(),
                    };
                    let d = if functions::is_default(e.id) {
                        "default"
                    } else {
                        "-"
                    };
                    let name = FUNCTIONS[e.id as usize].name;
                    write!(
                        out,
                        "{name:<40} {:#010x} {} {class:<14} {d}",
                        e.file_offset,
                        hex.join(" ")
                    )?;
                    match e.first_insn {
                        // Said, since the function is then not probed.
                        FirstInsn::Refused(why) => writeln!(out, " (not probed: {why})")?,
                        _ => writeln!(out)?,
                    }
                }
                Ok(())
            })?;
        }
        cli::Command::Functions { functions: list } => {
            let ids = functions::select(list.as_deref())?;
            listing(|out| {
                for id in ids {
                    let f = &FUNCTIONS[id as usize];
                    let d = if functions::is_default(id) {
                        "default"
                    } else {
                        "-"
                    };
                    writeln!(out, "{:<40} {:<11} {d}", f.name, f.family.as_str())?;
                }
                Ok(())
            })?;
        }
    }
    Ok(())
}

/// Writes a listing to stdout; a reader that goes away early (`| head`)
/// ends it quietly instead of failing.
fn listing(f: impl FnOnce(&mut dyn Write) -> io::Result<()>) -> io::Result<()> {
    let mut out = io::stdout().lock();
    match f(&mut out).and_then(|()| out.flush()) {
        Err(e) if e.kind() == io::ErrorKind::BrokenPipe => Ok(()),
        r => r,
    }
}
