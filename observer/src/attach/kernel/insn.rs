//! A few hand-assembled BPF programs for the feature probes: each is a
//! handful of instructions, so writing them out beats building a second
//! object. Encoding: the kernel's `struct bpf_insn` (opcode, dst and src
//! register nibbles, 16-bit offset, 32-bit immediate).

use std::os::fd::RawFd;

use aya_obj::generated::{bpf_func_id, bpf_insn};

// Instruction classes and fields (linux/bpf_common.h, linux/bpf.h).
const BPF_LD: u8 = 0x00;
const BPF_STX: u8 = 0x03;
const BPF_ST: u8 = 0x02;
const BPF_JMP: u8 = 0x05;
const BPF_ALU64: u8 = 0x07;
const BPF_W: u8 = 0x00;
const BPF_DW: u8 = 0x18;
const BPF_IMM: u8 = 0x00;
const BPF_MEM: u8 = 0x60;
const BPF_ATOMIC: u8 = 0xc0;
const BPF_K: u8 = 0x00;
const BPF_X: u8 = 0x08;
const BPF_ADD: u8 = 0x00;
const BPF_MOV: u8 = 0xb0;
const BPF_JEQ: u8 = 0x10;
const BPF_CALL: u8 = 0x80;
const BPF_EXIT: u8 = 0x90;
/// `src_reg` of a 64-bit immediate load that names a map by fd.
const BPF_PSEUDO_MAP_FD: u8 = 1;

const R0: u8 = 0;
const R1: u8 = 1;
const R2: u8 = 2;
const R6: u8 = 6;
const R7: u8 = 7;
const R10: u8 = 10;

fn insn(code: u8, dst: u8, src: u8, off: i16, imm: i32) -> bpf_insn {
    bpf_insn {
        code,
        _bitfield_align_1: [],
        _bitfield_1: bpf_insn::new_bitfield_1(dst, src),
        off,
        imm,
    }
}

fn mov64_reg(dst: u8, src: u8) -> bpf_insn {
    insn(BPF_ALU64 | BPF_MOV | BPF_X, dst, src, 0, 0)
}

fn mov64_imm(dst: u8, imm: i32) -> bpf_insn {
    insn(BPF_ALU64 | BPF_MOV | BPF_K, dst, 0, 0, imm)
}

fn add64_imm(dst: u8, imm: i32) -> bpf_insn {
    insn(BPF_ALU64 | BPF_ADD | BPF_K, dst, 0, 0, imm)
}

fn call(helper: bpf_func_id) -> bpf_insn {
    insn(BPF_JMP | BPF_CALL, 0, 0, 0, helper as i32)
}

fn exit() -> bpf_insn {
    insn(BPF_JMP | BPF_EXIT, 0, 0, 0, 0)
}

/// `r{dst} = map` (two instructions).
fn ld_map_fd(dst: u8, fd: RawFd) -> [bpf_insn; 2] {
    [
        insn(BPF_LD | BPF_DW | BPF_IMM, dst, BPF_PSEUDO_MAP_FD, 0, fd),
        insn(0, 0, 0, 0, 0),
    ]
}

/// `r0 = &map[0]` or exits with 0 when the lookup fails: key 0 on the stack.
fn lookup_slot_zero(map: RawFd) -> Vec<bpf_insn> {
    let mut v = Vec::new();
    // *(u32 *)(r10 - 4) = 0
    v.push(insn(BPF_ST | BPF_MEM | BPF_W, R10, 0, -4, 0));
    v.extend(ld_map_fd(R1, map));
    v.push(mov64_reg(R2, R10));
    v.push(add64_imm(R2, -4));
    v.push(call(bpf_func_id::BPF_FUNC_map_lookup_elem));
    // if r0 != 0 skip the exit
    v.push(insn(BPF_JMP | BPF_JEQ | BPF_K, R0, 0, 0, 0));
    v
}

/// Patches the `if r0 == 0` of [`lookup_slot_zero`] to jump to the exit at
/// the end of `v` (which must then end with `r0 = 0; exit`).
fn jump_to_end(v: &mut [bpf_insn]) {
    let at = v
        .iter()
        .rposition(|i| i.code == BPF_JMP | BPF_JEQ | BPF_K)
        .expect("a lookup's test");
    // The target is the `r0 = 0` two before the end.
    v[at].off = (v.len() - 2 - at - 1) as i16;
}

/// Adds 1 to the u64 in slot 0 of the array `map` at every hit, atomically.
pub fn count(map: RawFd) -> Vec<bpf_insn> {
    let mut v = lookup_slot_zero(map);
    v.push(mov64_imm(R1, 1));
    // lock *(u64 *)(r0 + 0) += r1
    v.push(insn(
        BPF_STX | BPF_DW | BPF_ATOMIC,
        R0,
        R1,
        0,
        BPF_ADD as i32,
    ));
    v.push(mov64_imm(R0, 0));
    v.push(exit());
    jump_to_end(&mut v);
    v
}

/// Stores the attach cookie in slot 0 of the array `map` at every hit.
pub fn store_cookie(map: RawFd) -> Vec<bpf_insn> {
    let mut v = vec![
        mov64_reg(R6, R1),
        mov64_reg(R1, R6),
        call(bpf_func_id::BPF_FUNC_get_attach_cookie),
        mov64_reg(R7, R0),
    ];
    v.extend(lookup_slot_zero(map));
    // *(u64 *)(r0 + 0) = r7
    v.push(insn(BPF_STX | BPF_MEM | BPF_DW, R0, R7, 0, 0));
    v.push(mov64_imm(R0, 0));
    v.push(exit());
    jump_to_end(&mut v);
    v
}

/// Calls `bpf_get_ns_current_pid_tgid(0, 0, &info, 8)` and returns: loads
/// only where the kernel has that helper (Linux 5.7).
pub fn ns_current_pid_tgid() -> Vec<bpf_insn> {
    vec![
        mov64_imm(R1, 0),
        mov64_imm(R2, 0),
        mov64_reg(3, R10),
        add64_imm(3, -8),
        mov64_imm(4, 8),
        call(bpf_func_id::BPF_FUNC_get_ns_current_pid_tgid),
        mov64_imm(R0, 0),
        exit(),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lookup_failure_jumps_to_the_final_return() {
        for p in [count(3), store_cookie(3)] {
            let at = p
                .iter()
                .position(|i| i.code == BPF_JMP | BPF_JEQ | BPF_K)
                .unwrap();
            let target = at + 1 + p[at].off as usize;
            assert_eq!(p[target].code, BPF_ALU64 | BPF_MOV | BPF_K, "r0 = 0");
            assert_eq!(p[target + 1].code, BPF_JMP | BPF_EXIT);
            assert_eq!(target + 2, p.len());
        }
    }

    #[test]
    fn map_loads_take_two_slots() {
        let p = count(7);
        let ld = p.iter().position(|i| i.code == BPF_LD | BPF_DW).unwrap();
        assert_eq!(p[ld].imm, 7);
        assert_eq!(p[ld].src_reg(), BPF_PSEUDO_MAP_FD);
        assert_eq!(p[ld + 1].code, 0);
    }
}
