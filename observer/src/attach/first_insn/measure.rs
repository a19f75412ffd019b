//! What the running kernel does with each first-instruction class,
//! measured, not assumed: `mpi-observer sites --measure`.
//!
//! The static rules ([`super::place`]) say what current kernels do; older
//! ones differ (x86-64's 5.10, 6.1 and 6.12 single-step a multi-byte `nop`
//! that 6.18 emulates), a kernel may learn to emulate more (arm64's
//! `stp x29, x30` is single-stepped up to at least 6.12), and the rules
//! may be wrong (they had arm64's `mrs` of `tpidr_el0` refused, where the
//! kernel steps it). So each class of
//! this instruction set has a function in this binary that starts with an
//! instruction of the class ([`Class`], in the instruction set's file). For
//! each, a child (`mpi-observer __step N`) is started, an entry uprobe is
//! opened on that function for the child alone (no return probe), and the
//! child calls it once:
//! - the probe's count says it was hit;
//! - the child's `[uprobes]` mapping says whether the instruction was
//!   single-stepped: the kernel maps that area (its execute-out-of-line
//!   slots) the first time it steps an instruction for a process, and a
//!   probe it emulates never needs it;
//! - a kernel that refuses the instruction fails the `perf_event_open`.

use std::{
    io::{BufRead as _, BufReader, Read as _, Write as _},
    os::fd::OwnedFd,
    path::PathBuf,
    process::{Command, Stdio},
};

use super::{Class, Isa, classes};
use crate::attach::{
    kernel::probe::own_offset,
    links::perf::{Pmu, open},
};

/// This binary's functions, one per class of [`Isa::HOST`], in order.
fn entries() -> &'static [unsafe extern "C" fn()] {
    #[cfg(target_arch = "x86_64")]
    return super::x86_64::ENTRIES;
    #[cfg(target_arch = "aarch64")]
    return super::aarch64::ENTRIES;
    #[allow(unreachable_code)]
    &[]
}

/// What the rules ([`super::place`]) say of each class's function, in
/// order: what `sites` prints without --measure.
pub fn rules() -> Vec<super::FirstInsn> {
    entries()
        .iter()
        .map(|f| {
            // SAFETY: the first bytes of a function of this binary's text,
            // which is mapped readable; each is longer than 16 bytes or
            // followed by the next, 16-byte aligned.
            let code = unsafe { std::slice::from_raw_parts(*f as usize as *const u8, 16) };
            super::place(Isa::HOST, code).1
        })
        .collect()
}

/// What the kernel did with one class.
#[derive(Debug)]
pub enum Outcome {
    /// Hit, and no out-of-line step.
    Emulated,
    /// Hit, and stepped out of line.
    SingleStepped,
    /// The kernel refused a probe there (the `perf_event_open` error).
    Refused(std::io::Error),
}

impl Outcome {
    /// The word `sites` prints.
    pub fn as_str(&self) -> &'static str {
        match self {
            Outcome::Emulated => "emulated",
            Outcome::SingleStepped => "single-stepped",
            Outcome::Refused(_) => "refused",
        }
    }
}

/// Why a measurement could not be made.
#[derive(Debug, thiserror::Error)]
pub enum MeasureError {
    #[error(
        "this kernel has no uprobe PMU (/sys/bus/event_source/devices/uprobe): it cannot probe at all"
    )]
    NoPmu,
    #[error("this instruction set ({0}) has no first-instruction classes to measure")]
    NoClasses(&'static str),
    #[error("cannot open a uprobe ({0}): measuring needs root, as attach does")]
    NotAllowed(std::io::Error),
    #[error("the measuring child for {class:?}: {what}")]
    Child { class: &'static str, what: String },
}

/// The mapping the kernel creates for out-of-line steps (and uretprobes'
/// trampoline, which no probe here has).
const XOL: &str = "[uprobes]";

/// In the child (`mpi-observer __step N`): says it is ready, waits for a
/// line, calls class `n`'s function once, and says whether this process
/// now has the out-of-line area.
pub fn child(n: usize) -> Result<(), Box<dyn std::error::Error>> {
    let f = *entries().get(n).ok_or("no such class")?;
    let mut out = std::io::stdout().lock();
    writeln!(out, "ready")?;
    out.flush()?;
    let mut line = String::new();
    std::io::stdin().read_line(&mut line)?;
    // SAFETY: each function is the instruction set file's own assembly:
    // it starts with its class's instruction, undoes what that did, and
    // returns, touching no memory outside its stack.
    unsafe { f() };
    let maps = std::fs::read_to_string("/proc/self/maps")?;
    let stepped = maps.lines().any(|l| l.trim_end().ends_with(XOL));
    writeln!(out, "{}", if stepped { "stepped" } else { "not-stepped" })?;
    Ok(())
}

/// Measures every class of this machine's instruction set on the running
/// kernel, in the order of [`classes`]`(Isa::HOST)`.
pub fn measure() -> Result<Vec<Outcome>, MeasureError> {
    let pmu = Pmu::read().ok_or(MeasureError::NoPmu)?;
    let list = classes(Isa::HOST);
    if list.is_empty() || entries().len() != list.len() {
        return Err(MeasureError::NoClasses(Isa::HOST.as_str()));
    }
    // The executable as the kernel resolves it for this process, even if
    // its path was replaced since.
    let exe = PathBuf::from("/proc/self/exe");
    list.iter()
        .enumerate()
        .map(|(n, c)| one(pmu, &exe, n, c))
        .collect()
}

fn one(pmu: Pmu, exe: &std::path::Path, n: usize, c: &Class) -> Result<Outcome, MeasureError> {
    let fail = |what: String| MeasureError::Child {
        class: c.name,
        what,
    };
    let addr = entries()[n] as usize;
    let offset =
        own_offset(addr as u64).ok_or_else(|| fail("its function is in no mapping".into()))?;
    let mut child = Command::new(exe)
        .arg("__step")
        .arg(n.to_string())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .map_err(|e| fail(format!("cannot start: {e}")))?;
    let result = (|| {
        let mut stdout = BufReader::new(child.stdout.take().ok_or("no stdout")?);
        let mut line = String::new();
        stdout.read_line(&mut line)?;
        if line.trim() != "ready" {
            return Err(format!("said {line:?}, not ready").into());
        }
        let event: OwnedFd = match open(pmu, exe, offset, false, Some(child.id())) {
            Ok(fd) => fd,
            Err(crate::attach::links::LinkError::PerfEvent { source, .. }) => {
                return match source.raw_os_error() {
                    Some(libc::EPERM | libc::EACCES) => {
                        Err(Box::new(NotAllowed(source)) as Box<dyn std::error::Error>)
                    }
                    _ => Ok(Outcome::Refused(source)),
                };
            }
            Err(e) => return Err(e.to_string().into()),
        };
        writeln!(child.stdin.as_mut().ok_or("no stdin")?, "go")?;
        line.clear();
        stdout.read_line(&mut line)?;
        let mut count = [0u8; 8];
        std::fs::File::from(event).read_exact(&mut count)?;
        let hits = u64::from_ne_bytes(count);
        match (line.trim(), hits) {
            (_, 0) => Err(format!("the probe was not hit (the child said {line:?})").into()),
            ("stepped", _) => Ok(Outcome::SingleStepped),
            ("not-stepped", _) => Ok(Outcome::Emulated),
            _ => Err(format!("said {line:?}").into()),
        }
    })();
    let _ = child.kill();
    let _ = child.wait();
    result.map_err(
        |e: Box<dyn std::error::Error>| match e.downcast::<NotAllowed>() {
            Ok(n) => MeasureError::NotAllowed(n.0),
            Err(e) => fail(e.to_string()),
        },
    )
}

/// A refusal that is about our privileges, not the instruction.
#[derive(Debug)]
struct NotAllowed(std::io::Error);

impl std::fmt::Display for NotAllowed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl std::error::Error for NotAllowed {}

#[cfg(test)]
mod tests {
    use super::super::{class_of, word};
    use super::*;

    /// Each of this binary's functions starts with an instruction of its
    /// own class (and of no class listed before it), and its class's rule
    /// is the one `sites` prints without --measure.
    #[test]
    fn each_function_starts_with_its_class() {
        let list = classes(Isa::HOST);
        assert_eq!(entries().len(), list.len());
        for (n, f) in entries().iter().enumerate() {
            // SAFETY: reading the first bytes of a function of this
            // binary's text, which is mapped readable.
            let code = unsafe { std::slice::from_raw_parts(*f as usize as *const u8, 16) };
            assert_eq!(class_of(Isa::HOST, code), Some(n), "{}", list[n].name);
        }
    }

    #[test]
    fn words_are_little_endian_bytes() {
        const STP: [(u8, u8); 4] = word(0xFFC0_7FFF, 0xA980_7BFD);
        let c = Class {
            name: "stp",
            pattern: &STP,
        };
        assert!(c.matches(&0xa9be_7bfdu32.to_le_bytes()));
        assert!(!c.matches(&0xa9be_7bf3u32.to_le_bytes()));
        assert!(!c.matches(&[0xfd, 0x7b]));
    }
}
