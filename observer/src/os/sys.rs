//! System calls std lacks: the raw `bpf(2)`, for what aya 0.14 does not
//! offer (uprobe_multi programs and links, batched map reads, both used by
//! `attach`), and the open-files limit ([`raise_fd_limit`]).

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
