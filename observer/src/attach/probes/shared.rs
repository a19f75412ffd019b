//! Library files probed once for every process that maps them (`attach
//! --all` on classic uprobes), and the by-address table of probe sites
//! ([`maps::SITE_COOKIES`]) for programs that tell functions by address.
//!
//! Why per file: a classic uprobe costs a perf event per site to attach and
//! a grace period per site to detach, partly under a kernel-wide mutex, so
//! per process a 2-rank job's 700 sites took tens of seconds to remove.
//! Probing each library file once makes a rank's arrival and departure a
//! map update: the programs count only the processes `MPI_PROCS`
//! configures. The price is paid by processes that map the file and are
//! not observed (another user's job over budget, another namespace's): each
//! of their MPI calls traps into the kernel and runs the programs' first
//! lookup (docs/security.md, "Probes on a whole library file"). A file with
//! no rank left keeps its probes for [`LINGER`], so jobs that follow one
//! another do not pay the attach again.

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    os::fd::OwnedFd,
    time::{Duration, Instant},
};

use aya::{
    Ebpf,
    maps::{HashMap as BpfHashMap, MapData, MapError},
};
use observer_common::maps::{self, SiteOffset};

use crate::os::procfs::MappedLib;

/// How long a library file keeps its probes once no rank maps it.
pub const LINGER: Duration = Duration::from_secs(30);

/// A library file, as its mappings name it: device and inode.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FileKey {
    /// Device major.
    pub major: u32,
    /// Device minor.
    pub minor: u32,
    /// Inode.
    pub ino: u64,
}

impl FileKey {
    /// The file `map` maps.
    pub fn of(map: &MappedLib) -> FileKey {
        let (major, minor, ino) = map.file;
        FileKey { major, minor, ino }
    }
}

/// Sites by program: file offsets and their cookies.
pub type Sites = BTreeMap<&'static str, (Vec<u64>, Vec<u64>)>;

/// One library file's probes for every process.
struct Probed {
    links: Vec<OwnedFd>,
    probes: usize,
    ranks: HashSet<u32>,
    idle_since: Option<Instant>,
}

/// One library file's entries in [`maps::SITE_COOKIES`].
struct Slot {
    id: u32,
    users: usize,
    offsets: Vec<u64>,
}

/// Why a slot could not be had.
#[derive(Debug)]
pub enum SlotError {
    /// The table has no room for the file's sites.
    Full,
    /// The map refused an entry.
    Map(MapError),
}

/// The files probed for every process, and the slots of the by-address
/// table.
#[derive(Default)]
pub struct Files {
    probed: HashMap<FileKey, Probed>,
    slots: HashMap<FileKey, Slot>,
    free: Vec<u32>,
    next: u32,
    entries: usize,
}

impl Files {
    /// Whether `file` is probed for every process now.
    pub fn is_probed(&self, file: FileKey) -> bool {
        self.probed.contains_key(&file)
    }

    /// Records `file`'s probes for every process.
    pub fn add(&mut self, file: FileKey, links: Vec<OwnedFd>, probes: usize) {
        self.probed.insert(
            file,
            Probed {
                links,
                probes,
                ranks: HashSet::new(),
                idle_since: None,
            },
        );
    }

    /// Counts `pid` among `file`'s ranks; returns the file's probes.
    pub fn join(&mut self, file: FileKey, pid: u32) -> usize {
        let Some(p) = self.probed.get_mut(&file) else {
            return 0;
        };
        p.ranks.insert(pid);
        p.idle_since = None;
        p.probes
    }

    /// `pid` no longer uses `file`'s probes.
    pub fn leave(&mut self, file: FileKey, pid: u32) {
        if let Some(p) = self.probed.get_mut(&file)
            && p.ranks.remove(&pid)
            && p.ranks.is_empty()
        {
            p.idle_since = Some(Instant::now());
        }
    }

    /// Takes out the links of files with no rank for `linger` or longer
    /// (every file with no rank, for `None`; every file at all, with
    /// `all`), to be closed.
    pub fn take_idle(
        &mut self,
        linger: Option<Duration>,
        all: bool,
    ) -> Vec<(FileKey, Vec<OwnedFd>)> {
        let now = Instant::now();
        let gone: Vec<FileKey> = self
            .probed
            .iter()
            .filter(|(_, p)| {
                all || p
                    .idle_since
                    .is_some_and(|t| linger.is_none_or(|l| now.saturating_duration_since(t) >= l))
            })
            .map(|(f, _)| *f)
            .collect();
        gone.into_iter()
            .filter_map(|f| Some((f, self.probed.remove(&f)?.links)))
            .collect()
    }

    /// The links of every file probed for every process, by file, to be
    /// pinned (a planned restart).
    pub fn links(&self) -> impl Iterator<Item = (FileKey, u32, &[OwnedFd])> {
        self.probed.iter().map(|(f, p)| {
            let slot = self.slots.get(f).map_or(u32::MAX, |s| s.id);
            (*f, slot, p.links.as_slice())
        })
    }

    /// `file`'s slot of the by-address table, made (its entry sites'
    /// cookies inserted) if it has none, and counted one more user.
    pub fn take_slot(
        &mut self,
        ebpf: &mut Ebpf,
        file: FileKey,
        sites: &Sites,
    ) -> Result<u32, SlotError> {
        if let Some(s) = self.slots.get_mut(&file) {
            s.users += 1;
            return Ok(s.id);
        }
        let table: BTreeMap<u64, u64> = sites
            .iter()
            .filter(|(prog, _)| **prog != super::RETURN)
            .flat_map(|(_, (offs, cookies))| offs.iter().copied().zip(cookies.iter().copied()))
            .collect();
        if self.entries + table.len() > maps::SITE_COOKIES_CAPACITY as usize {
            return Err(SlotError::Full);
        }
        let id = self.free.pop().unwrap_or_else(|| {
            self.next += 1;
            self.next - 1
        });
        let mut map = cookies_map(ebpf).map_err(SlotError::Map)?;
        let mut inserted = Vec::new();
        for (&offset, &cookie) in &table {
            let key = SiteOffset {
                slot: id,
                pad: 0,
                offset,
            };
            if let Err(e) = map.insert(key, cookie, 0) {
                for k in inserted {
                    let _ = map.remove(&k);
                }
                self.free.push(id);
                return Err(SlotError::Map(e));
            }
            inserted.push(key);
        }
        self.entries += table.len();
        self.slots.insert(
            file,
            Slot {
                id,
                users: 1,
                offsets: table.into_keys().collect(),
            },
        );
        Ok(id)
    }

    /// One more user of `file`'s slot, which exists (an adopted rank).
    pub fn take_slot_again(&mut self, file: FileKey) {
        if let Some(s) = self.slots.get_mut(&file) {
            s.users += 1;
        }
    }

    /// Records a slot a planned restart's maps already hold, with one
    /// user (the file's adopted probes).
    pub fn adopt_slot(&mut self, file: FileKey, id: u32, offsets: Vec<u64>) {
        self.next = self.next.max(id + 1);
        self.free.retain(|f| *f != id);
        self.entries += offsets.len();
        self.slots.insert(
            file,
            Slot {
                id,
                users: 1,
                offsets,
            },
        );
    }

    /// One user of `file`'s slot fewer; the last one's going removes its
    /// entries.
    pub fn release_slot(&mut self, ebpf: &mut Ebpf, file: FileKey) {
        let Some(s) = self.slots.get_mut(&file) else {
            return;
        };
        s.users = s.users.saturating_sub(1);
        if s.users > 0 {
            return;
        }
        let Some(s) = self.slots.remove(&file) else {
            return;
        };
        if let Ok(mut map) = cookies_map(ebpf) {
            for offset in &s.offsets {
                let _ = map.remove(&SiteOffset {
                    slot: s.id,
                    pad: 0,
                    offset: *offset,
                });
            }
        }
        self.entries = self.entries.saturating_sub(s.offsets.len());
        self.free.push(s.id);
    }
}

fn cookies_map(ebpf: &mut Ebpf) -> Result<BpfHashMap<&mut MapData, SiteOffset, u64>, MapError> {
    BpfHashMap::try_from(
        ebpf.map_mut(maps::SITE_COOKIES)
            .ok_or(MapError::InvalidName {
                name: maps::SITE_COOKIES.into(),
            })?,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_lingers_after_its_last_rank() {
        let f = FileKey {
            major: 8,
            minor: 1,
            ino: 42,
        };
        let mut files = Files::default();
        files.add(f, Vec::new(), 10);
        assert_eq!(files.join(f, 1), 10);
        files.join(f, 2);
        files.leave(f, 1);
        assert!(
            files.take_idle(None, false).is_empty(),
            "rank 2 still uses it"
        );
        files.leave(f, 2);
        assert!(files.take_idle(Some(LINGER), false).is_empty(), "lingers");
        assert_eq!(files.take_idle(None, false).len(), 1);
        assert!(!files.is_probed(f));
    }
}
