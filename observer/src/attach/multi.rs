//! Loading our programs as `uprobe_multi` (kernel 6.6+) and attaching them
//! with one BPF link per program per process.
//!
//! Why not aya's per-probe perf events: each perf-event uprobe is detached
//! with its own RCU grace period, which measured about 110 ms here, so a
//! rank with 350 probes took 40 s to detach and a daemon on SIGTERM could
//! hang for minutes. A uprobe_multi link attaches every site in one system
//! call and detaches them all with one grace period. aya 0.14 creates our
//! maps; it cannot load a program for the uprobe_multi attach type, so this
//! module relocates the object with aya-obj and loads it itself.

use std::{
    collections::{HashMap, HashSet},
    ffi::CString,
    io,
    mem::zeroed,
    os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd, RawFd},
    path::Path,
};

use aya::Ebpf;
use aya_obj::generated::{
    BPF_F_UPROBE_MULTI_RETURN, bpf_attach_type, bpf_attr, bpf_cmd, bpf_insn, bpf_prog_type,
};
use thiserror::Error;

use crate::os::sys::{self, map_fd};

/// Errors of the raw loader.
#[derive(Debug, Error)]
pub enum MultiError {
    /// The object could not be parsed or relocated.
    #[error("cannot prepare the eBPF object: {reason}")]
    Object {
        /// What went wrong.
        reason: String,
    },
    /// The kernel rejected a program.
    #[error("the kernel rejected program {program}: {source}{}", if log.is_empty() { String::new() } else { format!(" (verifier: {})", log.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or("")) })]
    Load {
        /// Program name.
        program: String,
        /// The OS error.
        source: io::Error,
        /// The verifier log.
        log: String,
    },
    /// The kernel refused a link.
    #[error("cannot create a uprobe_multi link for {program} on {path}: {source}")]
    Link {
        /// Program name.
        program: &'static str,
        /// Target path.
        path: String,
        /// The OS error.
        source: io::Error,
    },
}

fn sys_bpf(cmd: bpf_cmd, attr: &mut bpf_attr) -> io::Result<OwnedFd> {
    let fd = sys::bpf(cmd, attr)?;
    // SAFETY: a non-negative return of these commands is a new fd we own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// Relocates the object against the maps `ebpf` created and loads the
/// named programs for the uprobe_multi attach type.
pub fn load_programs(
    object: &[u8],
    ebpf: &Ebpf,
    names: &[&'static str],
) -> Result<HashMap<&'static str, OwnedFd>, MultiError> {
    let mut obj = aya_obj::Object::parse(object).map_err(|e| MultiError::Object {
        reason: e.to_string(),
    })?;
    let text_sections: HashSet<usize> = obj.functions.keys().map(|(s, _)| *s).collect();
    let defs = obj.maps.clone();
    let fds: Vec<(String, RawFd)> = ebpf
        .maps()
        .filter_map(|(name, m)| Some((name.to_string(), map_fd(m)?)))
        .collect();
    obj.relocate_maps(
        fds.iter()
            .filter_map(|(n, fd)| Some((n.as_str(), *fd, defs.get(n)?))),
        &text_sections,
    )
    .map_err(|e| MultiError::Object {
        reason: e.to_string(),
    })?;
    obj.relocate_calls(&text_sections)
        .map_err(|e| MultiError::Object {
            reason: e.to_string(),
        })?;
    let license = CString::new("Dual MIT/GPL").expect("no NUL");
    let mut out = HashMap::new();
    for &name in names {
        let prog = obj.programs.get(name).ok_or_else(|| MultiError::Object {
            reason: format!("program {name} missing from the object"),
        })?;
        let insns: &[bpf_insn] = &obj.functions[&prog.function_key()].instructions;
        out.insert(name, load_one(name, insns, &license)?);
    }
    Ok(out)
}

fn load_one(name: &str, insns: &[bpf_insn], license: &CString) -> Result<OwnedFd, MultiError> {
    let attempt = |log: &mut Vec<u8>| {
        // SAFETY: bpf_attr is plain old data; all-zero is its default.
        let mut attr: bpf_attr = unsafe { zeroed() };
        // SAFETY: writing the prog-load member of a zeroed union.
        let p = unsafe { &mut attr.__bindgen_anon_3 };
        p.prog_type = bpf_prog_type::BPF_PROG_TYPE_KPROBE as u32;
        p.expected_attach_type = bpf_attach_type::BPF_TRACE_UPROBE_MULTI as u32;
        p.insns = insns.as_ptr() as u64;
        p.insn_cnt = insns.len() as u32;
        p.license = license.as_ptr() as u64;
        for (d, s) in p.prog_name.iter_mut().zip(name.bytes().take(15)) {
            *d = s as libc::c_char;
        }
        if !log.is_empty() {
            p.log_level = 1;
            p.log_buf = log.as_mut_ptr() as u64;
            p.log_size = log.len() as u32;
        }
        sys_bpf(bpf_cmd::BPF_PROG_LOAD, &mut attr)
    };
    match attempt(&mut Vec::new()) {
        Ok(fd) => Ok(fd),
        Err(_) => {
            // Load again with a log, to say why.
            let mut log = vec![0u8; 1 << 20];
            let err = attempt(&mut log)
                .err()
                .unwrap_or_else(|| io::Error::other("flaky load"));
            let end = log.iter().position(|b| *b == 0).unwrap_or(log.len());
            Err(MultiError::Load {
                program: name.to_string(),
                source: err,
                log: String::from_utf8_lossy(&log[..end]).into_owned(),
            })
        }
    }
}

/// Attaches `prog` at every file offset in `offsets` of the file at `path`,
/// only for process `pid`, each site with its cookie. `ret` makes it a
/// uretprobe. Dropping the returned fd detaches all of them at once.
pub fn attach(
    prog_name: &'static str,
    prog: &OwnedFd,
    path: &Path,
    offsets: &[u64],
    cookies: &[u64],
    pid: u32,
    ret: bool,
) -> Result<OwnedFd, MultiError> {
    let cpath =
        CString::new(path.as_os_str().as_encoded_bytes()).map_err(|_| MultiError::Link {
            program: prog_name,
            path: path.display().to_string(),
            source: io::Error::from(io::ErrorKind::InvalidInput),
        })?;
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
    sys_bpf(bpf_cmd::BPF_LINK_CREATE, &mut attr).map_err(|source| MultiError::Link {
        program: prog_name,
        path: path.display().to_string(),
        source,
    })
}
