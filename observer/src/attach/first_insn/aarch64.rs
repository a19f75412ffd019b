//! AArch64: what Linux's arm64 uprobes do with a function's first
//! instruction, by the rules of `arch/arm64/kernel/probes/decode-insn.c`
//! (`arm_probe_decode_insn` and `aarch64_insn_is_steppable`):
//! - branches (`b`, `bl`, `b.cond`, `cbz`, `tbz`, `br`, `blr`, `ret`) and
//!   `adr`/`adrp` are simulated in the breakpoint handler;
//! - most others are single-stepped out of line, the usual prologues
//!   (`stp x29, x30, [sp, #-n]!`, `sub sp, sp, #n`) and the PAC and BTI
//!   landing hints (`paciasp`, `bti c`, since Linux 5.8) included;
//! - a few are refused, and then registering the probe fails: `mrs` of
//!   DAIF (stepped with interrupts masked, it would read the wrong value;
//!   `mrs` of any other register, such as a TLS read of `tpidr_el0`, is
//!   stepped, as `sites --measure` shows), `msr`,
//!   exception-generating instructions, the authenticated branches,
//!   exclusive loads and stores, hints outside the kernel's list, and the
//!   PC-relative literal loads (`ldr Xt, label`), which uprobes stopped
//!   simulating with the CVE-2024-50099 fix (every maintained stable
//!   series has it).
//!
//! Instructions are 4 bytes, little-endian, so a probe is never moved off
//! the function's first word here.

use super::{Class, FirstInsn, word};

/// `(mask, value)` pairs, as the kernel's `__AARCH64_INSN_FUNCS` spell them.
fn is(insn: u32, mask: u32, value: u32) -> bool {
    insn & mask == value
}

fn simulated(i: u32) -> bool {
    is(i, 0x7C00_0000, 0x1400_0000) // b, bl
        || is(i, 0xFF00_0010, 0x5400_0000) // b.cond
        || is(i, 0x7E00_0000, 0x3400_0000) // cbz, cbnz
        || is(i, 0x7E00_0000, 0x3600_0000) // tbz, tbnz
        || is(i, 0x1F00_0000, 0x1000_0000) // adr, adrp
        || is(i, 0xFFFF_FC1F, 0xD61F_0000) // br
        || is(i, 0xFFFF_FC1F, 0xD63F_0000) // blr
        || is(i, 0xFFFF_FC1F, 0xD65F_0000) // ret
}

/// The hints the kernel single-steps: nop, the PAC ones that sign or strip
/// with the stack pointer or zero, and BTI's landing pads.
fn steppable_hint(i: u32) -> bool {
    matches!(
        i & 0xFE0,
        0x000 // nop
        | 0x0E0 // xpaclri
        | 0x100 // pacia1716
        | 0x140 // pacib1716
        | 0x300 // paciaz
        | 0x320 // paciasp
        | 0x340 // pacibz
        | 0x360 // pacibsp
        | 0x400 // bti
        | 0x440 // bti c
        | 0x480 // bti j
        | 0x4C0 // bti jc
    )
}

/// Why the kernel refuses to probe `i`, if it does.
fn refused(i: u32) -> Option<&'static str> {
    let branch_or_system = matches!((i >> 25) & 0xF, 0b1010 | 0b1011);
    if branch_or_system {
        if is(i, 0xFF00_0000, 0xD400_0000) {
            return Some("an exception-generating instruction (svc, brk, hvc)");
        }
        if is(i, 0xFEFF_F800, 0xD61F_0800)
            || is(i, 0xFEFF_F800, 0xD63F_0800)
            || is(i, 0xFFFF_FBFF, 0xD65F_0BFF)
        {
            return Some("an authenticated branch (braa, blraa, retaa)");
        }
        if is(i, 0xFFFF_FFFF, 0xD69F_03E0) || is(i, 0xFFFF_FBFF, 0xD69F_0BFF) {
            return Some("eret");
        }
        if is(i, 0xFFF8_F01F, 0xD500_401F) || is(i, 0xFFF0_0000, 0xD510_0000) {
            return Some("msr");
        }
        // mrs of DAIF (op0=3 op1=3 CRn=4 CRm=2 op2=1): the step runs with
        // interrupts masked. Any other mrs is stepped.
        if is(i, 0xFFF0_0000, 0xD530_0000) && (i >> 5) & 0x7FFF == 0x5A11 {
            return Some("mrs of DAIF");
        }
        if is(i, 0xFFFF_F01F, 0xD503_201F) && !steppable_hint(i) {
            return Some("a hint outside the kernel's list");
        }
        return None;
    }
    if is(i, 0xBF00_0000, 0x1800_0000) || is(i, 0xFF00_0000, 0x9800_0000) {
        return Some("ldr (literal), no longer simulated for uprobes (CVE-2024-50099)");
    }
    if is(i, 0xFF00_0000, 0xD800_0000) {
        return Some("prfm (literal)");
    }
    if is(i, 0x3F80_0000, 0x0800_0000) {
        return Some("an exclusive load or store (ldxr, stxr)");
    }
    None
}

/// The class of the function whose code starts with `code`; never a skip.
pub fn place(code: &[u8]) -> (u8, FirstInsn) {
    let Some(word) = code.first_chunk::<4>() else {
        return (0, FirstInsn::Unknown);
    };
    let i = u32::from_le_bytes(*word);
    let class = if simulated(i) {
        FirstInsn::Emulated
    } else if let Some(why) = refused(i) {
        FirstInsn::Refused(why)
    } else {
        FirstInsn::SingleStepped
    };
    (0, class)
}

/// The first-instruction classes `sites --measure` measures, one function
/// each in [`ENTRIES`], in this order (the first that matches is a site's):
/// the prologues and tail code found at PMPI entry points (every first
/// instruction of Debian's arm64 Open MPI and MPICH among them), a TLS
/// read, and the literal load every maintained kernel refuses.
pub(super) const CLASSES: &[Class] = &[
    Class {
        name: "stp x29, x30, [sp, #-n]!",
        pattern: &word(0xFFC0_7FFF, 0xA980_7BFD),
    },
    Class {
        name: "stp (pre-index), other registers",
        pattern: &word(0xFFC0_0000, 0xA980_0000),
    },
    Class {
        name: "sub sp, sp, #n",
        pattern: &word(0xFF80_03FF, 0xD100_03FF),
    },
    Class {
        name: "paciasp",
        pattern: &word(0xFFFF_FFFF, 0xD503_233F),
    },
    Class {
        name: "bti c",
        pattern: &word(0xFFFF_FFFF, 0xD503_245F),
    },
    Class {
        name: "nop",
        pattern: &word(0xFFFF_FFFF, 0xD503_201F),
    },
    Class {
        name: "mov (register)",
        pattern: &word(0x7FE0_FFE0, 0x2A00_03E0),
    },
    Class {
        name: "b",
        pattern: &word(0xFC00_0000, 0x1400_0000),
    },
    Class {
        name: "adrp",
        pattern: &word(0x9F00_0000, 0x9000_0000),
    },
    Class {
        name: "cbz, cbnz",
        pattern: &word(0x7E00_0000, 0x3400_0000),
    },
    Class {
        name: "ret",
        pattern: &word(0xFFFF_FC1F, 0xD65F_0000),
    },
    Class {
        name: "mrs xN, tpidr_el0",
        pattern: &word(0xFFFF_FFE0, 0xD53B_D040),
    },
    Class {
        name: "ldr (literal)",
        pattern: &word(0x3B00_0000, 0x1800_0000),
    },
    Class {
        name: "movz (mov wN, #imm)",
        pattern: &word(0x7F80_0000, 0x5280_0000),
    },
    Class {
        name: "orr (immediate)",
        pattern: &word(0x7F80_0000, 0x3200_0000),
    },
    Class {
        name: "cmp (subs immediate)",
        pattern: &word(0x7F80_0000, 0x7100_0000),
    },
];

// One function per class, in CLASSES' order: its instruction, what undoes
// it, `ret`. Only caller-saved registers (x9) and flags are changed; x19
// and x20 are restored.
#[cfg(target_arch = "aarch64")]
core::arch::global_asm!(
    ".pushsection .text.mpi_observer_step, \"ax\", %progbits",
    ".p2align 4",
    ".globl mpi_observer_step_0",
    ".hidden mpi_observer_step_0",
    "mpi_observer_step_0: stp x29, x30, [sp, #-16]!; ldp x29, x30, [sp], #16; ret",
    ".p2align 4",
    ".globl mpi_observer_step_1",
    ".hidden mpi_observer_step_1",
    "mpi_observer_step_1: stp x19, x20, [sp, #-16]!; ldp x19, x20, [sp], #16; ret",
    ".p2align 4",
    ".globl mpi_observer_step_2",
    ".hidden mpi_observer_step_2",
    "mpi_observer_step_2: sub sp, sp, #32; add sp, sp, #32; ret",
    ".p2align 4",
    ".globl mpi_observer_step_3",
    ".hidden mpi_observer_step_3",
    "mpi_observer_step_3: .inst 0xd503233f; .inst 0xd50323bf; ret",
    ".p2align 4",
    ".globl mpi_observer_step_4",
    ".hidden mpi_observer_step_4",
    "mpi_observer_step_4: .inst 0xd503245f; ret",
    ".p2align 4",
    ".globl mpi_observer_step_5",
    ".hidden mpi_observer_step_5",
    "mpi_observer_step_5: nop; ret",
    ".p2align 4",
    ".globl mpi_observer_step_6",
    ".hidden mpi_observer_step_6",
    "mpi_observer_step_6: mov x9, x0; ret",
    ".p2align 4",
    ".globl mpi_observer_step_7",
    ".hidden mpi_observer_step_7",
    "mpi_observer_step_7: b 1f; 1: ret",
    ".p2align 4",
    ".globl mpi_observer_step_8",
    ".hidden mpi_observer_step_8",
    "mpi_observer_step_8: adrp x9, mpi_observer_step_data; ret",
    ".p2align 4",
    ".globl mpi_observer_step_9",
    ".hidden mpi_observer_step_9",
    "mpi_observer_step_9: cbz xzr, 1f; 1: ret",
    ".p2align 4",
    ".globl mpi_observer_step_10",
    ".hidden mpi_observer_step_10",
    "mpi_observer_step_10: ret",
    ".p2align 4",
    ".globl mpi_observer_step_11",
    ".hidden mpi_observer_step_11",
    "mpi_observer_step_11: mrs x9, tpidr_el0; ret",
    ".p2align 4",
    ".globl mpi_observer_step_12",
    ".hidden mpi_observer_step_12",
    "mpi_observer_step_12: ldr x9, 1f; ret; .p2align 3; 1: .quad 0",
    ".p2align 4",
    ".globl mpi_observer_step_13",
    ".hidden mpi_observer_step_13",
    "mpi_observer_step_13: mov w9, #1; ret",
    ".p2align 4",
    ".globl mpi_observer_step_14",
    ".hidden mpi_observer_step_14",
    // orr x9, xzr, #0x7fffffff, as MPICH's large-count File functions start.
    "mpi_observer_step_14: .inst 0xb2407be9; ret",
    ".p2align 4",
    ".globl mpi_observer_step_15",
    ".hidden mpi_observer_step_15",
    "mpi_observer_step_15: cmp x0, #1; ret",
    // So that 16 bytes may be read from the last function's start.
    ".p2align 4",
    ".skip 16",
    ".popsection",
    ".pushsection .data.mpi_observer_step, \"aw\", %progbits",
    ".p2align 3",
    "mpi_observer_step_data: .quad 0",
    ".popsection",
);

#[cfg(target_arch = "aarch64")]
step_entries!(
    mpi_observer_step_0,
    mpi_observer_step_1,
    mpi_observer_step_2,
    mpi_observer_step_3,
    mpi_observer_step_4,
    mpi_observer_step_5,
    mpi_observer_step_6,
    mpi_observer_step_7,
    mpi_observer_step_8,
    mpi_observer_step_9,
    mpi_observer_step_10,
    mpi_observer_step_11,
    mpi_observer_step_12,
    mpi_observer_step_13,
    mpi_observer_step_14,
    mpi_observer_step_15,
);

#[cfg(test)]
mod tests {
    use super::*;

    fn class(i: u32) -> FirstInsn {
        place(&i.to_le_bytes()).1
    }

    #[test]
    fn classes_of_real_first_instructions() {
        // Encodings as aarch64-linux-gnu-objdump prints them.
        assert_eq!(class(0xa9be7bfd), FirstInsn::SingleStepped); // stp x29, x30, [sp, #-32]!
        assert_eq!(class(0xd10283ff), FirstInsn::SingleStepped); // sub sp, sp, #0xa0
        assert_eq!(class(0xd503233f), FirstInsn::SingleStepped); // paciasp
        assert_eq!(class(0xd503245f), FirstInsn::SingleStepped); // bti c
        assert_eq!(class(0xd503201f), FirstInsn::SingleStepped); // nop
        assert_eq!(class(0xaa0003f3), FirstInsn::SingleStepped); // mov x19, x0
        assert_eq!(class(0x14000010), FirstInsn::Emulated); // b .+0x40
        assert_eq!(class(0x94000010), FirstInsn::Emulated); // bl
        assert_eq!(class(0x54000040), FirstInsn::Emulated); // b.eq
        assert_eq!(class(0xb4000040), FirstInsn::Emulated); // cbz x0
        assert_eq!(class(0x36000040), FirstInsn::Emulated); // tbz w0, #0
        assert_eq!(class(0x90000010), FirstInsn::Emulated); // adrp x16, ...
        assert_eq!(class(0xd61f0220), FirstInsn::Emulated); // br x17
        assert_eq!(class(0xd65f03c0), FirstInsn::Emulated); // ret
        assert_eq!(class(0xd53bd040), FirstInsn::SingleStepped); // mrs x0, tpidr_el0
        assert!(matches!(class(0xd53b4220), FirstInsn::Refused(w) if w.starts_with("mrs"))); // mrs x0, daif
        assert!(matches!(class(0x58000050), FirstInsn::Refused(w) if w.starts_with("ldr"))); // ldr x16, .+8
        assert!(matches!(class(0x98000050), FirstInsn::Refused(w) if w.starts_with("ldr"))); // ldrsw x16, .+8
        assert!(matches!(class(0xd4000001), FirstInsn::Refused(_))); // svc #0
        assert!(matches!(class(0xd4200000), FirstInsn::Refused(_))); // brk #0
        assert!(matches!(class(0xc85f7c20), FirstInsn::Refused(w) if w.contains("exclusive"))); // ldxr x0, [x1]
        assert!(matches!(class(0xd65f0bff), FirstInsn::Refused(w) if w.contains("authenticated"))); // retaa
        assert!(matches!(class(0xd51bd040), FirstInsn::Refused(_))); // msr tpidr_el0, x0
        assert!(matches!(class(0xd503205f), FirstInsn::Refused(_))); // wfe
        assert_eq!(place(&[0x1f, 0x20]), (0, FirstInsn::Unknown));
    }
}
