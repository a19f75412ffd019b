//! The subcommands other than `attach`'s daemon: dispatch and the listings.

use std::io::{self, Write};

use observer_common::FUNCTIONS;

use crate::{
    attach::first_insn::{self, FirstInsn, Isa, measure},
    attach::functions,
    attach::symbols,
    cli,
    collect::launcher,
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
        cli::Command::Step { class } => measure::child(class)?,
        cli::Command::Sites { library, measure } => {
            let lib = symbols::read_library(&library)?;
            let mut all: Vec<&symbols::Entry> =
                lib.entries.values().chain(lib.refused.values()).collect();
            all.sort_by_key(|e| e.id);
            let measured = if measure {
                Some(measure_kernel(&library, lib.isa)?)
            } else {
                None
            };
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
                        "{name:<40} {:#010x} {} {class:<14} ",
                        e.file_offset,
                        hex.join(" ")
                    )?;
                    if let Some(m) = &measured {
                        let at = e.first_bytes.get(usize::from(e.skipped)..).unwrap_or(&[]);
                        let what = first_insn::class_of(lib.isa, at).map_or("-", |n| m[n].as_str());
                        write!(out, "measured:{what:<14} ")?;
                    }
                    write!(out, "{d}")?;
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

/// `sites --measure`: what this kernel does with each class of first
/// instruction, one line each on stderr (with the rule's class where it
/// differs), in the order of [`first_insn::classes`].
fn measure_kernel(
    library: &std::path::Path,
    isa: Isa,
) -> Result<Vec<measure::Outcome>, Box<dyn std::error::Error>> {
    if isa != Isa::HOST {
        return Err(format!(
            "sites --measure: {} is {} code and this machine runs {}: its kernel cannot probe it; list it without --measure",
            library.display(),
            isa.as_str(),
            Isa::HOST.as_str()
        )
        .into());
    }
    let outcomes = measure::measure().map_err(|e| format!("sites --measure: {e}"))?;
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let mut err = io::stderr().lock();
    writeln!(
        err,
        "measured on this kernel ({}), {} classes:",
        release.trim(),
        outcomes.len()
    )?;
    for ((class, outcome), rule) in first_insn::classes(isa)
        .iter()
        .zip(&outcomes)
        .zip(measure::rules())
    {
        let mut line = format!("  {:<34} {}", class.name, outcome.as_str());
        if let measure::Outcome::Refused(e) = outcome {
            line.push_str(&format!(" ({e})"));
        }
        if rule.as_str() != outcome.as_str() {
            line.push_str(&format!(" (the rule says {})", rule.as_str()));
        }
        writeln!(err, "{line}")?;
    }
    Ok(outcomes)
}
