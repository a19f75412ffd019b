//! The raw `bpf(2)` system call, for what aya 0.14 does not offer:
//! uprobe_multi programs and links ([`crate::multi`]) and batched map reads
//! ([`crate::probes`]).

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
