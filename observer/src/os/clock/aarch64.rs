//! The CPU's counter on aarch64, as the shim reads it (shim/src/arch).

/// The generic timer's virtual count (`cntvct_el0`).
pub fn counter() -> Option<u64> {
    let t: u64;
    // SAFETY: reads a register Linux lets user mode read (or emulates, on
    // cores with counter errata).
    unsafe {
        core::arch::asm!("mrs {}, cntvct_el0", out(reg) t, options(nomem, nostack, preserves_flags));
    }
    Some(t)
}
