//! The CPU's counter on x86-64, as the shim reads it (shim/src/arch).

/// The time-stamp counter.
pub fn counter() -> Option<u64> {
    // SAFETY: rdtsc has no preconditions on x86-64 (user mode may read it
    // unless the kernel sets CR4.TSD, which it does only for seccomp's
    // strict mode).
    Some(unsafe { core::arch::x86_64::_rdtsc() })
}
