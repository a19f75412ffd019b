//! Where a PMPI function's probe goes, and what the kernel does there: one
//! decoder per instruction set, chosen by the library file's own machine
//! (`e_machine`), never by the host's. A new instruction set is a new file
//! here and one arm in [`place`].

mod aarch64;
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
