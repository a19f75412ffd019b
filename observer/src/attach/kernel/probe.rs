//! The feature probes themselves: each asks the running kernel to do the
//! thing the daemon will do, on a function of this very binary, and checks
//! what happened. None reads a version.

use std::{
    mem::zeroed,
    os::fd::{AsRawFd as _, OwnedFd},
    path::Path,
};

use aya_obj::generated::{bpf_attach_type, bpf_attr, bpf_cmd, bpf_map_type};

use super::insn;
use crate::attach::links::{self, perf, sys_bpf};

/// The function the probes attach to: ours, so no other process is
/// touched, and never inlined, so calls reach its first instruction.
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn mpi_observer_feature_probe(x: u64) -> u64 {
    std::hint::black_box(x).wrapping_mul(3) ^ 1
}

/// This binary's file and the file offset of [`mpi_observer_feature_probe`]
/// in it, from our own mappings.
pub fn target() -> Option<(&'static Path, u64)> {
    let addr = mpi_observer_feature_probe as *const () as usize as u64;
    Some((Path::new("/proc/self/exe"), own_offset(addr)?))
}

/// The file offset in this binary of its code at `addr`, from our own
/// mappings.
pub fn own_offset(addr: u64) -> Option<u64> {
    let maps = std::fs::read("/proc/self/maps").ok()?;
    let m = crate::os::procfs::parse_maps(&maps)
        .into_iter()
        .find(|m| m.exec && m.start <= addr && addr < m.end && m.path.is_some())?;
    Some(addr - m.start + m.offset)
}

/// A one-slot array map of a u64.
pub fn array() -> std::io::Result<OwnedFd> {
    // SAFETY: plain old data, zero is the default.
    let mut attr: bpf_attr = unsafe { zeroed() };
    // SAFETY: the map-create member of the zeroed union.
    let m = unsafe { &mut attr.__bindgen_anon_1 };
    m.map_type = bpf_map_type::BPF_MAP_TYPE_ARRAY as u32;
    m.key_size = 4;
    m.value_size = 8;
    m.max_entries = 1;
    sys_bpf(bpf_cmd::BPF_MAP_CREATE, &mut attr)
}

/// Slot 0 of a map made by [`array`]; 0 if it cannot be read.
pub fn read(map: &OwnedFd) -> u64 {
    let key = 0u32;
    let mut value = 0u64;
    // SAFETY: plain old data, zero is the default.
    let mut attr: bpf_attr = unsafe { zeroed() };
    // SAFETY: the element member of the zeroed union; key and value
    // outlive the call and have the map's sizes.
    unsafe {
        let e = &mut attr.__bindgen_anon_2;
        e.map_fd = map.as_raw_fd() as u32;
        e.key = &raw const key as u64;
        e.__bindgen_anon_1.value = &raw mut value as u64;
    }
    match crate::os::sys::bpf(bpf_cmd::BPF_MAP_LOOKUP_ELEM, &mut attr) {
        Ok(_) => value,
        Err(_) => 0,
    }
}

/// Whether the kernel makes BPF ring buffers (Linux 5.8).
pub fn ringbuf() -> bool {
    let page = u32::try_from(crate::os::sys::page_size()).unwrap_or(u32::MAX);
    // SAFETY: plain old data, zero is the default.
    let mut attr: bpf_attr = unsafe { zeroed() };
    // SAFETY: the map-create member of the zeroed union.
    let m = unsafe { &mut attr.__bindgen_anon_1 };
    m.map_type = bpf_map_type::BPF_MAP_TYPE_RINGBUF as u32;
    m.max_entries = page;
    sys_bpf(bpf_cmd::BPF_MAP_CREATE, &mut attr).is_ok()
}

/// Whether kprobe-type programs may call `bpf_get_ns_current_pid_tgid`
/// (Linux 5.7).
pub fn ns_pid() -> bool {
    links::load_insns("mpi_obs_feature", &insn::ns_current_pid_tgid(), 0).is_ok()
}

/// What [`uprobe_multi`] found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Multi {
    /// No uprobe_multi links.
    Missing,
    /// Links, whose PID filter matched the process's main thread only.
    MainThreadOnly,
    /// Links whose PID filter covers every thread of the process.
    EveryThread,
}

/// Makes a uprobe_multi link on [`mpi_observer_feature_probe`] for this
/// process, calls the function once from this thread and once from
/// another, and counts the hits.
pub fn uprobe_multi() -> Multi {
    let Some((path, offset)) = target() else {
        return Multi::Missing;
    };
    let Ok(map) = array() else {
        return Multi::Missing;
    };
    let attach = bpf_attach_type::BPF_TRACE_UPROBE_MULTI as u32;
    let Ok(prog) = links::load_insns("mpi_obs_feature", &insn::count(map.as_raw_fd()), attach)
    else {
        return Multi::Missing;
    };
    let Ok(link) = links::multi::link(
        "mpi_obs_feature",
        &prog,
        path,
        &[offset],
        &[0],
        std::process::id(),
        false,
    ) else {
        return Multi::Missing;
    };
    mpi_observer_feature_probe(1);
    let other = std::thread::spawn(|| mpi_observer_feature_probe(2)).join();
    let hits = read(&map);
    drop(link);
    match (hits, other.is_ok()) {
        (2, true) => Multi::EveryThread,
        (1, _) => Multi::MainThreadOnly,
        // Not even the calling thread: the links do not work here.
        _ => Multi::Missing,
    }
}

/// What [`classic`] found.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Classic {
    /// A program on a uprobe perf event fires (by BPF link or ioctl).
    pub works: bool,
    /// Programs go on perf events by BPF links (pinnable).
    pub links: bool,
    /// The links carry a cookie the program reads back.
    pub cookies: bool,
}

/// A cookie no kernel invents.
const COOKIE: u64 = 0x6d70_692d_6f62_7376;

/// Opens a uprobe perf event on [`mpi_observer_feature_probe`] for this
/// process and attaches a program to it: first by a BPF link with a
/// cookie the program stores, then without the cookie, then by ioctl;
/// calls the function and checks the map each time.
pub fn classic(pmu: perf::Pmu) -> Classic {
    let mut out = Classic::default();
    let Some((path, offset)) = target() else {
        return out;
    };
    let Ok(map) = array() else {
        return out;
    };
    let open = || perf::open(pmu, path, offset, false, Some(std::process::id())).ok();
    let cookie_prog = links::load_insns("mpi_obs_feature", &insn::store_cookie(map.as_raw_fd()), 0);
    let count_prog = links::load_insns("mpi_obs_feature", &insn::count(map.as_raw_fd()), 0);
    if let (Ok(prog), Some(event)) = (&cookie_prog, open())
        && let Ok(link) = perf::link(prog, &event, COOKIE)
    {
        out.links = true;
        mpi_observer_feature_probe(3);
        out.cookies = read(&map) == COOKIE;
        out.works = out.cookies;
        drop(link);
    }
    let Ok(count) = count_prog else {
        return out;
    };
    if !out.cookies
        && let Some(event) = open()
        && let Ok(link) = perf::link(&count, &event, 0)
    {
        let before = read(&map);
        mpi_observer_feature_probe(4);
        out.links = read(&map) == before.wrapping_add(1);
        out.works |= out.links;
        drop(link);
    }
    if !out.works
        && let Some(event) = open()
        && perf::set_bpf(&count, &event).is_ok()
    {
        let before = read(&map);
        mpi_observer_feature_probe(5);
        out.works = read(&map) == before.wrapping_add(1);
    }
    out
}
