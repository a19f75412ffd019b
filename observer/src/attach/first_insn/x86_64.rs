//! x86-64: which first instructions uprobes emulate, and the one prologue
//! instruction a probe may step over.

/// Whether x86-64 uprobes emulate this first instruction instead of
/// single-stepping it out of line (about 20 us instead of 1.3 us per hit
/// here). Measured on Linux 6.18 with `cargo xtask bench observer`: `push`
/// of a register, one- and multi-byte `nop`, `jmp`, `call` and conditional
/// jumps are emulated; `endbr64`, `mov` between registers, ALU with an
/// immediate (`sub $x,%rsp`) and RIP-relative loads are stepped.
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
