//! Preflight checks, so a missing privilege or kernel feature is reported as
//! one line that says what to do, before anything is touched.

use std::path::Path;

use thiserror::Error;

/// What the machine or the caller lacks.
#[derive(Debug, Error)]
pub enum PreflightError {
    /// Capabilities missing from the effective set.
    #[error(
        "missing capabilities {missing}: run as root (sudo mpi-observer ...) or grant them \
         (setcap cap_bpf,cap_perfmon,cap_sys_ptrace,cap_dac_read_search+ep mpi-observer)"
    )]
    Capabilities {
        /// Comma-separated capability names.
        missing: String,
    },
    /// The kernel has no BPF system call.
    #[error(
        "this kernel has no BPF support (bpf() returned ENOSYS): use a kernel built with CONFIG_BPF_SYSCALL=y, or use --no-bpf for the shim's figures only"
    )]
    NoBpf,
    /// BPF is there but forbidden to us (seccomp, lockdown).
    #[error(
        "the bpf() system call is not permitted here ({source}): run outside the container or seccomp profile that blocks it, or use --no-bpf"
    )]
    BpfForbidden {
        /// The OS error.
        source: std::io::Error,
    },
    /// The kernel has no uprobe PMU.
    #[error(
        "this kernel has no uprobe support ({path} is missing): use a kernel built with CONFIG_UPROBE_EVENTS=y, or use --no-bpf"
    )]
    NoUprobes {
        /// The sysfs path we looked for.
        path: &'static str,
    },
}

const CAP_DAC_OVERRIDE: u32 = 1;
const CAP_DAC_READ_SEARCH: u32 = 2;
const CAP_SYS_PTRACE: u32 = 19;
const CAP_SYS_ADMIN: u32 = 21;
const CAP_PERFMON: u32 = 38;
const CAP_BPF: u32 = 39;

/// The effective capability set of this process.
fn effective_caps() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines().find_map(|l| {
                l.strip_prefix("CapEff:")
                    .map(|v| u64::from_str_radix(v.trim(), 16))
            })
        })
        .and_then(Result::ok)
        .unwrap_or(0)
}

/// Checks capabilities: CAP_BPF (load programs, create maps) and
/// CAP_PERFMON (uprobes), each satisfied by CAP_SYS_ADMIN too;
/// CAP_SYS_PTRACE (the ptrace access check on other users' /proc/PID/environ,
/// maps and mem) and CAP_DAC_READ_SEARCH (those files, and the stats
/// segments, are readable by their owner only), the latter also satisfied by
/// CAP_DAC_OVERRIDE.
pub fn capabilities() -> Result<(), PreflightError> {
    let caps = effective_caps();
    let has = |c: u32| caps & (1 << c) != 0;
    let mut missing = Vec::new();
    if !has(CAP_BPF) && !has(CAP_SYS_ADMIN) {
        missing.push("CAP_BPF");
    }
    if !has(CAP_PERFMON) && !has(CAP_SYS_ADMIN) {
        missing.push("CAP_PERFMON");
    }
    if !has(CAP_SYS_PTRACE) {
        missing.push("CAP_SYS_PTRACE");
    }
    if !has(CAP_DAC_READ_SEARCH) && !has(CAP_DAC_OVERRIDE) {
        missing.push("CAP_DAC_READ_SEARCH");
    }
    if missing.is_empty() {
        Ok(())
    } else {
        Err(PreflightError::Capabilities {
            missing: missing.join(", "),
        })
    }
}

/// The file aya reads to find the uprobe PMU.
pub const UPROBE_PMU: &str = "/sys/bus/event_source/devices/uprobe/type";

/// Checks the kernel: a working bpf() and the uprobe PMU.
pub fn kernel() -> Result<(), PreflightError> {
    // An invalid command: EINVAL means bpf() exists, ENOSYS means it does
    // not, EPERM means something (seccomp, lockdown) forbids it.
    // SAFETY: a null attribute pointer with size 0 is never dereferenced.
    let r = unsafe { libc::syscall(libc::SYS_bpf, -1i64, std::ptr::null::<u8>(), 0u32) };
    if r < 0 {
        let e = std::io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::ENOSYS) => return Err(PreflightError::NoBpf),
            Some(libc::EPERM) | Some(libc::EACCES) => {
                return Err(PreflightError::BpfForbidden { source: e });
            }
            _ => {}
        }
    }
    if !Path::new(UPROBE_PMU).exists() {
        return Err(PreflightError::NoUprobes { path: UPROBE_PMU });
    }
    Ok(())
}
