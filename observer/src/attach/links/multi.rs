//! `uprobe_multi` links (Linux 6.6+): every site of one program in one link
//! and one system call, scoped to a process by the kernel's PID filter.
//!
//! Why: each classic (perf-event) uprobe is detached with its own RCU grace
//! period, which measured about 110 ms here, so a rank with 350 probes took
//! 40 s to detach; a uprobe_multi link detaches them all with one. Chosen
//! only where the kernel's PID filter covers every thread of the process
//! (`crate::attach::kernel`): from 6.6 to 6.9 it matched one thread only,
//! and calls from a rank's other threads went uncounted.

use std::{
    mem::zeroed,
    os::fd::{AsRawFd as _, OwnedFd},
    path::Path,
};

use aya_obj::generated::{BPF_F_UPROBE_MULTI_RETURN, bpf_attach_type, bpf_attr, bpf_cmd};

use super::{LinkError, Mechanism, Target, c_path, sys_bpf};

/// Attaching with `uprobe_multi` links.
#[derive(Clone, Copy, Debug, Default)]
pub struct UprobeMulti;

impl Mechanism for UprobeMulti {
    fn name(&self) -> &'static str {
        "uprobe_multi"
    }

    fn clone_box(&self) -> Box<dyn Mechanism> {
        Box::new(*self)
    }

    fn attach_type(&self) -> u32 {
        bpf_attach_type::BPF_TRACE_UPROBE_MULTI as u32
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
            Target::Process(pid) => pid,
            // The kernel's "no filter".
            Target::File => 0,
        };
        link(program, prog, path, offsets, cookies, pid, ret).map(|fd| vec![fd])
    }

    fn pinnable(&self) -> bool {
        true
    }

    fn cookies(&self) -> bool {
        true
    }

    fn per_file(&self) -> bool {
        false
    }
}

/// One uprobe_multi link of `prog` at `offsets` of `path`, for process
/// `pid` (0: every process). Dropping the fd detaches all of its sites.
pub fn link(
    program: &'static str,
    prog: &OwnedFd,
    path: &Path,
    offsets: &[u64],
    cookies: &[u64],
    pid: u32,
    ret: bool,
) -> Result<OwnedFd, LinkError> {
    let cpath = c_path(path)?;
    // SAFETY: plain old data, zero is the default.
    let mut attr: bpf_attr = unsafe { zeroed() };
    // SAFETY: writing the link-create member of a zeroed union.
    let l = unsafe { &mut attr.link_create };
    l.__bindgen_anon_1.prog_fd = prog.as_raw_fd() as u32;
    l.attach_type = bpf_attach_type::BPF_TRACE_UPROBE_MULTI as u32;
    // SAFETY: as above, the uprobe_multi member of the zeroed union.
    let u = unsafe { &mut l.__bindgen_anon_3.uprobe_multi };
    u.path = cpath.as_ptr() as u64;
    u.offsets = offsets.as_ptr() as u64;
    u.cookies = cookies.as_ptr() as u64;
    u.cnt = offsets.len() as u32;
    u.flags = if ret { BPF_F_UPROBE_MULTI_RETURN } else { 0 };
    u.pid = pid;
    sys_bpf(bpf_cmd::BPF_LINK_CREATE, &mut attr).map_err(|source| LinkError::MultiLink {
        program,
        path: path.display().to_string(),
        source,
    })
}
