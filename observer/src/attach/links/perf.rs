//! Classic uprobes: one perf event of the kernel's uprobe PMU per site,
//! with the program attached to each. Every kernel with BPF has them (the
//! PMU since 4.17); what differs is how the program goes on:
//! - a BPF link per event (`BPF_LINK_CREATE`, attach type
//!   `BPF_PERF_EVENT`, Linux 5.15+) that carries the site's cookie and can
//!   be pinned for a planned restart;
//! - before that, `PERF_EVENT_IOC_SET_BPF` on the event itself: no cookie
//!   (the programs tell functions by address, `FUNC_BY_ADDRESS`) and
//!   nothing to pin.
//!
//! A perf event's PID filter is the process's memory, so it covers every
//! thread; with no PID (on CPU 0, as perf and libbpf do for a system-wide
//! uprobe) it fires for every process that maps the file, on any CPU,
//! which `attach --all` uses to probe a library once for all its ranks.
//!
//! Each event detaches with its own RCU grace period when its last fd
//! closes, so closing is spread over threads (`crate::attach::probes`).

use std::{
    mem::{size_of, zeroed},
    os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd},
    path::Path,
};

use aya_obj::generated::{
    PERF_EVENT_IOC_ENABLE, PERF_EVENT_IOC_SET_BPF, bpf_attach_type, bpf_attr, bpf_cmd,
    perf_event_attr,
};

use super::{LinkError, Mechanism, Target, c_path, sys_bpf};

/// `perf_event_open`'s flag for a close-on-exec fd (linux/perf_event.h).
const PERF_FLAG_FD_CLOEXEC: libc::c_ulong = 1 << 3;

/// Where the kernel describes its uprobe PMU.
const PMU_DIR: &str = "/sys/bus/event_source/devices/uprobe";

/// The uprobe PMU as the kernel numbers it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pmu {
    /// `perf_event_attr.type` of uprobe events.
    pub ty: u32,
    /// The `config` bit that makes a uprobe a uretprobe.
    pub ret_bit: u32,
}

impl Pmu {
    /// Reads the PMU's type and its `retprobe` format bit from sysfs;
    /// `None` on a kernel without it (no CONFIG_UPROBE_EVENTS, or before
    /// 4.17).
    pub fn read() -> Option<Pmu> {
        let ty = std::fs::read_to_string(format!("{PMU_DIR}/type"))
            .ok()?
            .trim()
            .parse()
            .ok()?;
        // "config:0"
        let ret = std::fs::read_to_string(format!("{PMU_DIR}/format/retprobe")).ok()?;
        let ret_bit = ret.trim().strip_prefix("config:")?.parse().ok()?;
        (ret_bit < 64).then_some(Pmu { ty, ret_bit })
    }
}

/// Opens one uprobe (or uretprobe) at `offset` of `path`, for process `pid`
/// or (`None`) every process mapping the file. The event is enabled and
/// has no program yet.
pub fn open(
    pmu: Pmu,
    path: &Path,
    offset: u64,
    ret: bool,
    pid: Option<u32>,
) -> Result<OwnedFd, LinkError> {
    let cpath = c_path(path)?;
    // SAFETY: perf_event_attr is plain old data; zero is its default.
    let mut attr: perf_event_attr = unsafe { zeroed() };
    attr.type_ = pmu.ty;
    attr.size = size_of::<perf_event_attr>() as u32;
    attr.config = if ret { 1 << pmu.ret_bit } else { 0 };
    attr.__bindgen_anon_3.config1 = cpath.as_ptr() as u64;
    attr.__bindgen_anon_4.config2 = offset;
    let (pid, cpu) = match pid {
        Some(p) => (p as libc::pid_t, -1),
        None => (-1, 0),
    };
    // SAFETY: attr is initialised and outlives the call, as does the path
    // it points to; the kernel copies both.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_perf_event_open,
            &raw const attr,
            pid,
            cpu,
            -1,
            PERF_FLAG_FD_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(LinkError::PerfEvent {
            path: path.display().to_string(),
            offset,
            source: std::io::Error::last_os_error(),
        });
    }
    // SAFETY: a new fd perf_event_open gave us.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// Attaches `prog` to the perf event `event` by a BPF link carrying
/// `cookie`; the link holds the event, which may be closed.
pub fn link(prog: &OwnedFd, event: &OwnedFd, cookie: u64) -> std::io::Result<OwnedFd> {
    // SAFETY: plain old data, zero is the default.
    let mut attr: bpf_attr = unsafe { zeroed() };
    // SAFETY: writing the link-create member of a zeroed union.
    let l = unsafe { &mut attr.link_create };
    l.__bindgen_anon_1.prog_fd = prog.as_raw_fd() as u32;
    l.__bindgen_anon_2.target_fd = event.as_raw_fd() as u32;
    l.attach_type = bpf_attach_type::BPF_PERF_EVENT as u32;
    l.__bindgen_anon_3.perf_event.bpf_cookie = cookie;
    sys_bpf(bpf_cmd::BPF_LINK_CREATE, &mut attr)
}

/// Attaches `prog` to the perf event `event` the old way: the event itself
/// then holds the program, and closing it detaches.
pub fn set_bpf(prog: &OwnedFd, event: &OwnedFd) -> std::io::Result<()> {
    for (req, arg) in [
        (PERF_EVENT_IOC_SET_BPF, prog.as_raw_fd() as libc::c_ulong),
        (PERF_EVENT_IOC_ENABLE, 0),
    ] {
        // SAFETY: both requests take an integer argument, no memory.
        if unsafe { libc::ioctl(event.as_raw_fd(), req as libc::Ioctl, arg) } < 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Attaching with classic uprobes.
#[derive(Clone, Copy, Debug)]
pub struct PerfUprobes {
    /// The PMU.
    pub pmu: Pmu,
    /// Programs go on by BPF links (pinnable); otherwise by ioctl.
    pub links: bool,
    /// The links carry the sites' cookies (always false without links);
    /// otherwise the programs tell functions by address.
    pub cookies: bool,
}

impl Mechanism for PerfUprobes {
    fn name(&self) -> &'static str {
        if self.links {
            "perf_link"
        } else {
            "perf_ioctl"
        }
    }

    fn clone_box(&self) -> Box<dyn Mechanism> {
        Box::new(*self)
    }

    fn attach_type(&self) -> u32 {
        // Programs for perf events are loaded with no expected type.
        0
    }

    fn attach(
        &self,
        program: &'static str,
        prog: &OwnedFd,
        path: &Path,
        offsets: &[u64],
        cookies: &[u64],
        target: Target,
        ret: bool,
    ) -> Result<Vec<OwnedFd>, LinkError> {
        let pid = match target {
            Target::Process(p) => Some(p),
            Target::File => None,
        };
        let mut out = Vec::with_capacity(offsets.len());
        for (i, &offset) in offsets.iter().enumerate() {
            // On error `out` is dropped: everything attached so far goes.
            let event = open(self.pmu, path, offset, ret, pid)?;
            let attached = if self.links {
                let cookie = if self.cookies {
                    cookies.get(i).copied().unwrap_or(0)
                } else {
                    0
                };
                link(prog, &event, cookie)
            } else {
                set_bpf(prog, &event).map(|()| event)
            };
            match attached {
                Ok(fd) => out.push(fd),
                Err(source) => {
                    return Err(LinkError::PerfAttach {
                        program,
                        path: path.display().to_string(),
                        offset,
                        source,
                    });
                }
            }
        }
        Ok(out)
    }

    fn pinnable(&self) -> bool {
        self.links
    }

    fn cookies(&self) -> bool {
        self.links && self.cookies
    }

    fn per_file(&self) -> bool {
        true
    }
}
