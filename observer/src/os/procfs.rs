//! What `/proc` tells about a process: whether it is alive (and still the
//! same process) and which MPI library it has mapped. Which rank of which
//! job it is, built on these readers, is [`crate::attach::identity`]'s.

use std::{
    fs, io,
    path::{Path, PathBuf},
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use thiserror::Error;

/// Errors reading a process's `/proc` entries.
#[derive(Debug, Error)]
pub enum ProcError {
    /// The process does not exist (or exited).
    #[error(
        "no process with pid {pid}: check the pid (ps -p {pid}) and that the job is still running"
    )]
    NoSuchProcess {
        /// The pid asked for.
        pid: u32,
    },
    /// `/proc/PID/...` could not be read, typically for lack of privilege.
    #[error(
        "cannot read /proc/{pid}/{file}: {source}; run as root or with CAP_SYS_PTRACE and CAP_DAC_READ_SEARCH"
    )]
    Unreadable {
        /// The pid.
        pid: u32,
        /// The file under /proc/PID.
        file: &'static str,
        /// The I/O error.
        source: io::Error,
    },
}

/// Errors telling this process's own pid namespace.
#[derive(Debug, Error)]
pub enum NamespaceError {
    /// `/proc/self` or this process's `ns/pid` could not be read.
    #[error("cannot read {path}: {source}; the daemon needs a /proc of its own pid namespace")]
    Unreadable {
        /// The path.
        path: String,
        /// The I/O error.
        source: io::Error,
    },
    /// `/proc` is not the procfs of this process's pid namespace, so its
    /// pids are not the ones this process's system calls and probes use.
    #[error(
        "/proc is not this pid namespace's (/proc/self is {seen:?}, this process is pid {own}); mount a proc of the daemon's own pid namespace (unshare --pid --fork --mount-proc, or a container with its own /proc)"
    )]
    ForeignProc {
        /// What `/proc/self` points at.
        seen: String,
        /// This process's pid, as getpid tells.
        own: u32,
    },
}

/// The inode of the initial pid namespace (PROC_PID_INIT_INO): a daemon in
/// it names processes as the kernel's `bpf_get_current_pid_tgid` does.
pub const INITIAL_PID_NAMESPACE: u64 = 0xEFFF_FFFC;

/// A pid namespace as `bpf_get_ns_current_pid_tgid` names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PidNamespace {
    /// The nsfs device, in the kernel's encoding (MKDEV: major << 20 |
    /// minor), which the helper compares with, not stat's.
    pub dev: u64,
    /// The namespace's inode.
    pub ino: u64,
}

/// This process's pid namespace, or `None` for the initial one (or a
/// kernel without pid namespaces). Fails if `/proc` is another
/// namespace's: every pid the daemon reads there would then name another
/// process than the probes' and the kernel's.
pub fn own_pid_namespace() -> Result<Option<PidNamespace>, NamespaceError> {
    use std::os::unix::fs::MetadataExt as _;
    // SAFETY: getpid has no preconditions.
    let own = unsafe { libc::getpid() } as u32;
    let unreadable = |path: String, source: io::Error| NamespaceError::Unreadable { path, source };
    // /proc/self is the procfs's own link to its reader: it names this
    // process only in a proc of this process's namespace.
    let seen = fs::read_link("/proc/self").map_err(|e| unreadable("/proc/self".into(), e))?;
    if seen.as_os_str().to_str() != Some(own.to_string().as_str()) {
        return Err(NamespaceError::ForeignProc {
            seen: seen.display().to_string(),
            own,
        });
    }
    let path = format!("/proc/{own}/ns/pid");
    let m = match fs::metadata(&path) {
        Ok(m) => m,
        // No CONFIG_PID_NS: the initial namespace is the only one.
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(unreadable(path, e)),
    };
    if m.ino() == INITIAL_PID_NAMESPACE {
        return Ok(None);
    }
    let (major, minor) = (libc::major(m.dev()), libc::minor(m.dev()));
    Ok(Some(PidNamespace {
        dev: (u64::from(major) << 20) | u64::from(minor),
        ino: m.ino(),
    }))
}

/// The inode of a process's pid namespace (`/proc/PID/ns/pid`).
pub fn pid_namespace_ino(pid: u32) -> Result<u64, ProcError> {
    use std::os::unix::fs::MetadataExt as _;
    fs::metadata(format!("/proc/{pid}/ns/pid"))
        .map(|m| m.ino())
        .map_err(|source| {
            if source.kind() == io::ErrorKind::NotFound {
                ProcError::NoSuchProcess { pid }
            } else {
                ProcError::Unreadable {
                    pid,
                    file: "ns/pid",
                    source,
                }
            }
        })
}

fn read(pid: u32, file: &'static str) -> Result<Vec<u8>, ProcError> {
    fs::read(format!("/proc/{pid}/{file}")).map_err(|source| {
        if source.kind() == io::ErrorKind::NotFound || source.raw_os_error() == Some(libc::ESRCH) {
            ProcError::NoSuchProcess { pid }
        } else {
            ProcError::Unreadable { pid, file, source }
        }
    })
}

/// Reads at most `cap` bytes of `/proc/PID/file`, and whether there was
/// more: a process controls some of these files (its environment, its
/// command line), so what one costs to read must not depend on it.
pub fn read_capped(pid: u32, file: &'static str, cap: usize) -> Result<(Vec<u8>, bool), ProcError> {
    use std::io::Read as _;
    let err = |source: io::Error| {
        if source.kind() == io::ErrorKind::NotFound || source.raw_os_error() == Some(libc::ESRCH) {
            ProcError::NoSuchProcess { pid }
        } else {
            ProcError::Unreadable { pid, file, source }
        }
    };
    let f = fs::File::open(format!("/proc/{pid}/{file}")).map_err(err)?;
    let mut buf = Vec::new();
    f.take(cap as u64 + 1).read_to_end(&mut buf).map_err(err)?;
    let more = buf.len() > cap;
    buf.truncate(cap);
    Ok((buf, more))
}

/// The fields of `/proc/PID/stat` the observer uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stat {
    /// State: `R`, `S`, `D`, `Z` (zombie), `X` (dead), ...
    pub state: char,
    /// Parent pid.
    pub ppid: u32,
    /// Start time in clock ticks since boot: with the pid, it identifies a
    /// process across pid reuse.
    pub start_ticks: u64,
}

impl Stat {
    /// Parses the contents of `/proc/PID/stat`.
    pub fn parse(text: &str) -> Option<Stat> {
        // comm may contain spaces and parentheses: fields start after the
        // last ')', with the state, field 3.
        let mut fields = text.rsplit_once(')')?.1.split_whitespace();
        let state = fields.next()?.chars().next()?;
        let ppid = fields.next()?.parse().ok()?;
        // Field 22, 18 fields after the parent (field 4).
        let start_ticks = fields.nth(17)?.parse().ok()?;
        Some(Stat {
            state,
            ppid,
            start_ticks,
        })
    }

    /// A zombie waiting to be reaped, or dead.
    pub fn is_dead(&self) -> bool {
        matches!(self.state, 'Z' | 'X')
    }
}

/// Reads `/proc/PID/stat`.
pub fn stat(pid: u32) -> Result<Stat, ProcError> {
    let text = read(pid, "stat")?;
    Stat::parse(&String::from_utf8_lossy(&text)).ok_or(ProcError::NoSuchProcess { pid })
}

/// `/proc/PID/stat` read once (1 KiB at most: the kernel's line is a few
/// hundred bytes), with the command name it carries in its field 2, the
/// same text as `/proc/PID/comm` (the kernel caps it at 16 bytes). For the
/// `--all` scan, which looks at every process each second: one open and
/// one read where [`stat`] and [`comm`] take two of each and a size hint.
pub fn stat_and_comm(pid: u32) -> Result<(Stat, String), ProcError> {
    let (text, _) = read_capped(pid, "stat", 1024)?;
    let text = String::from_utf8_lossy(&text);
    let stat = Stat::parse(&text).ok_or(ProcError::NoSuchProcess { pid })?;
    let comm = text
        .split_once('(')
        .and_then(|(_, rest)| rest.rsplit_once(')'))
        .map(|(c, _)| c.to_string())
        .unwrap_or_default();
    Ok((stat, comm))
}

/// The process's start time in clock ticks since boot (see [`Stat`]).
pub fn start_ticks(pid: u32) -> Result<u64, ProcError> {
    stat(pid).map(|s| s.start_ticks)
}

/// The wall-clock time of a start time in ticks since boot.
pub fn ticks_to_time(ticks: u64) -> SystemTime {
    let btime = fs::read_to_string("/proc/stat")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("btime ")?.trim().parse::<u64>().ok())
        })
        .unwrap_or(0);
    // SAFETY: sysconf has no memory-safety preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    UNIX_EPOCH
        + Duration::from_secs(btime)
        + Duration::from_nanos(ticks.saturating_mul(1_000_000_000) / hz)
}

/// The short command name.
pub fn comm(pid: u32) -> String {
    fs::read_to_string(format!("/proc/{pid}/comm"))
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

/// Whether the process `pid` that started at `ticks` is still running (and
/// is not a zombie waiting to be reaped).
pub fn alive(pid: u32, ticks: u64) -> bool {
    stat(pid).is_ok_and(|s| s.start_ticks == ticks && !s.is_dead())
}

/// What `/proc` says of a process known by its pid and start time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Liveness {
    /// Running (or stopped, sleeping...): the same process.
    Alive,
    /// Gone: no such pid, a zombie, or another process now has the pid.
    Exited,
    /// `/proc` could not be read (out of descriptors, memory...): nothing
    /// is known, and a live rank must never be taken for an exited one.
    Unknown,
}

/// Whether the process `pid` that started at `ticks` still runs, with the
/// difference between "gone" and "cannot tell" kept (see [`Liveness`]).
pub fn liveness(pid: u32, ticks: u64) -> Liveness {
    Liveness::of(&stat(pid), ticks)
}

impl Liveness {
    /// What a read of `/proc/PID/stat` says of the process that started at
    /// `ticks`: gone (no such pid, a zombie, dead, the pid reused), alive,
    /// or unknown (the read itself failed).
    pub fn of(stat: &Result<Stat, ProcError>, ticks: u64) -> Liveness {
        match stat {
            Ok(s) if s.start_ticks != ticks || s.is_dead() => Liveness::Exited,
            Ok(_) => Liveness::Alive,
            Err(ProcError::NoSuchProcess { .. }) => Liveness::Exited,
            Err(ProcError::Unreadable { .. }) => Liveness::Unknown,
        }
    }
}

/// The real uid of process `pid`, from `/proc/PID/status` (the kernel's,
/// not the process's word).
pub fn uid(pid: u32) -> Result<u32, ProcError> {
    let text = read(pid, "status")?;
    String::from_utf8_lossy(&text)
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .ok_or(ProcError::NoSuchProcess { pid })
}

/// The four uids of process `pid` (real, effective, saved, filesystem),
/// from `/proc/PID/status`'s `Uid:` line.
pub fn uids(pid: u32) -> Result<[u32; 4], ProcError> {
    let text = read(pid, "status")?;
    parse_uids(&String::from_utf8_lossy(&text)).ok_or(ProcError::NoSuchProcess { pid })
}

/// The `Uid:` line's four fields; `None` unless there are exactly four.
pub fn parse_uids(status: &str) -> Option<[u32; 4]> {
    let line = status.lines().find_map(|l| l.strip_prefix("Uid:"))?;
    let mut f = line.split_whitespace().map(str::parse::<u32>);
    let uids = [
        f.next()?.ok()?,
        f.next()?.ok()?,
        f.next()?.ok()?,
        f.next()?.ok()?,
    ];
    f.next().is_none().then_some(uids)
}

/// The thread ids of process `pid`.
pub fn threads(pid: u32) -> Result<Vec<u32>, ProcError> {
    let dir = Path::new("/proc").join(pid.to_string()).join("task");
    let rd = std::fs::read_dir(&dir).map_err(|source| ProcError::Unreadable {
        pid,
        file: "task",
        source,
    })?;
    Ok(rd
        .filter_map(Result::ok)
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .collect())
}

/// The network namespace of a process (`net:[inode]`), if readable.
pub fn net_namespace(pid: u32) -> Option<PathBuf> {
    fs::read_link(format!("/proc/{pid}/ns/net")).ok()
}

/// Every pid currently in `/proc`.
pub fn all_pids() -> Vec<u32> {
    let Ok(dir) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect()
}

/// An MPI library mapped into a process.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MappedLib {
    /// Path as the process sees it.
    pub path: PathBuf,
    /// Lowest address the library is mapped at (its load base).
    pub base: u64,
    /// File offset of that lowest mapping.
    pub base_offset: u64,
    /// The file's device (major, minor) and inode, as the maps name them:
    /// the identity of the library file, whichever path reaches it.
    pub file: (u32, u32, u64),
    /// The file's executable mapping (start, end, file offset of start),
    /// the lowest if there are several: where its functions run.
    pub text: Option<(u64, u64, u64)>,
}

impl MappedLib {
    /// Whether the library's code is mapped: the dynamic loader maps the
    /// whole file read-only first and its executable segment over it
    /// after, so a process caught in between (a rank found at its exec)
    /// has the library without its code. It is looked at again, not
    /// attached: probes told by address need where the code runs.
    pub fn loaded(&self) -> bool {
        self.text.is_some()
    }

    /// The library as seen from our mount namespace, through the process's
    /// root, so containers and chroots work.
    pub fn host_path(&self, pid: u32) -> PathBuf {
        let p = Path::new("/proc").join(pid.to_string()).join("root");
        p.join(self.path.strip_prefix("/").unwrap_or(&self.path))
    }
}

/// Whether a file name is an MPI library we probe: `libmpi.so*` (Open MPI,
/// MPICH, Intel MPI), `libmpich.so*` (the MPICH ABI's other name: Debian's
/// MPICH, MVAPICH, Cray), or the MPI-5 standard ABI's `libmpi_abi.so*`.
pub fn is_mpi_library(file_name: &str) -> bool {
    ["libmpi.so", "libmpich.so", "libmpi_abi.so"]
        .iter()
        .any(|p| file_name.starts_with(p))
}

/// One line of `/proc/PID/maps`. The one parser of that file in the daemon:
/// fields are split by position, and the path is the rest of the line, so a
/// path with spaces is kept whole.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MapEntry {
    /// First address.
    pub start: u64,
    /// One past the last address.
    pub end: u64,
    /// Mapped readable.
    pub read: bool,
    /// Mapped writable.
    pub write: bool,
    /// Mapped executable.
    pub exec: bool,
    /// A shared (not private) mapping.
    pub shared: bool,
    /// File offset of `start`.
    pub offset: u64,
    /// The file's device, as `major:minor` in hex in the file.
    pub dev: (u32, u32),
    /// The file's inode; 0 for an anonymous mapping.
    pub inode: u64,
    /// The file's path as the process sees it (absolute), without the
    /// kernel's ` (deleted)` mark; `None` for anonymous and pseudo mappings
    /// (`[heap]`, `[stack]`, `[vdso]`...).
    pub path: Option<PathBuf>,
    /// The kernel marked the file deleted (unlinked since it was mapped).
    pub deleted: bool,
}

impl MapEntry {
    /// The file name of the mapped file, if any and if UTF-8.
    pub fn file_name(&self) -> Option<&str> {
        self.path.as_deref()?.file_name()?.to_str()
    }

    /// The file as seen from the daemon's mount namespace, through the
    /// process's root (containers, chroots).
    pub fn host_path(&self, pid: u32) -> Option<PathBuf> {
        let p = self.path.as_deref()?;
        Some(
            Path::new("/proc")
                .join(pid.to_string())
                .join("root")
                .join(p.strip_prefix("/").unwrap_or(p)),
        )
    }
}

/// Parses the text of `/proc/PID/maps`; lines that do not parse are
/// skipped. Never panics, whatever the bytes.
pub fn parse_maps(text: &[u8]) -> Vec<MapEntry> {
    text.split(|b| *b == b'\n')
        .filter_map(parse_maps_line)
        .collect()
}

fn parse_maps_line(line: &[u8]) -> Option<MapEntry> {
    use std::os::unix::ffi::OsStrExt as _;
    // address perms offset dev inode [spaces path]
    let mut rest = line;
    let mut field = || -> Option<&[u8]> {
        let start = rest.iter().position(|b| *b != b' ')?;
        let r = &rest[start..];
        let len = r.iter().position(|b| *b == b' ').unwrap_or(r.len());
        let (f, tail) = r.split_at(len);
        rest = tail;
        Some(f)
    };
    let hex = |b: &[u8]| u64::from_str_radix(std::str::from_utf8(b).ok()?, 16).ok();
    let range = field()?;
    let perms = field()?;
    let offset = hex(field()?)?;
    let dev = field()?;
    let inode = std::str::from_utf8(field()?).ok()?.parse::<u64>().ok()?;
    let dash = range.iter().position(|b| *b == b'-')?;
    let (start, end) = (hex(&range[..dash])?, hex(&range[dash + 1..])?);
    let colon = dev.iter().position(|b| *b == b':')?;
    let dev = (
        u32::try_from(hex(&dev[..colon])?).ok()?,
        u32::try_from(hex(&dev[colon + 1..])?).ok()?,
    );
    if perms.len() < 4 || start > end {
        return None;
    }
    // The path: everything after the padding that follows the inode.
    let p = match rest.iter().position(|b| *b != b' ') {
        Some(i) => &rest[i..],
        None => &rest[rest.len()..],
    };
    const DELETED: &[u8] = b" (deleted)";
    let (p, deleted) = match p.strip_suffix(DELETED) {
        Some(p) => (p, true),
        None => (p, false),
    };
    let path = (p.first() == Some(&b'/')).then(|| PathBuf::from(std::ffi::OsStr::from_bytes(p)));
    Some(MapEntry {
        start,
        end,
        read: perms[0] == b'r',
        write: perms[1] == b'w',
        exec: perms[2] == b'x',
        shared: perms[3] == b's',
        offset,
        dev,
        inode,
        path,
        deleted,
    })
}

/// Reads and parses `/proc/PID/maps` (see [`parse_maps`]).
pub fn maps(pid: u32) -> Result<Vec<MapEntry>, ProcError> {
    read(pid, "maps").map(|t| parse_maps(&t))
}

/// The lowest mapping of the first file in `pid`'s maps that `wanted`
/// accepts (given the file's path): its load base and file offset.
fn lowest_mapping(
    pid: u32,
    wanted: impl Fn(&Path) -> bool,
) -> Result<Option<MappedLib>, ProcError> {
    Ok(lowest_of(maps(pid)?, wanted))
}

/// [`lowest_mapping`] of parsed maps.
fn lowest_of(maps: Vec<MapEntry>, wanted: impl Fn(&Path) -> bool) -> Option<MappedLib> {
    let mut found: Option<MappedLib> = None;
    for m in maps {
        let Some(path) = m.path.as_deref() else {
            continue;
        };
        if !wanted(path) || found.as_ref().is_some_and(|l| l.path != path) {
            continue;
        }
        let text = (m.exec).then_some((m.start, m.end, m.offset));
        match &mut found {
            Some(l) => {
                if m.start < l.base {
                    (l.base, l.base_offset) = (m.start, m.offset);
                }
                if text.is_some_and(|t| l.text.is_none_or(|lt| t.0 < lt.0)) {
                    l.text = text;
                }
            }
            None => {
                found = Some(MappedLib {
                    path: path.to_path_buf(),
                    base: m.start,
                    base_offset: m.offset,
                    file: (m.dev.0, m.dev.1, m.inode),
                    text,
                });
            }
        }
    }
    found
}

/// The MPI library mapped by `pid`, if any.
pub fn mpi_library(pid: u32) -> Result<Option<MappedLib>, ProcError> {
    lowest_mapping(pid, |p| {
        p.file_name()
            .and_then(|s| s.to_str())
            .is_some_and(is_mpi_library)
    })
}

/// Whether `pid` runs a statically linked executable: its program has no
/// `PT_INTERP` (no dynamic loader). Unreadable counts as not static. Only
/// the file's first 64 KiB are read (the ELF header and program headers
/// sit there), from the kernel's link to the executable, never blocking:
/// the file is the user's.
pub fn is_static(pid: u32) -> bool {
    use std::{io::Read as _, os::unix::fs::OpenOptionsExt as _};

    use object::read::elf::{FileHeader as _, ProgramHeader as _};
    let Ok(f) = fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY | libc::O_CLOEXEC)
        .open(format!("/proc/{pid}/exe"))
    else {
        return false;
    };
    if !f.metadata().is_ok_and(|m| m.file_type().is_file()) {
        return false;
    }
    let mut data = Vec::new();
    if f.take(64 << 10).read_to_end(&mut data).is_err() {
        return false;
    }
    let Ok(h) = object::elf::FileHeader64::<object::Endianness>::parse(&*data) else {
        return false;
    };
    let Ok(e) = h.endian() else { return false };
    h.program_headers(e, &*data)
        .is_ok_and(|phs| !phs.iter().any(|p| p.p_type(e) == object::elf::PT_INTERP))
}

/// The lowest mapping of the file at `path` in `pid`'s address space.
pub fn mapping_of(pid: u32, path: &Path) -> Option<MappedLib> {
    lowest_mapping(pid, |p| p == path).ok().flatten()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_pid_namespace_is_none_exactly_in_the_initial_one() {
        let link = fs::read_link("/proc/self/ns/pid").unwrap();
        let initial = link.to_str() == Some(&format!("pid:[{INITIAL_PID_NAMESPACE}]"));
        let ns = own_pid_namespace().unwrap();
        assert_eq!(ns.is_none(), initial, "{link:?}: {ns:?}");
        if let Some(ns) = ns {
            assert_eq!(link.to_str(), Some(format!("pid:[{}]", ns.ino).as_str()));
        }
        assert_eq!(
            pid_namespace_ino(std::process::id()).unwrap(),
            ns.map_or(INITIAL_PID_NAMESPACE, |n| n.ino)
        );
    }

    #[test]
    fn stat_and_comm_agree_with_stat_and_comm_for_a_name_with_parentheses() {
        // A program's name is its executable's: a link named as a hostile
        // user would name it, ") S 1 (" and spaces included.
        let dir = std::env::temp_dir().join(format!("procfs-comm-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        let exe = dir.join("a) S 1 (b");
        std::os::unix::fs::symlink("/bin/sleep", &exe).unwrap();
        let mut child = std::process::Command::new(&exe).arg("5").spawn().unwrap();
        let pid = child.id();
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        // The name changes at the child's exec.
        while comm(pid) != "a) S 1 (b" && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        let (st, name) = stat_and_comm(pid).unwrap();
        let _ = child.kill();
        let _ = child.wait();
        let _ = fs::remove_dir_all(&dir);
        assert_eq!(name, "a) S 1 (b");
        assert_eq!(st.ppid, std::process::id());
        assert_eq!(st.start_ticks, start_ticks(pid).unwrap_or(st.start_ticks));
        let me = std::process::id();
        assert_eq!(stat_and_comm(me).unwrap().1, comm(me));
        assert_eq!(stat_and_comm(me).unwrap().0, stat(me).unwrap());
    }

    #[test]
    fn own_process_is_alive_and_not_mpi() {
        let pid = std::process::id();
        let t = start_ticks(pid).unwrap();
        assert!(alive(pid, t));
        assert!(!alive(pid, t + 1));
        assert_eq!(liveness(pid, t), Liveness::Alive);
        assert_eq!(liveness(pid, t + 1), Liveness::Exited);
        assert_eq!(liveness(u32::MAX - 1, t), Liveness::Exited);
        // SAFETY: getuid has no preconditions.
        assert_eq!(uid(pid).unwrap(), unsafe { libc::getuid() });
        assert_eq!(mpi_library(pid).unwrap(), None);
        assert!(matches!(
            start_ticks(u32::MAX - 1),
            Err(ProcError::NoSuchProcess { .. })
        ));
    }

    #[test]
    fn stat_fields_after_a_hostile_comm() {
        let line = "42 (a) b (c) S 7 42 42 0 -1 4194560 1 0 0 0 0 0 0 0 20 0 1 0 123456 1 1";
        assert_eq!(
            Stat::parse(line),
            Some(Stat {
                state: 'S',
                ppid: 7,
                start_ticks: 123456,
            })
        );
        assert_eq!(Stat::parse("42 (x"), None);
        let own = stat(std::process::id()).unwrap();
        assert_eq!(own.ppid, std::os::unix::process::parent_id());
        assert!(!own.is_dead());
    }

    #[test]
    fn the_four_uids_are_read_whole_or_not_at_all() {
        let status = "Name:\tsu\nUmask:\t0022\nUid:\t1000\t0\t0\t0\nGid:\t1000\t1000\t1000\t1000\n";
        assert_eq!(parse_uids(status), Some([1000, 0, 0, 0]));
        assert_eq!(parse_uids("Uid:\t1000\t1000\t1000\n"), None);
        assert_eq!(parse_uids("Uid:\t1\t2\t3\t4\t5\n"), None);
        assert_eq!(parse_uids("Uid:\t1\t2\t3\tx\n"), None);
        assert_eq!(parse_uids("Gid:\t1\t2\t3\t4\n"), None);
        // SAFETY: getuid and geteuid cannot fail.
        let (r, e) = unsafe { (libc::getuid(), libc::geteuid()) };
        let own = uids(std::process::id()).unwrap();
        assert_eq!((own[0], own[1]), (r, e));
    }

    #[test]
    fn a_library_is_loaded_once_its_code_is_mapped() {
        let mpi = |p: &Path| p.file_name().and_then(|f| f.to_str()) == Some("libmpi.so.40");
        // What the dynamic loader has done first: the whole file mapped
        // read-only, its code not yet over it.
        let reserved = b"\
7f0000000000-7f0000100000 r--p 00000000 fe:01 99                 /usr/lib/libmpi.so.40
";
        let l = lowest_of(parse_maps(reserved), mpi).unwrap();
        assert_eq!(
            (l.base, l.text, l.loaded()),
            (0x7f00_0000_0000, None, false)
        );
        let mapped = b"\
7f0000000000-7f0000020000 r--p 00000000 fe:01 99                 /usr/lib/libmpi.so.40
7f0000020000-7f00000a0000 r-xp 00020000 fe:01 99                 /usr/lib/libmpi.so.40
7f00000a0000-7f0000100000 r--p 000a0000 fe:01 99                 /usr/lib/libmpi.so.40
";
        let l = lowest_of(parse_maps(mapped), mpi).unwrap();
        assert!(l.loaded());
        assert_eq!(
            (l.base, l.text),
            (
                0x7f00_0000_0000,
                Some((0x7f00_0002_0000, 0x7f00_000a_0000, 0x2_0000))
            )
        );
    }

    #[test]
    fn maps_lines_keep_paths_whole() {
        let text = b"\
5581a000-5581b000 r--p 00000000 fe:01 1234                       /opt/app/bin/halo
7f00a000-7f00b000 r-xp 00002000 fe:01 99                         /home/u/my libs/libmpi.so.40
7f00c000-7f00d000 rw-s 00000000 00:1a 77                         /dev/shm/mpi-observer.9 (deleted)
7ffd0000-7ffd1000 rw-p 00000000 00:00 0                          [stack]
7ffd2000-7ffd3000 r-xp 00000000 00:00 0
garbage line
ffffffffff600000-ffffffffff601000 --xp 00000000 00:00 0                  [vsyscall]
";
        let m = parse_maps(text);
        assert_eq!(m.len(), 6, "{m:?}");
        assert_eq!(m[0].path.as_deref(), Some(Path::new("/opt/app/bin/halo")));
        assert_eq!(
            (m[0].dev, m[0].inode, m[0].read, m[0].exec),
            ((0xfe, 1), 1234, true, false)
        );
        assert_eq!(
            m[1].path.as_deref(),
            Some(Path::new("/home/u/my libs/libmpi.so.40"))
        );
        assert_eq!((m[1].offset, m[1].exec), (0x2000, true));
        assert_eq!(m[1].file_name(), Some("libmpi.so.40"));
        assert_eq!(
            m[2].path.as_deref(),
            Some(Path::new("/dev/shm/mpi-observer.9"))
        );
        assert!(m[2].deleted && m[2].shared && m[2].write);
        assert_eq!((m[3].path.as_ref(), m[4].path.as_ref()), (None, None));
        assert_eq!(m[5].start, 0xffffffffff600000);
        assert!(parse_maps(b"").is_empty());
        assert!(
            parse_maps(b"1-0 r--p 0 0:0 0 /x").is_empty(),
            "start after end"
        );
    }

    #[test]
    fn own_maps_name_the_test_binary() {
        let exe = std::fs::read_link("/proc/self/exe").unwrap();
        let m = maps(std::process::id()).unwrap();
        assert!(
            m.iter().any(|e| e.exec && e.path.as_deref() == Some(&*exe)),
            "{m:?}"
        );
    }

    #[test]
    fn library_names() {
        assert!(is_mpi_library("libmpi.so.40.30.4"));
        assert!(is_mpi_library("libmpich.so.12"));
        assert!(is_mpi_library("libmpi_abi.so.1"));
        assert!(is_mpi_library("libmpi_abi.so.1.0"));
        assert!(!is_mpi_library("libmpi_mpifh.so.40"));
        assert!(!is_mpi_library("libmpi_cxx.so.40"));
        assert!(!is_mpi_library("libmpifort_abi.so.1"));
    }
}
