//! How probes get into processes: the kernel's two ways of attaching a BPF
//! program to a user-space function, behind one trait ([`Mechanism`]), and
//! the loader both share ([`load_programs`]).
//!
//! - [`multi::UprobeMulti`]: `uprobe_multi` links (Linux 6.6+, with a PID
//!   filter that covers every thread from 6.10 or a backport): every site
//!   of a program in one link and one system call, detached with one RCU
//!   grace period.
//! - [`perf::PerfUprobes`]: classic uprobes, one perf event of the uprobe
//!   PMU per site, each with the program attached by a BPF link that carries
//!   the site's cookie (Linux 5.15+) or by `PERF_EVENT_IOC_SET_BPF` (older,
//!   no cookie: the programs then tell functions by address). Scoped to one
//!   process, or to every process that maps the file.
//!
//! `crate::attach::kernel` probes which the kernel has and picks one.
//!
//! Why not aya's per-probe perf events: aya 0.14 creates our maps but
//! cannot load a program for the uprobe_multi attach type, nor give a perf
//! link a cookie; so this module relocates the object with aya-obj and
//! loads and attaches itself.

pub mod multi;
pub mod perf;

use std::{
    collections::{HashMap, HashSet},
    ffi::CString,
    io,
    mem::zeroed,
    os::fd::{FromRawFd as _, OwnedFd, RawFd},
    path::Path,
};

use aya::Ebpf;
use aya_obj::generated::{bpf_attr, bpf_cmd, bpf_insn, bpf_prog_type};
use thiserror::Error;

use crate::os::sys::{self, map_fd};

/// Errors of loading programs and attaching them.
#[derive(Debug, Error)]
pub enum LinkError {
    /// The object could not be parsed or relocated.
    #[error("cannot prepare the eBPF object: {source}")]
    Object {
        /// aya-obj's error.
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// A program the daemon needs is not in the object.
    #[error("program {program} is missing from the eBPF object")]
    MissingProgram {
        /// Its name.
        program: &'static str,
    },
    /// The kernel rejected a program.
    #[error(
        "the kernel rejected program {program}: {source}{}",
        verifier_tail(log)
    )]
    Load {
        /// Program name.
        program: String,
        /// The OS error.
        source: io::Error,
        /// The verifier log.
        log: String,
    },
    /// A path with a NUL byte.
    #[error("cannot probe {path}: the path holds a NUL byte")]
    Path {
        /// The path.
        path: String,
    },
    /// The kernel refused a uprobe_multi link.
    #[error("cannot create a uprobe_multi link for {program} on {path}: {source}")]
    MultiLink {
        /// Program name.
        program: &'static str,
        /// Target path.
        path: String,
        /// The OS error.
        source: io::Error,
    },
    /// The kernel refused a uprobe perf event.
    #[error("cannot open a uprobe at offset {offset:#x} of {path}: {source}")]
    PerfEvent {
        /// Target path.
        path: String,
        /// The site's file offset.
        offset: u64,
        /// The OS error.
        source: io::Error,
    },
    /// The kernel refused to attach a program to a uprobe perf event.
    #[error("cannot attach {program} to the uprobe at offset {offset:#x} of {path}: {source}")]
    PerfAttach {
        /// Program name.
        program: &'static str,
        /// Target path.
        path: String,
        /// The site's file offset.
        offset: u64,
        /// The OS error.
        source: io::Error,
    },
}

/// The verifier log's last non-empty line, as ` (verifier: ...)`.
fn verifier_tail(log: &str) -> String {
    match log.lines().rev().find(|l| !l.trim().is_empty()) {
        Some(l) => format!(" (verifier: {l})"),
        None => String::new(),
    }
}

/// Whom a set of probes fires for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target {
    /// One process (every thread of it).
    Process(u32),
    /// Every process that maps the file, now or later; the programs filter
    /// by their maps (`MPI_PROCS`).
    File,
}

/// One way of attaching programs to sites of a file.
pub trait Mechanism: Send + Sync {
    /// Its name in lines and labels: `uprobe_multi`, `perf_link` or
    /// `perf_ioctl`.
    fn name(&self) -> &'static str;
    /// A copy of it, boxed.
    fn clone_box(&self) -> Box<dyn Mechanism>;
    /// The `expected_attach_type` programs must be loaded with for it.
    fn attach_type(&self) -> u32;
    /// Attaches `prog` (named `program`) at every file offset in `offsets`
    /// of the file at `path`, for `target`, each site with its cookie;
    /// `ret` makes them return probes. Dropping every returned fd detaches
    /// them; on error, nothing stays attached.
    #[expect(clippy::too_many_arguments, reason = "one attach request, spelt out")]
    fn attach(
        &self,
        program: &'static str,
        prog: &OwnedFd,
        path: &Path,
        offsets: &[u64],
        cookies: &[u64],
        target: Target,
        ret: bool,
    ) -> Result<Vec<OwnedFd>, LinkError>;
    /// Whether its fds can be pinned in bpffs, so a planned restart can
    /// hand them over (perf events attached by ioctl cannot).
    fn pinnable(&self) -> bool;
    /// Whether the sites carry cookies; without, the programs are loaded
    /// with `FUNC_BY_ADDRESS`.
    fn cookies(&self) -> bool;
    /// Whether `attach --all` should probe each library file once for
    /// every process that maps it ([`Target::File`]) rather than each
    /// process on its own: true where attaching and detaching cost per
    /// site (classic uprobes).
    fn per_file(&self) -> bool;
}

pub(crate) fn sys_bpf(cmd: bpf_cmd, attr: &mut bpf_attr) -> io::Result<OwnedFd> {
    let fd = sys::bpf(cmd, attr)?;
    // SAFETY: a non-negative return of these commands is a new fd we own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

fn object_error(e: impl std::error::Error + Send + Sync + 'static) -> LinkError {
    LinkError::Object {
        source: Box::new(e),
    }
}

/// Relocates the object against the maps `ebpf` created and loads the
/// named programs for `attach_type` ([`Mechanism::attach_type`]).
pub fn load_programs(
    object: &[u8],
    ebpf: &Ebpf,
    names: &[&'static str],
    attach_type: u32,
) -> Result<HashMap<&'static str, OwnedFd>, LinkError> {
    let mut obj = aya_obj::Object::parse(object).map_err(object_error)?;
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
    .map_err(object_error)?;
    obj.relocate_calls(&text_sections).map_err(object_error)?;
    let mut out = HashMap::new();
    for &name in names {
        let prog = obj
            .programs
            .get(name)
            .ok_or(LinkError::MissingProgram { program: name })?;
        let insns: &[bpf_insn] = &obj.functions[&prog.function_key()].instructions;
        out.insert(name, load_insns(name, insns, attach_type)?);
    }
    Ok(out)
}

/// Loads `insns` as a kprobe-type program (what uprobes run) named `name`
/// for `attach_type`; with the verifier's log in the error if it fails.
pub fn load_insns(name: &str, insns: &[bpf_insn], attach_type: u32) -> Result<OwnedFd, LinkError> {
    let license = CString::new("Dual MIT/GPL").expect("no NUL");
    let attempt = |log: &mut Vec<u8>| {
        // SAFETY: bpf_attr is plain old data; all-zero is its default.
        let mut attr: bpf_attr = unsafe { zeroed() };
        // SAFETY: writing the prog-load member of a zeroed union.
        let p = unsafe { &mut attr.__bindgen_anon_3 };
        p.prog_type = bpf_prog_type::BPF_PROG_TYPE_KPROBE as u32;
        p.expected_attach_type = attach_type;
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
            Err(LinkError::Load {
                program: name.to_string(),
                source: err,
                log: String::from_utf8_lossy(&log[..end]).into_owned(),
            })
        }
    }
}

/// `path` as a C string for the kernel.
fn c_path(path: &Path) -> Result<CString, LinkError> {
    CString::new(path.as_os_str().as_encoded_bytes()).map_err(|_| LinkError::Path {
        path: path.display().to_string(),
    })
}
