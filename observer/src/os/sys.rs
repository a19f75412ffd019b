//! System calls std lacks: the raw `bpf(2)`, for what aya 0.14 does not
//! offer (uprobe_multi programs and links, batched map reads, both used by
//! `attach`), the open-files limit ([`raise_fd_limit`]), and the page size
//! ([`page_size`]).

use std::{
    io,
    mem::size_of,
    os::fd::{AsFd as _, AsRawFd as _, RawFd},
};

use aya::maps::Map;
use aya_obj::generated::{bpf_attr, bpf_cmd};

/// Calls `bpf(cmd, attr)`; returns the non-negative result.
pub fn bpf(cmd: bpf_cmd, attr: &mut bpf_attr) -> io::Result<i64> {
    // SAFETY: attr is a fully initialised bpf_attr of the size we pass;
    // the kernel only accesses the memory its pointers name during the call.
    let r = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd as libc::c_long,
            attr as *mut bpf_attr,
            size_of::<bpf_attr>() as libc::c_uint,
        )
    };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

/// The file descriptor of a map aya created.
pub fn map_fd(map: &Map) -> Option<RawFd> {
    let data = match map {
        Map::Array(d)
        | Map::HashMap(d)
        | Map::LruHashMap(d)
        | Map::PerCpuArray(d)
        | Map::PerCpuHashMap(d)
        | Map::PerCpuLruHashMap(d)
        | Map::RingBuf(d)
        | Map::PerfEventArray(d) => d,
        _ => return None,
    };
    Some(data.fd().as_fd().as_raw_fd())
}

/// Raises the soft limit on open files to the hard limit (and, as root,
/// the hard limit to the kernel's `fs.nr_open`): each probed process holds
/// a few descriptors (its links, its segment), and at the default 1,024 a
/// few hundred processes would leave none for reading /proc.
pub fn raise_fd_limit() {
    let nr_open = std::fs::read_to_string("/proc/sys/fs/nr_open")
        .ok()
        .and_then(|s| s.trim().parse::<libc::rlim_t>().ok());
    // SAFETY: getrlimit/setrlimit on a local struct.
    unsafe {
        let mut lim: libc::rlimit = std::mem::zeroed();
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) != 0 {
            return;
        }
        if let Some(n) = nr_open
            && n > lim.rlim_max
        {
            let raised = libc::rlimit {
                rlim_cur: n,
                rlim_max: n,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) == 0 {
                return;
            }
        }
        lim.rlim_cur = lim.rlim_max;
        libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
    }
}

/// The kernel's page size in bytes: 4 KiB on x86-64, 4, 16 or 64 KiB on
/// arm64 (asked once, never assumed).
pub fn page_size() -> usize {
    static PAGE: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *PAGE.get_or_init(|| {
        // SAFETY: sysconf has no preconditions and no memory effects.
        let n = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        usize::try_from(n).ok().filter(|&n| n > 0).unwrap_or(4096)
    })
}

/// The size of a BPF ring buffer holding at least `bytes`: the kernel wants
/// a power-of-two multiple of the page, so at least one `page`.
pub fn ring_bytes(bytes: u32, page: usize) -> u32 {
    let page = u32::try_from(page).unwrap_or(u32::MAX);
    bytes
        .max(page)
        .checked_next_power_of_two()
        .unwrap_or(1 << 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ring_is_a_power_of_two_number_of_pages_of_any_size() {
        for page in [4096usize, 16384, 65536] {
            for bytes in [0u32, 1, 4096, 4097, 16384, 1 << 20, (1 << 20) + 1] {
                let r = ring_bytes(bytes, page);
                assert!(r >= bytes, "{bytes} in {r}");
                assert_eq!(r as usize % page, 0, "{r} on {page}-byte pages");
                assert!(r.is_power_of_two(), "{r}");
            }
        }
        assert_eq!(
            ring_bytes(4096, 4096),
            4096,
            "the default stays one 4 KiB page"
        );
        assert_eq!(ring_bytes(4096, 65536), 65536);
    }

    #[test]
    fn the_page_size_is_the_kernels() {
        let p = page_size();
        assert!(p.is_power_of_two() && p >= 4096, "{p}");
    }
}
