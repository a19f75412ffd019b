//! x86-64's first-instruction classes: byte patterns of the instructions
//! found at the start of PMPI functions (see `mpi-observer sites`), each
//! with a function of `xtask/bench/insns.c` (written in x86-64 assembly)
//! that starts with one.

use super::{InsnClass, Set};

/// x86-64, as the bench measures it. `push %rbp` comes first: every kernel
/// since 6.10 or so emulates it.
pub(crate) const SET: Set = Set {
    classes: CLASSES,
    reference: "push %rbp",
    program: "xtask/bench/insns.c",
    objdump_machine: "i386:x86-64",
    multiarch: "x86_64-linux-gnu",
};

/// REX.W, with any R and B bits.
const REX_W: (u8, u8) = (0xfa, 0x48);
/// ModRM with mod = 11: register operand.
const MOD_REG: (u8, u8) = (0xc0, 0xc0);
/// ModRM with mod = 00, rm = 101: RIP-relative memory operand.
const MOD_RIP: (u8, u8) = (0xc7, 0x05);

const CLASSES: &[InsnClass] = &[
    InsnClass {
        func: "f_push_rbp",
        example: "55 push %rbp",
        class: "push r64",
        pattern: &[(0xf8, 0x50)],
    },
    InsnClass {
        func: "f_push_r15",
        example: "41 57 push %r15",
        class: "push r8-r15",
        pattern: &[(0xff, 0x41), (0xf8, 0x50)],
    },
    InsnClass {
        func: "f_sub_rsp",
        example: "48 83 ec 28 sub $0x28,%rsp",
        class: "ALU r64, imm8",
        pattern: &[REX_W, (0xff, 0x83), MOD_REG],
    },
    InsnClass {
        func: "f_cmp_imm32",
        example: "48 81 fa ff ff ff 7f cmp $0x7fffffff,%rdx",
        class: "ALU r64, imm32",
        pattern: &[REX_W, (0xff, 0x81), MOD_REG],
    },
    InsnClass {
        func: "f_mov_rr",
        example: "48 89 d1 mov %rdx,%rcx",
        class: "mov r64, r64",
        pattern: &[REX_W, (0xff, 0x89), MOD_REG],
    },
    InsnClass {
        func: "f_mov_rip",
        example: "48 8b 05 .. mov X(%rip),%rax",
        class: "mov r64, RIP-relative",
        pattern: &[REX_W, (0xff, 0x8b), MOD_RIP],
    },
    InsnClass {
        func: "f_lea_rip",
        example: "48 8d 05 .. lea X(%rip),%rax",
        class: "lea RIP-relative",
        pattern: &[REX_W, (0xff, 0x8d), MOD_RIP],
    },
    InsnClass {
        func: "f_endbr64",
        example: "f3 0f 1e fa endbr64",
        class: "endbr64",
        pattern: &[(0xff, 0xf3), (0xff, 0x0f), (0xff, 0x1e), (0xff, 0xfa)],
    },
    InsnClass {
        func: "f_nop",
        example: "90 nop",
        class: "nop",
        pattern: &[(0xff, 0x90)],
    },
    InsnClass {
        func: "f_nopl",
        example: "0f 1f 40 00 nopl 0x0(%rax)",
        class: "multi-byte nop",
        pattern: &[(0xff, 0x0f), (0xff, 0x1f)],
    },
    InsnClass {
        func: "f_jmp8",
        example: "eb 00 jmp rel8",
        class: "jmp rel8",
        pattern: &[(0xff, 0xeb)],
    },
    InsnClass {
        func: "f_jmp32",
        example: "e9 00 00 00 00 jmp rel32",
        class: "jmp rel32",
        pattern: &[(0xff, 0xe9)],
    },
    InsnClass {
        func: "f_call",
        example: "e8 00 00 00 00 call rel32",
        class: "call rel32",
        pattern: &[(0xff, 0xe8)],
    },
    InsnClass {
        func: "f_jcc",
        example: "75 00 jne rel8",
        class: "jcc rel8",
        pattern: &[(0xf0, 0x70)],
    },
];

#[cfg(test)]
mod tests {
    use super::{super::hex_bytes, *};

    #[test]
    fn sites_fall_in_their_class() {
        let class = |bytes: &str| SET.class_of(&hex_bytes(bytes)).map(|i| CLASSES[i].class);
        assert_eq!(class("55 48 89 e5"), Some("push r64"));
        assert_eq!(class("41 57 41 56"), Some("push r8-r15"));
        assert_eq!(class("4c 83 ec 28"), Some("ALU r64, imm8"));
        assert_eq!(class("48 8b 05 11 22 33 44"), Some("mov r64, RIP-relative"));
        assert_eq!(class("f3 0f 1e fa 55"), Some("endbr64"));
        assert_eq!(class("74 05"), Some("jcc rel8"));
        // mov to memory, and a pattern longer than the bytes: no class.
        assert_eq!(class("48 89 07"), None);
        assert_eq!(class("48 83"), None);
        assert_eq!(class(""), None);
    }
}
