//! Where the stub and its data go: the process's mappings (read with
//! the one maps parser, [`crate::os::procfs::maps`]), the unused tails of
//! its objects' last pages, and an earlier injection's mailbox.

use std::path::{Path, PathBuf};

use super::*;

/// One line of `/proc/PID/maps`.
#[derive(Clone, Debug)]
pub(super) struct Mapping {
    pub(super) start: u64,
    pub(super) end: u64,
    pub(super) write: bool,
    pub(super) exec: bool,
    pub(super) offset: u64,
    /// The maps line, to open the file as the process maps it.
    pub(super) entry: procfs::MapEntry,
    pub(super) path: Option<PathBuf>,
}

/// Which slack [`Maps::slack`] looks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Perm {
    /// In an executable segment's last page.
    Exec,
    /// In a writable segment's last page.
    Write,
}

/// The process's mappings.
pub(super) struct Maps {
    pub(super) pid: u32,
    pub(super) lines: Vec<Mapping>,
}

impl Maps {
    pub(super) fn read(pid: u32) -> Result<Maps, InjectError> {
        let entries = procfs::maps(pid).map_err(|e| match e {
            procfs::ProcError::NoSuchProcess { .. } => InjectError::Gone { pid },
            procfs::ProcError::Unreadable { source, .. } => {
                os_or_permission(pid, "reading /proc/PID/maps", source)
            }
        })?;
        let lines = entries
            .into_iter()
            .map(|m| Mapping {
                start: m.start,
                end: m.end,
                write: m.write,
                exec: m.exec,
                offset: m.offset,
                entry: m.clone(),
                path: m.path,
            })
            .collect();
        Ok(Maps { pid, lines })
    }

    pub(super) fn has_file_named(&self, name: &str) -> bool {
        self.lines.iter().any(|m| {
            m.path
                .as_deref()
                .and_then(Path::file_name)
                .is_some_and(|n| n == name)
        })
    }

    /// The executable range of the file at `path`.
    pub(super) fn code_of(&self, path: &Path) -> Option<(u64, u64)> {
        let code: Vec<&Mapping> = self
            .lines
            .iter()
            .filter(|m| m.exec && m.path.as_deref() == Some(path))
            .collect();
        Some((
            code.iter().map(|m| m.start).min()?,
            code.iter().map(|m| m.end).max()?,
        ))
    }

    /// The mapping holding `[at, at + len)` whole, if any.
    pub(super) fn holding(&self, at: u64, len: u64) -> Option<&Mapping> {
        self.lines
            .iter()
            .find(|m| m.start <= at && at + len <= m.end)
    }

    /// The mapped files, each once, with where its first mapping (the file
    /// from offset 0) starts: libc's and the dynamic loader's first, never
    /// the MPI library's (whose pages the probes' breakpoints share) nor
    /// the shim's.
    pub(super) fn objects(&self) -> Vec<(&Path, u64)> {
        let mut out: Vec<(&Path, u64)> = Vec::new();
        for m in &self.lines {
            let Some(p) = m.path.as_deref() else { continue };
            let Some(name) = p.file_name().and_then(|n| n.to_str()) else {
                continue;
            };
            if m.offset != 0
                || procfs::is_mpi_library(name)
                || name == SHIM_NAME
                || out.iter().any(|(q, _)| *q == p)
            {
                continue;
            }
            out.push((p, m.start));
        }
        let rank = |p: &Path| {
            let n = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
            if n.starts_with("libc.so") {
                0
            } else if n.starts_with("ld-linux") {
                1
            } else {
                2
            }
        };
        out.sort_by_key(|(p, _)| rank(p));
        out
    }

    /// Unused bytes in the process, 16-aligned: the tail of the last page
    /// of an object's loadable segment, past the segment's end, that is
    /// mapped with `perm` and still all zero. Each (object, perm) has one
    /// candidate, the same on every call, so [`Maps::mailbox`] finds an
    /// earlier injection's block again.
    pub(super) fn candidates(&self, perm: Perm) -> impl Iterator<Item = (u64, u64)> + '_ {
        // Lazily, object by object: each costs a read of its file, and
        // libc, first, nearly always has room.
        self.objects().into_iter().flat_map(move |(_, first)| {
            let entry = self.lines.iter().find(|m| m.start == first);
            entry
                .map_or_else(Vec::new, |m| segment_ends(self.pid, &m.entry, first))
                .into_iter()
                .filter(move |&(_, p)| p == perm)
                .filter_map(move |(end, _)| {
                    let at = end.next_multiple_of(16);
                    let limit = end.next_multiple_of(crate::os::sys::page_size() as u64);
                    let m = self.holding(at, limit.saturating_sub(at).max(1))?;
                    let ok = match perm {
                        Perm::Exec => m.exec && !m.write,
                        Perm::Write => m.write && !m.exec,
                    };
                    (ok && at < limit).then_some((at, limit))
                })
        })
    }

    /// An address with `need` unused bytes mapped with `perm` (see
    /// [`Maps::candidates`]).
    pub(super) fn slack(
        &self,
        mem: &Mem,
        need: usize,
        perm: Perm,
    ) -> Result<Option<u64>, InjectError> {
        for (at, limit) in self.candidates(perm) {
            if at + need as u64 > limit {
                continue;
            }
            let mut bytes = vec![0; need];
            if mem.read(at, &mut bytes).is_ok() && bytes.iter().all(|&b| b == 0) {
                return Ok(Some(at));
            }
        }
        Ok(None)
    }

    /// Where an earlier injection's mailbox is, found by its magic.
    pub(super) fn mailbox(&self, mem: &Mem) -> Result<Option<u64>, InjectError> {
        Ok(self
            .candidates(Perm::Write)
            .map(|(at, _)| at)
            .find(|&at| mem.u64(at).is_ok_and(|v| v == MAGIC)))
    }
}

/// The file of mapping `m` of `pid`, opened as the process maps it (never
/// a path the user swapped since, never a FIFO or a device) and read
/// within the size cap (see [`crate::os::userfile`]).
pub(super) fn read_mapped(
    pid: u32,
    m: &procfs::MapEntry,
) -> Result<Vec<u8>, crate::os::userfile::UserFileError> {
    crate::os::userfile::open_mapped(pid, m, crate::attach::symbols::max_file_size())?.read_all()
}

/// The end, in the process, of every loadable segment of the file of `m`, whose
/// first mapping starts at `first`, with whether it is executable or
/// writable (a segment that is neither is left out).
pub(super) fn segment_ends(pid: u32, m: &procfs::MapEntry, first: u64) -> Vec<(u64, Perm)> {
    use object::read::elf::ProgramHeader as _;
    let Ok(data) = read_mapped(pid, m) else {
        return Vec::new();
    };
    let Ok(elf) = object::read::elf::ElfFile64::<object::Endianness>::parse(&*data) else {
        return Vec::new();
    };
    let endian = elf.endian();
    let loads: Vec<_> = elf
        .elf_program_headers()
        .iter()
        .filter(|ph| ph.p_type(endian) == object::elf::PT_LOAD)
        .collect();
    // The first loadable segment maps the file from offset 0 at `first`.
    let page_mask = !(crate::os::sys::page_size() as u64 - 1);
    let Some(bias) = loads
        .iter()
        .map(|ph| ph.p_vaddr(endian) & page_mask)
        .min()
        .and_then(|v| first.checked_sub(v))
    else {
        return Vec::new();
    };
    loads
        .iter()
        .filter_map(|ph| {
            let flags = ph.p_flags(endian);
            let perm = if flags & object::elf::PF_X != 0 {
                Perm::Exec
            } else if flags & object::elf::PF_W != 0 {
                Perm::Write
            } else {
                return None;
            };
            Some((bias + ph.p_vaddr(endian) + ph.p_memsz(endian), perm))
        })
        .collect()
}
