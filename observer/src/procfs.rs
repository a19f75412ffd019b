//! What `/proc` tells about a process: whether it is alive (and still the
//! same process), which MPI library it has mapped, and which rank of which
//! job it is. Identity always comes from here, never from anything the
//! process itself could write.

use std::{
    fs,
    io::{self, BufRead as _},
    path::{Path, PathBuf},
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

/// The process's start time in clock ticks since boot (field 22 of
/// `/proc/PID/stat`): with the pid, it identifies a process across pid reuse.
pub fn start_ticks(pid: u32) -> Result<u64, ProcError> {
    let stat = read(pid, "stat")?;
    let stat = String::from_utf8_lossy(&stat);
    // comm may contain spaces and parentheses: fields start after the last ')'.
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    rest.split_whitespace()
        .nth(19)
        .and_then(|s| s.parse().ok())
        .ok_or(ProcError::NoSuchProcess { pid })
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
    let Ok(stat) = fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let mut fields = rest.split_whitespace();
    let state = fields.next().unwrap_or("X");
    let same = fields.nth(18).and_then(|s| s.parse::<u64>().ok()) == Some(ticks);
    same && state != "Z" && state != "X"
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

/// The lowest mapping of the file at `path` in `pid`'s address space.
pub fn mapping_of(pid: u32, path: &Path) -> Option<MappedLib> {
    lowest_mapping(pid, |p| p == path).ok().flatten()
}

/// Who a rank is, read from its environment.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Identity {
    /// Rank in `MPI_COMM_WORLD`, or "unknown".
    pub rank: String,
    /// Size of `MPI_COMM_WORLD`, or "unknown".
    pub size: String,
    /// The job: batch system job id, else the launcher's namespace, else
    /// the launcher's pid.
    pub jobid: String,
}

/// Environment variables giving the rank, in order of precedence.
pub const RANK_VARS: &[&str] = &[
    "OMPI_COMM_WORLD_RANK",
    "PMIX_RANK",
    "PMI_RANK",
    "SLURM_PROCID",
];
/// Environment variables giving the world size, in order of precedence.
pub const SIZE_VARS: &[&str] = &["OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS"];
/// Environment variables giving the job id, in order of precedence.
pub const JOB_VARS: &[&str] = &["SLURM_JOB_ID", "PBS_JOBID", "PMIX_NAMESPACE"];

/// Reads rank, size and job id from `/proc/PID/environ` (the environment the
/// process was started with). See [`RANK_VARS`], [`SIZE_VARS`], [`JOB_VARS`];
/// without a job variable the job is named after the launcher, the nearest
/// ancestor that is not itself an MPI rank: `launcher-PID`.
pub fn identity(pid: u32) -> Result<Identity, ProcError> {
    let env = read(pid, "environ")?;
    let vars: Vec<(&[u8], &[u8])> = env
        .split(|b| *b == 0)
        .filter_map(|kv| {
            let eq = kv.iter().position(|b| *b == b'=')?;
            Some((&kv[..eq], &kv[eq + 1..]))
        })
        .collect();
    let get = |names: &[&str]| {
        names.iter().find_map(|n| {
            vars.iter()
                .find(|(k, v)| *k == n.as_bytes() && !v.is_empty())
                .map(|(_, v)| String::from_utf8_lossy(v).into_owned())
        })
    };
    let jobid = get(JOB_VARS)
        .or_else(|| hydra_job(pid))
        .unwrap_or_else(|| format!("launcher-{}", launcher_pid(pid)));
    Ok(Identity {
        rank: get(RANK_VARS).unwrap_or_else(|| "unknown".into()),
        size: get(SIZE_VARS).unwrap_or_else(|| "unknown".into()),
        jobid,
    })
}

fn parent(pid: u32) -> Option<u32> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = stat.rsplit_once(')')?.1;
    rest.split_whitespace().nth(1)?.parse().ok()
}

/// MPICH's Hydra without a batch system: every node's proxy carries the
/// launcher's `--control-port HOST:PORT`, the same on all nodes of one job,
/// whereas pids differ from node to node.
fn hydra_job(pid: u32) -> Option<String> {
    let proxy = parent(pid).filter(|p| comm(*p).starts_with("hydra_pmi_prox"))?;
    let cmdline = fs::read(format!("/proc/{proxy}/cmdline")).ok()?;
    let mut args = cmdline.split(|b| *b == 0);
    args.find(|a| *a == b"--control-port")?;
    let port = String::from_utf8_lossy(args.next()?).into_owned();
    (!port.is_empty()).then(|| format!("hydra-{port}"))
}

/// The nearest ancestor whose command is a launcher (mpirun, mpiexec,
/// orted, hydra_pmi_proxy, srun...), else the parent.
fn launcher_pid(pid: u32) -> u32 {
    const LAUNCHERS: &[&str] = &[
        "mpirun",
        "mpiexec",
        "orterun",
        "prterun",
        "srun",
        "hydra_pmi_proxy",
        "orted",
        "prted",
    ];
    let first = parent(pid).unwrap_or(0);
    let mut cur = first;
    // Prefer the outermost launcher: ranks of one job under one mpirun share it
    // even when a per-node daemon (orted, hydra proxy) sits between.
    let mut best = None;
    for _ in 0..16 {
        if cur <= 1 {
            break;
        }
        let c = comm(cur);
        if LAUNCHERS.iter().any(|l| c.starts_with(l)) {
            best = Some(cur);
        }
        match parent(cur) {
            Some(p) => cur = p,
            None => break,
        }
    }
    best.unwrap_or(first)
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
