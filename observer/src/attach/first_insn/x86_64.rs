//! x86-64: which first instructions uprobes emulate, and the one prologue
//! instruction a probe may step over.

use super::Class;

/// Whether x86-64 uprobes emulate this first instruction instead of
/// single-stepping it out of line (about 20 us instead of 1.3 us per hit
/// here). Measured on Linux 6.18 with `cargo xtask bench observer`: `push`
/// of a register, one- and multi-byte `nop`, `jmp`, `call` and conditional
/// jumps are emulated; `endbr64`, `mov` between registers, ALU with an
/// immediate (`sub $x,%rsp`) and RIP-relative loads are stepped. Older
/// kernels step the multi-byte `nop` too (5.10, 6.1 and 6.12, measured with
/// `sites --measure`); no PMPI entry point of Debian's libraries starts
/// with one.
pub fn emulated(code: &[u8]) -> bool {
    match code {
        // push %r8..%r15
        [0x41, 0x50..=0x57, ..] => true,
        // push %rax..%rdi
        [0x50..=0x57, ..] => true,
        // nop, jmp rel32/rel8, call rel32, jcc rel8
        [0x90, ..] | [0xe9, ..] | [0xeb, ..] | [0xe8, ..] | [0x70..=0x7f, ..] => true,
        // multi-byte nop (0f 1f /0), jcc rel32 (0f 80..8f)
        [0x0f, 0x1f, ..] | [0x0f, 0x80..=0x8f, ..] => true,
        // endbr64, mov, sub/add $imm, lea, ...: stepped.
        _ => false,
    }
}

/// How many leading bytes of a function the probe may skip so that it sits
/// on an emulated instruction instead of a single-stepped one: about 20 us
/// less per call. Open MPI 4.1 starts `MPI_Test` and `MPI_Waitall` with
/// `mov sym(%rip),%rax` and MPICH 4.0 a dozen functions with
/// `lea sym(%rip),%rax`, each followed by a `push`. Skipping that one
/// instruction is safe because it writes neither an argument register nor
/// %rsp (so the arguments and the return address the uretprobe needs are
/// still where the entry has them), and the `push` after it belongs to the
/// prologue, which no branch inside the function targets. Anything else is
/// probed at its first byte.
pub fn skippable_prologue(code: &[u8]) -> u8 {
    match code {
        // REX.W (no REX.R), mov or lea, ModRM mod=00 rm=101 (RIP-relative),
        // reg = rax or rbx; then push.
        [0x48, 0x8b | 0x8d, m, _, _, _, _, rest @ ..]
            if m & 0xc7 == 0x05
                && matches!((m >> 3) & 7, 0 | 3)
                && matches!(rest, [0x50..=0x57, ..] | [0x41, 0x50..=0x57, ..]) =>
        {
            7
        }
        _ => 0,
    }
}

/// `(mask, value)` of REX.W, with any R and B bits.
const REX_W: (u8, u8) = (0xfa, 0x48);
/// ModRM with mod = 11: a register operand.
const MOD_REG: (u8, u8) = (0xc0, 0xc0);
/// ModRM with mod = 00, rm = 101: a RIP-relative memory operand.
const MOD_RIP: (u8, u8) = (0xc7, 0x05);

/// The first-instruction classes `sites --measure` measures, one function
/// each in [`ENTRIES`], in this order: the prologues and tail code found at
/// PMPI entry points.
pub(super) const CLASSES: &[Class] = &[
    Class {
        name: "push r64",
        pattern: &[(0xf8, 0x50)],
    },
    Class {
        name: "push r8-r15",
        pattern: &[(0xff, 0x41), (0xf8, 0x50)],
    },
    Class {
        name: "ALU r64, imm8",
        pattern: &[REX_W, (0xff, 0x83), MOD_REG],
    },
    Class {
        name: "ALU r64, imm32",
        pattern: &[REX_W, (0xff, 0x81), MOD_REG],
    },
    Class {
        name: "mov r64, r64",
        pattern: &[REX_W, (0xff, 0x89), MOD_REG],
    },
    Class {
        name: "mov r64, RIP-relative",
        pattern: &[REX_W, (0xff, 0x8b), MOD_RIP],
    },
    Class {
        name: "lea RIP-relative",
        pattern: &[REX_W, (0xff, 0x8d), MOD_RIP],
    },
    Class {
        name: "endbr64",
        pattern: &[(0xff, 0xf3), (0xff, 0x0f), (0xff, 0x1e), (0xff, 0xfa)],
    },
    Class {
        name: "nop",
        pattern: &[(0xff, 0x90)],
    },
    Class {
        name: "nopl (0f 1f)",
        pattern: &[(0xff, 0x0f), (0xff, 0x1f)],
    },
    Class {
        name: "jmp rel8",
        pattern: &[(0xff, 0xeb)],
    },
    Class {
        name: "jmp rel32",
        pattern: &[(0xff, 0xe9)],
    },
    Class {
        name: "call rel32",
        pattern: &[(0xff, 0xe8)],
    },
    Class {
        name: "jcc rel8",
        pattern: &[(0xf0, 0x70)],
    },
    Class {
        name: "jcc rel32",
        pattern: &[(0xff, 0x0f), (0xf0, 0x80)],
    },
    Class {
        name: "xor r32, r32",
        pattern: &[(0xff, 0x31), MOD_REG],
    },
    Class {
        name: "xor r32, r32 (REX)",
        pattern: &[(0xf0, 0x40), (0xff, 0x31), MOD_REG],
    },
    Class {
        name: "test r64, r64",
        pattern: &[REX_W, (0xff, 0x85), MOD_REG],
    },
    Class {
        name: "mov r32, r32",
        pattern: &[(0xff, 0x89), MOD_REG],
    },
    Class {
        name: "mov $imm32, r32",
        pattern: &[(0xf8, 0xb8)],
    },
    Class {
        name: "mov $imm32, r32 (REX)",
        pattern: &[(0xf0, 0x40), (0xf8, 0xb8)],
    },
];

// One function per class, in CLASSES' order: its instruction, what undoes
// it, `ret`. Only caller-saved registers and flags are changed.
#[cfg(target_arch = "x86_64")]
core::arch::global_asm!(
    ".pushsection .text.mpi_observer_step, \"ax\", @progbits",
    ".p2align 4",
    ".globl mpi_observer_step_0",
    ".hidden mpi_observer_step_0",
    "mpi_observer_step_0: push %rbp; pop %rbp; ret",
    ".p2align 4",
    ".globl mpi_observer_step_1",
    ".hidden mpi_observer_step_1",
    "mpi_observer_step_1: push %r15; pop %r15; ret",
    ".p2align 4",
    ".globl mpi_observer_step_2",
    ".hidden mpi_observer_step_2",
    "mpi_observer_step_2: sub $0x28, %rsp; add $0x28, %rsp; ret",
    ".p2align 4",
    ".globl mpi_observer_step_3",
    ".hidden mpi_observer_step_3",
    "mpi_observer_step_3: cmp $0x7fffffff, %rdx; ret",
    ".p2align 4",
    ".globl mpi_observer_step_4",
    ".hidden mpi_observer_step_4",
    "mpi_observer_step_4: mov %rdx, %rcx; ret",
    ".p2align 4",
    ".globl mpi_observer_step_5",
    ".hidden mpi_observer_step_5",
    "mpi_observer_step_5: mov mpi_observer_step_data(%rip), %rax; ret",
    ".p2align 4",
    ".globl mpi_observer_step_6",
    ".hidden mpi_observer_step_6",
    "mpi_observer_step_6: lea mpi_observer_step_data(%rip), %rax; ret",
    ".p2align 4",
    ".globl mpi_observer_step_7",
    ".hidden mpi_observer_step_7",
    "mpi_observer_step_7: .byte 0xf3, 0x0f, 0x1e, 0xfa; ret",
    ".p2align 4",
    ".globl mpi_observer_step_8",
    ".hidden mpi_observer_step_8",
    "mpi_observer_step_8: .byte 0x90; ret",
    ".p2align 4",
    ".globl mpi_observer_step_9",
    ".hidden mpi_observer_step_9",
    "mpi_observer_step_9: .byte 0x0f, 0x1f, 0x40, 0x00; ret",
    ".p2align 4",
    ".globl mpi_observer_step_10",
    ".hidden mpi_observer_step_10",
    "mpi_observer_step_10: .byte 0xeb, 0x00; ret",
    ".p2align 4",
    ".globl mpi_observer_step_11",
    ".hidden mpi_observer_step_11",
    "mpi_observer_step_11: .byte 0xe9, 0, 0, 0, 0; ret",
    ".p2align 4",
    ".globl mpi_observer_step_12",
    ".hidden mpi_observer_step_12",
    "mpi_observer_step_12: .byte 0xe8, 0, 0, 0, 0; add $8, %rsp; ret",
    ".p2align 4",
    ".globl mpi_observer_step_13",
    ".hidden mpi_observer_step_13",
    "mpi_observer_step_13: .byte 0x75, 0x00; ret",
    ".p2align 4",
    ".globl mpi_observer_step_14",
    ".hidden mpi_observer_step_14",
    "mpi_observer_step_14: .byte 0x0f, 0x85, 0, 0, 0, 0; ret",
    ".p2align 4",
    ".globl mpi_observer_step_15",
    ".hidden mpi_observer_step_15",
    "mpi_observer_step_15: xor %ecx, %ecx; ret",
    ".p2align 4",
    ".globl mpi_observer_step_16",
    ".hidden mpi_observer_step_16",
    "mpi_observer_step_16: xor %r8d, %r8d; ret",
    ".p2align 4",
    ".globl mpi_observer_step_17",
    ".hidden mpi_observer_step_17",
    "mpi_observer_step_17: test %rsi, %rsi; ret",
    ".p2align 4",
    ".globl mpi_observer_step_18",
    ".hidden mpi_observer_step_18",
    "mpi_observer_step_18: mov %edi, %eax; ret",
    ".p2align 4",
    ".globl mpi_observer_step_19",
    ".hidden mpi_observer_step_19",
    "mpi_observer_step_19: mov $1, %eax; ret",
    ".p2align 4",
    ".globl mpi_observer_step_20",
    ".hidden mpi_observer_step_20",
    "mpi_observer_step_20: mov $1, %r9d; ret",
    // So that 16 bytes may be read from the last function's start.
    ".p2align 4",
    ".skip 16",
    ".popsection",
    ".pushsection .data.mpi_observer_step, \"aw\", @progbits",
    ".p2align 3",
    "mpi_observer_step_data: .quad 0",
    ".popsection",
    options(att_syntax)
);

#[cfg(target_arch = "x86_64")]
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
    mpi_observer_step_16,
    mpi_observer_step_17,
    mpi_observer_step_18,
    mpi_observer_step_19,
    mpi_observer_step_20,
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_instruction_classes() {
        // As measured by the probe-cost benchmark on Linux 6.18.
        assert!(emulated(&[0x41, 0x57]));
        assert!(emulated(&[0x55]));
        assert!(emulated(&[0x0f, 0x1f, 0x44, 0x00]));
        assert!(emulated(&[0x74, 0x05]));
        assert!(!emulated(&[0xf3, 0x0f, 0x1e, 0xfa]));
        assert!(!emulated(&[0x48, 0x89, 0xe5]));
        assert!(!emulated(&[0x48, 0x83, 0xec, 0x18]));
    }

    #[test]
    fn rip_relative_loads_before_a_push_are_skipped() {
        // Open MPI's MPI_Test: mov 0x8a001(%rip),%rax; push %r15
        assert_eq!(
            skippable_prologue(&[0x48, 0x8b, 0x05, 0x01, 0xa0, 0x08, 0x00, 0x41, 0x57]),
            7
        );
        // MPICH: lea ...(%rip),%rax; push %rbx
        assert_eq!(
            skippable_prologue(&[0x48, 0x8d, 0x05, 0x01, 0x04, 0x3e, 0x00, 0x53]),
            7
        );
        // Open MPI's MPI_Finalize: the load is followed by a compare, not a push.
        assert_eq!(
            skippable_prologue(&[0x48, 0x8b, 0x05, 0x81, 0xfd, 0x09, 0x00, 0x80]),
            0
        );
        // Into %rdi, an argument register: never skipped.
        assert_eq!(skippable_prologue(&[0x48, 0x8d, 0x3d, 0, 0, 0, 0, 0x53]), 0);
        // sub $8,%rsp moves the return address: never skipped.
        assert_eq!(skippable_prologue(&[0x48, 0x83, 0xec, 0x08, 0x53]), 0);
    }
}
