//! Call sites: naming the application's return addresses that the probes
//! (`attach --callsites`) and the shim's `stats` layer capture, and keeping
//! the `mpi_callsite_*` series of each rank bounded.
//!
//! **Naming.** An address is turned into (object file, file offset) with the
//! process's `/proc/PID/maps`, read once and again only when an address
//! falls outside every mapping known (a library dlopened later). The name
//! is then looked up, with blazesym, in that file's ELF symbols and DWARF
//! line table, at the offset of the call instruction (the return address
//! minus one), and cached by (device, inode, offset): every rank of a job
//! runs the same binary, so each call site of a library is symbolized once
//! per daemon, at the collection that first sees it, never on the
//! application's path. A name has one of these forms, best first:
//!
//! | what the object has | the call site's name |
//! |---|---|
//! | symbols and DWARF lines | `exchange at halo.c:42` |
//! | symbols only | `exchange+0x2f` (the return address's offset in the function) |
//! | neither (stripped) | `app+0x1a2f` (the object's file name and the return address's file offset) |
//! | an address outside every mapping | `[unknown]` |
//!
//! Two call instructions on one source line share a name, and their figures
//! are added together.
//!
//! **Bounds.** The maps and the shim's table hold every call site; the
//! exposition holds, per (rank, function), the first [`Budget::per_function`]
//! call sites seen (the heaviest first among those seen at one collection),
//! and sums the rest as `callsite="other"`: the rank's calls of that
//! function minus those of its named sites. A site keeps its series for the
//! rank's life, so every counter only grows (a site that moved between its
//! own series and `other` would make both jump). The report reads every
//! site.

use std::{
    collections::{BTreeMap, HashMap},
    path::{Path, PathBuf},
    sync::Arc,
};

use blazesym::symbolize::{
    Input, Symbolized, Symbolizer,
    source::{Elf, Source},
};

use crate::{procfs, snapshot::RawSite};

/// The name of the series summing a function's call sites beyond the budget
/// (and the calls no site was recorded for).
pub const OTHER: &str = "other";
/// The name of an address outside every mapping.
pub const UNKNOWN: &str = "[unknown]";

/// How many call sites of each (rank, function) get series of their own.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Budget {
    /// Named call sites per (rank, function).
    pub per_function: usize,
}

impl Default for Budget {
    fn default() -> Self {
        Budget { per_function: 8 }
    }
}

/// One executable mapping of a process.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Mapping {
    start: u64,
    end: u64,
    /// File offset of `start`.
    offset: u64,
    /// The file's device and inode, as `/proc/PID/maps` gives them.
    dev: (u32, u32),
    inode: u64,
    /// The file's path, as the process sees it.
    path: String,
}

/// A process's executable file mappings.
#[derive(Clone, Debug, Default)]
struct Maps {
    ranges: Vec<Mapping>,
}

impl Maps {
    /// Keeps the executable mappings of files of a parsed `/proc/PID/maps`.
    fn from_entries(entries: Vec<procfs::MapEntry>) -> Maps {
        let ranges = entries
            .into_iter()
            .filter(|m| m.exec)
            .filter_map(|m| {
                Some(Mapping {
                    start: m.start,
                    end: m.end,
                    offset: m.offset,
                    dev: m.dev,
                    inode: m.inode,
                    path: m.path?.to_string_lossy().into_owned(),
                })
            })
            .collect();
        Maps { ranges }
    }

    fn read(pid: u32) -> Result<Maps, procfs::ProcError> {
        procfs::maps(pid).map(Maps::from_entries)
    }

    fn find(&self, addr: u64) -> Option<&Mapping> {
        self.ranges.iter().find(|m| addr >= m.start && addr < m.end)
    }
}

/// A file's identity and an offset in it: the cache key of a name.
type Key = ((u32, u32), u64, u64);

/// Call-site names, cached by file and offset: one per daemon.
pub struct Names {
    cache: HashMap<Key, Arc<str>>,
    unknown: Arc<str>,
}

impl Default for Names {
    fn default() -> Self {
        Names::new()
    }
}

impl std::fmt::Debug for Names {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Names")
            .field("cached", &self.cache.len())
            .finish()
    }
}

impl Names {
    /// An empty cache.
    pub fn new() -> Names {
        Names {
            cache: HashMap::new(),
            unknown: Arc::from(UNKNOWN),
        }
    }

    /// Call-site names cached so far.
    pub fn cached(&self) -> usize {
        self.cache.len()
    }

    /// A naming session for one collection. The symbolizer, which keeps
    /// the files it parsed, is made at the first name not cached and lives
    /// as long as the session: blazesym's is not `Send`, and the daemon's
    /// state moves between threads.
    pub fn session(&mut self) -> Session<'_> {
        Session {
            names: self,
            symbolizer: None,
        }
    }
}

/// Names call sites during one collection; see [`Names::session`].
pub struct Session<'a> {
    names: &'a mut Names,
    symbolizer: Option<Symbolizer>,
}

impl Session<'_> {
    /// The name of the return address `addr` in the mapping `m` of process
    /// `pid` (read through `/proc/PID/root` while it runs, so a rank in a
    /// container is symbolized with its own files).
    fn name_in(&mut self, pid: u32, m: &Mapping, addr: u64) -> Arc<str> {
        let ret_offset = addr - m.start + m.offset;
        let key = (m.dev, m.inode, ret_offset);
        if let Some(n) = self.names.cache.get(&key) {
            return n.clone();
        }
        let rooted = PathBuf::from(format!("/proc/{pid}/root{}", m.path));
        let file = if rooted.exists() {
            rooted
        } else {
            PathBuf::from(&m.path)
        };
        let symbolizer = self.symbolizer.get_or_insert_with(|| {
            Symbolizer::builder()
                .enable_code_info(true)
                .enable_inlined_fns(false)
                .enable_demangling(true)
                .build()
        });
        let name = symbolize(symbolizer, &file, &m.path, ret_offset);
        let name: Arc<str> = Arc::from(crate::identity::cap_callsite(&name));
        self.names.cache.insert(key, name.clone());
        name
    }
}

/// Looks the call instruction (the byte before the return address) up in
/// `file`; `shown` is the path the object is named by.
fn symbolize(symbolizer: &Symbolizer, file: &Path, shown: &str, ret_offset: u64) -> String {
    let object = Path::new(shown)
        .file_name()
        .map_or_else(|| shown.to_string(), |n| n.to_string_lossy().into_owned());
    let fallback = format!("{object}+{ret_offset:#x}");
    let src = Source::Elf(Elf::new(file));
    let call = ret_offset.saturating_sub(1);
    let sym = match symbolizer.symbolize_single(&src, Input::FileOffset(call)) {
        Ok(Symbolized::Sym(sym)) => sym,
        // Stripped, not an ELF file, or gone: the object and offset.
        Ok(Symbolized::Unknown(_)) | Err(_) => return fallback,
    };
    if sym.name.is_empty() {
        return fallback;
    }
    match sym.code_info.as_deref() {
        Some(ci) if ci.line.is_some() => {
            let f = Path::new(&ci.file)
                .file_name()
                .unwrap_or(&ci.file)
                .to_string_lossy();
            format!("{} at {f}:{}", sym.name, ci.line.unwrap_or(0))
        }
        // The offset of the return address in the function.
        _ => format!("{}+{:#x}", sym.name, sym.offset + 1),
    }
}

/// One call site's figures, named.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Site {
    /// MPI function ID.
    pub function: u16,
    /// The call site's name (module docs).
    pub name: Arc<str>,
    /// Calls made from it.
    pub calls: u64,
    /// Their total time in nanoseconds.
    pub time_ns: u64,
    /// Whether it has series of its own (else it is counted in `other`).
    pub exported: bool,
}

/// One rank's call sites: its maps, the names of its addresses, and which
/// sites have series of their own.
#[derive(Debug, Default)]
pub struct RankSites {
    maps: Option<Maps>,
    names: HashMap<u64, Arc<str>>,
    exported: BTreeMap<u16, Vec<Arc<str>>>,
}

impl RankSites {
    /// The name of `addr` in process `pid`; `alive` says whether its maps
    /// may still be read.
    fn name(&mut self, names: &mut Session<'_>, pid: u32, alive: bool, addr: u64) -> Arc<str> {
        if let Some(n) = self.names.get(&addr) {
            return n.clone();
        }
        let covered = self.maps.as_ref().and_then(|m| m.find(addr)).is_some();
        if !covered
            && alive
            && let Ok(m) = Maps::read(pid)
        {
            self.maps = Some(m);
        }
        let name = match self.maps.as_ref().and_then(|m| m.find(addr)).cloned() {
            Some(m) => names.name_in(pid, &m, addr),
            // Not cached: the process may map it later.
            None => return names.names.unknown.clone(),
        };
        self.names.insert(addr, name.clone());
        name
    }

    /// Names `addr` by hand (a synthetic rank, with no process to read).
    pub fn preset(&mut self, addr: u64, name: &str) {
        self.names
            .insert(addr, Arc::from(crate::identity::cap_callsite(name)));
    }

    /// Reads the maps now, so that addresses can still be named after the
    /// process exits (its files stay where they were).
    pub fn prime(&mut self, pid: u32) {
        if self.maps.is_none() {
            self.maps = Maps::read(pid).ok();
        }
    }

    /// Names `raw` and merges sites of one name; marks which have series of
    /// their own within `budget`. Sorted by function, then time, heaviest
    /// first.
    pub fn resolve(
        &mut self,
        names: &mut Session<'_>,
        pid: u32,
        alive: bool,
        raw: &[RawSite],
        budget: Budget,
    ) -> Vec<Site> {
        let mut merged: BTreeMap<(u16, Arc<str>), (u64, u64)> = BTreeMap::new();
        for r in raw {
            if r.calls == 0 {
                continue;
            }
            let name = self.name(names, pid, alive, r.addr);
            let e = merged.entry((r.function, name)).or_default();
            e.0 = e.0.saturating_add(r.calls);
            e.1 = e.1.saturating_add(r.time_ns);
        }
        // Newly seen sites take the free places, heaviest first.
        let mut by_function: BTreeMap<u16, Vec<Site>> = BTreeMap::new();
        for ((function, name), (calls, time_ns)) in merged {
            by_function.entry(function).or_default().push(Site {
                function,
                name,
                calls,
                time_ns,
                exported: false,
            });
        }
        let mut out = Vec::new();
        for (function, mut sites) in by_function {
            sites.sort_by(|a, b| b.time_ns.cmp(&a.time_ns).then(a.name.cmp(&b.name)));
            let exported = self.exported.entry(function).or_default();
            for s in &mut sites {
                if exported.contains(&s.name) {
                    s.exported = true;
                } else if exported.len() < budget.per_function && &*s.name != OTHER {
                    exported.push(s.name.clone());
                    s.exported = true;
                }
            }
            out.extend(sites);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAPS: &str = "\
5581a000-5581b000 r--p 00000000 fe:01 1234                       /opt/app/bin/halo
5581b000-5581c000 r-xp 00001000 fe:01 1234                       /opt/app/bin/halo
7f00a000-7f00b000 r-xp 00002000 fe:01 99                         /usr/lib/lib with space.so
7ffd0000-7ffd1000 rw-p 00000000 00:00 0                          [stack]
7ffd2000-7ffd3000 r-xp 00000000 00:00 0                          [vdso]
";

    #[test]
    fn maps_keep_executable_file_mappings() {
        let m = Maps::from_entries(procfs::parse_maps(MAPS.as_bytes()));
        assert_eq!(m.ranges.len(), 2);
        let h = m.find(0x5581b010).unwrap();
        assert_eq!(
            (h.offset, h.inode, h.path.as_str()),
            (0x1000, 1234, "/opt/app/bin/halo")
        );
        assert_eq!(
            m.find(0x7f00a000).unwrap().path,
            "/usr/lib/lib with space.so"
        );
        assert!(m.find(0x5581a010).is_none(), "not executable");
        assert!(m.find(0x7ffd2010).is_none(), "not a file");
    }

    #[test]
    fn a_missing_file_falls_back_to_object_and_offset() {
        let s = Symbolizer::new();
        assert_eq!(
            symbolize(&s, Path::new("/nonexistent/x"), "/opt/app/bin/halo", 0x1a2f),
            "halo+0x1a2f"
        );
    }

    #[test]
    fn budget_is_sticky_and_heaviest_first() {
        let mut cache = Names::new();
        let mut names = cache.session();
        let mut r = RankSites {
            maps: Some(Maps::default()),
            ..Default::default()
        };
        // Pre-name addresses so no maps are needed.
        for (a, n) in [(1, "a"), (2, "b"), (3, "c")] {
            r.names.insert(a, Arc::from(n));
        }
        let site = |addr, time_ns| RawSite {
            function: 7,
            addr,
            calls: 1,
            time_ns,
        };
        let b = Budget { per_function: 2 };
        let s = r.resolve(&mut names, 0, false, &[site(1, 5), site(2, 9)], b);
        assert_eq!(
            s.iter().map(|s| (&*s.name, s.exported)).collect::<Vec<_>>(),
            [("b", true), ("a", true)]
        );
        // c is now the heaviest, but the places are taken for good.
        let s = r.resolve(
            &mut names,
            0,
            false,
            &[site(1, 5), site(2, 9), site(3, 99)],
            b,
        );
        assert_eq!(
            s.iter().map(|s| (&*s.name, s.exported)).collect::<Vec<_>>(),
            [("c", false), ("b", true), ("a", true)]
        );
    }

    #[test]
    fn sites_of_one_name_are_merged() {
        let mut cache = Names::new();
        let mut names = cache.session();
        let mut r = RankSites::default();
        r.names.insert(1, Arc::from("f at x.c:3"));
        r.names.insert(2, Arc::from("f at x.c:3"));
        let raw = [
            RawSite {
                function: 1,
                addr: 1,
                calls: 2,
                time_ns: 10,
            },
            RawSite {
                function: 1,
                addr: 2,
                calls: 3,
                time_ns: 5,
            },
        ];
        let s = r.resolve(&mut names, 0, false, &raw, Budget::default());
        assert_eq!(s.len(), 1);
        assert_eq!((s[0].calls, s[0].time_ns), (5, 15));
    }
}
