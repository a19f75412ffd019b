//! Where a PMPI function's probe goes, and what the kernel does there: one
//! decoder per instruction set, chosen by the library file's own machine
//! (`e_machine`), never by the host's. A new instruction set is a new file
//! here and one arm in [`place`].

/// Declares an instruction set's `sites --measure` functions (defined in
/// its `global_asm!`) and their table, `ENTRIES`, in its classes' order.
macro_rules! step_entries {
    ($($f:ident),* $(,)?) => {
        unsafe extern "C" {
            $(fn $f();)*
        }

        /// The functions of [`CLASSES`], in order.
        pub(super) const ENTRIES: &[unsafe extern "C" fn()] = &[$($f),*];
    };
}

mod aarch64;
pub mod measure;
mod x86_64;

/// The instruction set of a library file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Isa {
    /// x86-64.
    X86_64,
    /// AArch64 (arm64).
    Aarch64,
    /// Anything else: probed at the function's first byte, class unknown.
    Other,
}

impl Isa {
    /// This daemon's own: the only one the kernel's uprobes here can probe
    /// natively. A library of another (an arm64 libmpi run by qemu-user on
    /// x86-64) is code an emulator reads, not a probe site.
    pub const HOST: Isa = if cfg!(target_arch = "x86_64") {
        Isa::X86_64
    } else if cfg!(target_arch = "aarch64") {
        Isa::Aarch64
    } else {
        Isa::Other
    };

    /// Its name, as `uname -m` spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            Isa::X86_64 => "x86_64",
            Isa::Aarch64 => "aarch64",
            Isa::Other => "another instruction set",
        }
    }

    /// From an ELF64 file's first bytes (`e_machine`), or `None` if they
    /// are no ELF64 header.
    pub fn of_header(h: &[u8]) -> Option<Isa> {
        if h.len() < 20 || &h[..4] != b"\x7fELF" || h[4] != 2 {
            return None;
        }
        let machine = match h[5] {
            1 => u16::from_le_bytes([h[18], h[19]]),
            2 => u16::from_be_bytes([h[18], h[19]]),
            _ => return None,
        };
        Some(match machine {
            object::elf::EM_X86_64 => Isa::X86_64,
            object::elf::EM_AARCH64 => Isa::Aarch64,
            _ => Isa::Other,
        })
    }

    /// From the file's header.
    pub fn of(arch: object::Architecture) -> Isa {
        match arch {
            object::Architecture::X86_64 => Isa::X86_64,
            object::Architecture::Aarch64 => Isa::Aarch64,
            _ => Isa::Other,
        }
    }
}

/// What the kernel's uprobes do with the instruction a probe sits on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FirstInsn {
    /// Emulated in the breakpoint handler: the cheap probe.
    Emulated,
    /// Single-stepped out of line: about 10x dearer per hit.
    SingleStepped,
    /// Refused: registering a uprobe there fails (and with it a whole
    /// `uprobe_multi` link), so the function is not probed.
    Refused(&'static str),
    /// An instruction set we do not decode.
    Unknown,
}

impl FirstInsn {
    /// The word `mpi-observer sites` prints.
    pub fn as_str(self) -> &'static str {
        match self {
            FirstInsn::Emulated => "emulated",
            FirstInsn::SingleStepped => "single-stepped",
            FirstInsn::Refused(_) => "refused",
            FirstInsn::Unknown => "unknown",
        }
    }
}

/// Where to probe a function whose code starts with `code`: how many bytes
/// to skip, and the class of the instruction found there.
pub fn place(isa: Isa, code: &[u8]) -> (u8, FirstInsn) {
    match isa {
        Isa::X86_64 => {
            let skip = x86_64::skippable_prologue(code);
            let at = code.get(usize::from(skip)..).unwrap_or(&[]);
            let class = if x86_64::emulated(at) {
                FirstInsn::Emulated
            } else {
                FirstInsn::SingleStepped
            };
            (skip, class)
        }
        Isa::Aarch64 => aarch64::place(code),
        Isa::Other => (0, FirstInsn::Unknown),
    }
}

/// A class of first instructions: how `sites` finds it in a library, and
/// this binary's function that starts with one.
pub struct Class {
    /// Its name, e.g. `push r64` or `stp x29, x30, [sp, #-n]!`.
    pub name: &'static str,
    /// Per byte from the first, a mask and the value the masked byte has.
    pub pattern: &'static [(u8, u8)],
}

impl Class {
    /// Whether `code` starts with an instruction of this class.
    pub fn matches(&self, code: &[u8]) -> bool {
        self.pattern.len() <= code.len()
            && self
                .pattern
                .iter()
                .zip(code)
                .all(|((mask, value), b)| b & mask == *value)
    }
}

/// A 32-bit instruction word's `(mask, value)` as little-endian bytes.
pub const fn word(mask: u32, value: u32) -> [(u8, u8); 4] {
    let m = mask.to_le_bytes();
    let v = value.to_le_bytes();
    [(m[0], v[0]), (m[1], v[1]), (m[2], v[2]), (m[3], v[3])]
}

/// The classes of an instruction set's first instructions.
pub fn classes(isa: Isa) -> &'static [Class] {
    match isa {
        Isa::X86_64 => x86_64::CLASSES,
        Isa::Aarch64 => aarch64::CLASSES,
        Isa::Other => &[],
    }
}

/// The class `code` starts with, by index in [`classes`].
pub fn class_of(isa: Isa, code: &[u8]) -> Option<usize> {
    classes(isa).iter().position(|c| c.matches(code))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_header_names_the_machine() {
        let mut h = *b"\x7fELF\x02\x01\x01\x00\0\0\0\0\0\0\0\0\x03\x00\x3e\x00";
        assert_eq!(Isa::of_header(&h), Some(Isa::X86_64));
        h[18] = 183;
        assert_eq!(Isa::of_header(&h), Some(Isa::Aarch64));
        h[18] = 40; // EM_ARM
        assert_eq!(Isa::of_header(&h), Some(Isa::Other));
        h[4] = 1; // ELF32
        assert_eq!(Isa::of_header(&h), None);
        assert_eq!(Isa::of_header(b"\x7fELF"), None);
        assert_eq!(Isa::of_header(b"#!/bin/sh\nexit 0\n\0\0\0\0"), None);
    }
}
