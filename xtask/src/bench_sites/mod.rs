//! The first-instruction classes of `cargo xtask bench observer`: which
//! instructions at a probe site the kernel emulates and which it
//! single-steps, measured on a test program, and checked against
//! `mpi-observer sites` for every probe site of the MPI libraries.
//!
//! What is particular to an instruction set lives in a file of its own
//! here (its classes, its test program, objdump's name for it, Debian's
//! multiarch directory), chosen below by the set this xtask is built for:
//! `x86_64.rs` today, the only set the shim runs on; an `aarch64.rs` with
//! the same [`Set`] is the counterpart, one added file and one line here.

use std::{fs, process::Command};

use anyhow::{Result, bail};

#[cfg(target_arch = "x86_64")]
mod x86_64;

/// The instruction set this xtask is built for.
#[cfg(target_arch = "x86_64")]
pub(crate) use x86_64::SET;

/// An instruction set no file here describes: nothing to measure, as
/// [`check`] says.
#[cfg(not(target_arch = "x86_64"))]
pub(crate) const SET: Set = Set {
    classes: &[],
    reference: "",
    program: "",
    objdump_machine: "",
    multiarch: "",
};

/// What the bench needs of one instruction set.
pub(crate) struct Set {
    /// The classes, the reference first.
    pub(crate) classes: &'static [InsnClass],
    /// The first class's instruction, which every kernel emulates: a class
    /// much dearer to probe than it is single-stepped.
    pub(crate) reference: &'static str,
    /// The test program, one function per class, from the workspace root.
    pub(crate) program: &'static str,
    /// objdump's `-m` for raw bytes of this set.
    pub(crate) objdump_machine: &'static str,
    /// Debian's multiarch directory, under /usr/lib.
    pub(crate) multiarch: &'static str,
}

impl Set {
    /// Index in `classes` of the class `bytes` starts with.
    pub(crate) fn class_of(&self, bytes: &[u8]) -> Option<usize> {
        self.classes.iter().position(|c| {
            c.pattern.len() <= bytes.len()
                && c.pattern
                    .iter()
                    .zip(bytes)
                    .all(|((mask, value), b)| b & mask == *value)
        })
    }
}

/// A first-instruction class: the function of the set's test program that
/// starts with one, and a byte pattern (mask, value per byte) matching
/// library probe sites that start with an instruction of the same class.
pub(crate) struct InsnClass {
    /// The test program's function.
    pub(crate) func: &'static str,
    /// An instruction of the class: its bytes and its assembly.
    pub(crate) example: &'static str,
    /// The class's name in the report.
    pub(crate) class: &'static str,
    /// Per byte from the first, a mask and the value the masked byte has.
    pub(crate) pattern: &'static [(u8, u8)],
}

/// Fails, in one line, where no file here describes this instruction set.
pub(crate) fn check() -> Result<()> {
    if SET.classes.is_empty() {
        let arch = std::env::consts::ARCH;
        bail!(
            "bench observer: no first-instruction classes for {arch}: add xtask/src/bench_sites/{arch}.rs, as x86_64.rs"
        );
    }
    Ok(())
}

/// The bytes of `s`, hex and space-separated (`55 48 89 e5`).
pub(crate) fn hex_bytes(s: &str) -> Vec<u8> {
    s.split_whitespace()
        .filter_map(|b| u8::from_str_radix(b, 16).ok())
        .collect()
}

/// Disassembles the first instruction at `bytes` (hex, space-separated).
pub(crate) fn first_insn(bytes: &str) -> String {
    let hex: Vec<u8> = bytes
        .split_whitespace()
        .filter_map(|b| u8::from_str_radix(b, 16).ok())
        .collect();
    let tmp = std::env::temp_dir().join(format!("bench-observer-insn-{}", std::process::id()));
    if fs::write(&tmp, &hex).is_err() {
        return "?".into();
    }
    let out = Command::new("objdump")
        .args(["-D", "-b", "binary", "-m", SET.objdump_machine])
        .arg(&tmp)
        .output();
    let _ = fs::remove_file(&tmp);
    out.ok()
        .and_then(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .find(|l| l.trim_start().starts_with("0:"))
                .and_then(|l| l.split('\t').nth(2))
                .map(|s| s.split_whitespace().collect::<Vec<_>>().join(" "))
        })
        .unwrap_or_else(|| "?".into())
}
