//! What `/proc` tells about a process: whether it is alive (and still the
//! same process) and which MPI library it has mapped. Which rank of which
//! job it is, built on these readers, is [`crate::identity`]'s.

use std::{
    fs,
    io::{self, BufRead as _},
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
}

impl MappedLib {
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

/// The lowest mapping of the first file in `pid`'s maps that `wanted`
/// accepts (given the file's path): its load base and file offset.
fn lowest_mapping(
    pid: u32,
    wanted: impl Fn(&Path) -> bool,
) -> Result<Option<MappedLib>, ProcError> {
    let maps = read(pid, "maps")?;
    let mut found: Option<MappedLib> = None;
    for line in maps.lines().map_while(Result::ok) {
        // address perms offset dev inode path
        let f: Vec<&str> = line.split_whitespace().collect();
        let [range, _perms, offset, _dev, _inode, path, ..] = f[..] else {
            continue;
        };
        let path = Path::new(path);
        if !wanted(path) || found.as_ref().is_some_and(|l| l.path != path) {
            continue;
        }
        let start = range
            .split('-')
            .next()
            .and_then(|s| u64::from_str_radix(s, 16).ok());
        let (Some(start), Ok(offset)) = (start, u64::from_str_radix(offset, 16)) else {
            continue;
        };
        if found.as_ref().is_none_or(|l| start < l.base) {
            found = Some(MappedLib {
                path: path.to_path_buf(),
                base: start,
                base_offset: offset,
            });
        }
    }
    Ok(found)
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
/// `PT_INTERP` (no dynamic loader). Unreadable counts as not static.
pub fn is_static(pid: u32) -> bool {
    use object::read::elf::{FileHeader as _, ProgramHeader as _};
    let Ok(data) = std::fs::read(format!("/proc/{pid}/exe")) else {
        return false;
    };
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
    fn own_process_is_alive_and_not_mpi() {
        let pid = std::process::id();
        let t = start_ticks(pid).unwrap();
        assert!(alive(pid, t));
        assert!(!alive(pid, t + 1));
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
