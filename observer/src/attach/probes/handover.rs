//! A planned restart's handover of the probes (docs/architecture.md,
//! "Restart"). The old daemon pins its maps and every rank's links under
//! `pins::DIR/<layout>/` ([`Probes::hand_over`]) and exits without
//! detaching: the links keep the old programs, which keep counting into
//! the pinned maps while no daemon runs. The new daemon loads its programs
//! against those same maps when their layout hash is its own
//! ([`Probes::load_adopting`]), takes each rank's links back as that
//! rank's attachment when it registers it ([`Probes::attach`]), and removes
//! the pins. So a rank's figures go on from where they were: no call is
//! counted twice, none is missed.
//!
//! Anything else (another layout, a rank gone meanwhile, a pin that cannot
//! be opened) drops the pinned links, so their probes go, and is reported
//! in [`Adoption::lost`]: one line each, counted by the daemon.

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    os::fd::{AsFd as _, BorrowedFd, OwnedFd},
    path::{Path, PathBuf},
    sync::{Arc, atomic::AtomicBool},
};

use aya::maps::{HashMap as BpfHashMap, MapData};
use observer_common::maps::{self, CallStats, ProcConfig, SiteOffset, StatKey, TypeKey};

use super::{Attachment, Closing, ProbeError, Probes, shared::FileKey};
use crate::{
    attach::{
        kernel::Choice,
        links::Mechanism,
        pins::{self, PinError},
    },
    os::{
        procfs::{self, MappedLib, PidNamespace},
        sys::map_fd,
    },
};

/// Bumped when a map's key or value changes meaning without changing
/// size: the layout hash then differs, and a new daemon does not adopt an
/// old one's maps.
pub const LAYOUT_VERSION: u32 = 1;

/// At most this many entries are looked at in a pin directory (a daemon
/// pins a few links per rank).
const MAX_ENTRIES: usize = 1 << 16;

/// One rank's links as pinned.
pub(super) struct Pinned {
    ticks: u64,
    /// When the earlier daemon attached them, in seconds since the epoch.
    since: u64,
    links: Vec<OwnedFd>,
    probes: usize,
}

/// One rank's pinned links as read back: probes, since, links by index.
type Found = (usize, u64, BTreeMap<usize, OwnedFd>);

/// What a daemon found pinned at start.
#[derive(Debug, Default)]
pub struct Adoption {
    /// Ranks (pid, start ticks) whose links were adopted, each waiting for
    /// its registration ([`Probes::attach`]).
    pub ranks: Vec<(u32, u64)>,
    /// Ranks whose pinned probes were dropped instead, each with its
    /// line saying why.
    pub lost: Vec<(u32, String)>,
    /// The pin directory could not be used at all, and why.
    pub unavailable: Option<String>,
    /// The maps are an earlier daemon's: they may hold processes no rank
    /// claims ([`Probes::forget_unowned`]).
    pub maps: bool,
}

/// The hash of the maps' layout `object` gets with `sizes` (name, max
/// entries) and the per-CPU statistics switch, and the names of the maps
/// a handover pins: all but the sections' `.rodata` and the like, and the
/// exec tracepoint's ring and drop counts, which each daemon makes afresh
/// (a daemon's discovery is its own, and `Probes::exec_events` takes them
/// out of the object's maps).
pub(super) fn layout(
    object: &[u8],
    sizes: &[(&str, u32)],
    percpu: bool,
    pidns: Option<PidNamespace>,
    variant: &str,
) -> Result<(u64, Vec<String>), aya_obj::ParseError> {
    let obj = aya_obj::Object::parse(object)?;
    let mut names: Vec<String> = obj
        .maps
        .keys()
        .filter(|n| !n.starts_with('.') && !EXEC_MAPS.contains(&n.as_str()))
        .cloned()
        .collect();
    names.sort();
    let mut bytes = Vec::new();
    bytes.extend_from_slice(&LAYOUT_VERSION.to_le_bytes());
    bytes.push(u8::from(percpu));
    // The maps' pids are this namespace's: a daemon of another must not
    // read them as its own. Nothing added for the initial namespace, so a
    // host daemon's hash is what it was.
    if let Some(ns) = pidns {
        bytes.extend_from_slice(&ns.dev.to_le_bytes());
        bytes.extend_from_slice(&ns.ino.to_le_bytes());
    }
    // How the programs were loaded and attached (the mechanism, per
    // process or per file, cookies or addresses): links of another
    // mechanism run programs that read the maps another way.
    bytes.extend_from_slice(variant.as_bytes());
    bytes.push(0);
    for name in &names {
        let m = &obj.maps[name];
        let max = sizes
            .iter()
            .find(|(n, _)| n == name)
            .map_or(m.max_entries(), |(_, s)| *s);
        bytes.extend_from_slice(name.as_bytes());
        bytes.push(0);
        for v in [
            m.map_type(),
            m.key_size(),
            m.value_size(),
            max,
            m.map_flags(),
        ] {
            bytes.extend_from_slice(&v.to_le_bytes());
        }
    }
    Ok((pins::fnv1a(&bytes), names))
}

/// The exec tracepoint's maps: not handed over.
const EXEC_MAPS: [&str; 2] = [maps::EXECS, maps::EXEC_DROPS];

/// The pins of `names` in `dir/maps/`, or `None` unless every one is there.
fn map_pins(dir: &Path, names: &[String]) -> Option<Vec<(String, PathBuf)>> {
    names
        .iter()
        .map(|n| {
            let p = dir.join("maps").join(n);
            let m = std::fs::symlink_metadata(&p).ok()?;
            m.file_type().is_file().then(|| (n.clone(), p))
        })
        .collect()
}

/// A link pin's name: `PID-TICKS-PROBES-INDEX-SINCE`, SINCE the attach
/// in seconds since the epoch.
fn link_name(pid: u32, ticks: u64, probes: usize, i: usize, since: u64) -> String {
    format!("{pid}-{ticks}-{probes}-{i}-{since}")
}

/// A library file's link pin's name: `MAJOR-MINOR-INODE-SLOT-INDEX`.
fn file_name(file: FileKey, slot: u32, i: usize) -> String {
    format!("{}-{}-{}-{slot}-{i}", file.major, file.minor, file.ino)
}

fn parse_file_name(name: &str) -> Option<(FileKey, u32, usize)> {
    let mut it = name.split('-');
    let file = FileKey {
        major: it.next()?.parse().ok()?,
        minor: it.next()?.parse().ok()?,
        ino: it.next()?.parse().ok()?,
    };
    let v = (file, it.next()?.parse().ok()?, it.next()?.parse().ok()?);
    it.next().is_none().then_some(v)
}

/// The parts of a link pin's name: pid, ticks, probes, index, since.
type LinkName = (u32, u64, usize, usize, u64);

fn parse_link_name(name: &str) -> Option<LinkName> {
    let mut it = name.split('-');
    let v = (
        it.next()?.parse().ok()?,
        it.next()?.parse().ok()?,
        it.next()?.parse().ok()?,
        it.next()?.parse().ok()?,
        it.next()?.parse().ok()?,
    );
    it.next().is_none().then_some(v)
}

/// The ranks (pid, ticks) with links pinned in `dir`.
fn pinned_ranks(dir: &Path) -> HashSet<(u32, u64)> {
    let Ok(rd) = std::fs::read_dir(dir.join("links")) else {
        return HashSet::new();
    };
    rd.take(MAX_ENTRIES)
        .filter_map(|e| parse_link_name(e.ok()?.file_name().to_str()?))
        .map(|(pid, ticks, ..)| (pid, ticks))
        .collect()
}

fn lost_line(pid: u32, why: &str) -> String {
    format!(
        "pid {pid}: the probes an earlier daemon handed over are dropped ({why}); the rank is attached afresh and counts from now"
    )
}

impl Probes {
    /// Loads for `attach`, as [`Probes::load_within`] does, but first
    /// looks in `pins::DIR` for a handover: with a layout like ours, its
    /// maps are used and its ranks' links kept for them
    /// ([`Adoption::ranks`]); every other pin is removed (its probes go)
    /// and reported in [`Adoption::lost`].
    pub fn load_adopting(
        object: &[u8],
        opts: super::LoadOptions,
        choice: Choice,
    ) -> Result<(Self, Adoption), ProbeError> {
        let mut adoption = Adoption::default();
        let mechanism = choice.mechanism;
        let per_file = opts.all && mechanism.per_file();
        let (sizes, percpu) = super::map_sizes(&opts, !mechanism.cookies());
        let pidns = super::pid_namespace()?;
        let (layout, names) = layout(
            object,
            &sizes,
            percpu,
            pidns,
            &super::variant(&*mechanism, per_file),
        )
        .map_err(|source| ProbeError::Layout { source })?;
        let fresh = |m: &dyn Mechanism| Self::load_with(object, opts, m.clone_box(), None);
        let base = match pins::existing_dir() {
            Ok(Some(b)) => b,
            Ok(None) => return Ok((fresh(&*mechanism)?, adoption)),
            Err(e) => {
                adoption.unavailable = Some(e.to_string());
                return Ok((fresh(&*mechanism)?, adoption));
            }
        };
        let mine = base.join(format!("{layout:016x}"));
        // Handovers of another layout (or never completed): dropped.
        if let Ok(rd) = std::fs::read_dir(&base) {
            for e in rd.take(MAX_ENTRIES).filter_map(Result::ok) {
                let path = e.path();
                if path == mine {
                    continue;
                }
                for (pid, _) in pinned_ranks(&path) {
                    adoption.lost.push((
                        pid,
                        lost_line(
                            pid,
                            "another map layout or attach mechanism: a different version or kernel",
                        ),
                    ));
                }
                pins::remove_tree(&path);
            }
        }
        let present = std::fs::symlink_metadata(&mine).is_ok();
        let usable = present
            && [mine.clone(), mine.join("maps"), mine.join("links")]
                .iter()
                .all(|d| pins::check_dir(d).is_ok());
        let pin_paths = usable.then(|| map_pins(&mine, &names)).flatten();
        if present && pin_paths.is_none() {
            for (pid, _) in pinned_ranks(&mine) {
                adoption.lost.push((
                    pid,
                    lost_line(pid, "its maps' pins are missing or not ours"),
                ));
            }
            pins::remove_tree(&mine);
        }
        let Some(pin_paths) = pin_paths else {
            pins::remove_dir_if_empty();
            return Ok((fresh(&*mechanism)?, adoption));
        };
        let mut probes =
            match Self::load_with(object, opts, mechanism.clone_box(), Some(&pin_paths)) {
                Ok(p) => p,
                Err(e) => {
                    for (pid, _) in pinned_ranks(&mine) {
                        adoption.lost.push((
                            pid,
                            lost_line(pid, &format!("its maps cannot be reused: {e}")),
                        ));
                    }
                    pins::remove_tree(&mine);
                    pins::remove_dir_if_empty();
                    return Ok((fresh(&*mechanism)?, adoption));
                }
            };
        adoption.maps = true;
        probes.take_files(&mine);
        probes.take_links(&mine, &mut adoption);
        // The pins go now: the maps are ours, the links held.
        pins::remove_tree(&mine);
        pins::remove_dir_if_empty();
        Ok((probes, adoption))
    }

    /// Opens the probes of library files pinned in `dir/files/` (probes
    /// for every process, `--all` on classic uprobes) and keeps them as
    /// this daemon's, each with its by-address slot; a file whose links
    /// are not all there is dropped (its ranks are then attached afresh).
    fn take_files(&mut self, dir: &Path) {
        let mut found: BTreeMap<(FileKey, u32), BTreeMap<usize, OwnedFd>> = BTreeMap::new();
        let mut broken: HashSet<FileKey> = HashSet::new();
        let Ok(rd) = std::fs::read_dir(dir.join("files")) else {
            return;
        };
        for e in rd.take(MAX_ENTRIES).filter_map(Result::ok) {
            let Some((file, slot, i)) = e.file_name().to_str().and_then(parse_file_name) else {
                continue;
            };
            match pins::get(&e.path()) {
                Ok(fd) => {
                    found.entry((file, slot)).or_default().insert(i, fd);
                }
                Err(_) => {
                    broken.insert(file);
                }
            }
        }
        let by_address = !self.mechanism.cookies();
        for ((file, slot), links) in found {
            if broken.contains(&file) || links.keys().copied().ne(0..links.len()) {
                continue;
            }
            let links: Vec<OwnedFd> = links.into_values().collect();
            let probes = links.len();
            self.shared.add(file, links, probes);
            // Nothing uses it until its ranks are claimed: it lingers.
            self.shared.leave(file, 0);
            if by_address {
                let offsets = self.slot_offsets(slot);
                self.shared.adopt_slot(file, slot, offsets);
            }
        }
    }

    /// The file offsets the adopted by-address table holds for `slot`.
    fn slot_offsets(&self, slot: u32) -> Vec<u64> {
        self.ebpf
            .map(maps::SITE_COOKIES)
            .and_then(|m| BpfHashMap::<&MapData, SiteOffset, u64>::try_from(m).ok())
            .map(|m| {
                m.keys()
                    .filter_map(Result::ok)
                    .filter(|k| k.slot == slot)
                    .map(|k| k.offset)
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Opens the links pinned in `dir/links/` and keeps those of live ranks
    /// configured in the (adopted) maps; drops the rest.
    fn take_links(&mut self, dir: &Path, adoption: &mut Adoption) {
        let mut found: BTreeMap<(u32, u64), Found> = BTreeMap::new();
        let mut broken: HashSet<(u32, u64)> = HashSet::new();
        if let Ok(rd) = std::fs::read_dir(dir.join("links")) {
            for e in rd.take(MAX_ENTRIES).filter_map(Result::ok) {
                let name = e.file_name();
                let Some((pid, ticks, probes, i, since)) = name.to_str().and_then(parse_link_name)
                else {
                    continue;
                };
                match pins::get(&e.path()) {
                    Ok(fd) => {
                        let r = found.entry((pid, ticks)).or_default();
                        (r.0, r.1) = (probes, since);
                        r.2.insert(i, fd);
                    }
                    Err(_) => {
                        broken.insert((pid, ticks));
                    }
                }
            }
        }
        for ((pid, ticks), (probes, since, links)) in found {
            let why = if broken.contains(&(pid, ticks)) {
                Some("a pinned link cannot be opened")
            } else if links.keys().copied().ne(0..links.len()) {
                // Its links are pinned 0..n: one missing would count some
                // of its calls and not others.
                Some("one of its pinned links is missing")
            } else if !procfs::alive(pid, ticks) {
                Some("it exited while no daemon ran, so its last figures are not exported")
            } else if self.config(pid).is_none() {
                Some("its configuration is missing from the maps")
            } else {
                None
            };
            if let Some(why) = why {
                adoption.lost.push((pid, lost_line(pid, why)));
                drop(links);
                continue;
            }
            self.adopted.insert(
                pid,
                Pinned {
                    ticks,
                    since,
                    links: links.into_values().collect(),
                    probes,
                },
            );
            adoption.ranks.push((pid, ticks));
        }
        for (pid, _) in broken {
            if !adoption.ranks.iter().any(|(p, _)| *p == pid)
                && !adoption.lost.iter().any(|(p, _)| *p == pid)
            {
                adoption
                    .lost
                    .push((pid, lost_line(pid, "a pinned link cannot be opened")));
            }
        }
    }

    /// The adopted links of `pid` as its attachment, if it is the process
    /// they were pinned for: its probes never left, its figures and
    /// configuration are in the maps. A rank of a library file probed for
    /// every process had only a marker pinned: it joins the adopted file's
    /// probes (`map` is its mapping of the library now).
    pub(super) fn claim(&mut self, pid: u32, map: &MappedLib) -> Option<Attachment> {
        let p = self.adopted.remove(&pid)?;
        if !procfs::alive(pid, p.ticks) {
            self.drop_pinned(pid, p);
            return None;
        }
        let type_keys = self
            .ebpf
            .map(maps::OMPI_TYPES)
            .and_then(|m| BpfHashMap::<&MapData, TypeKey, u64>::try_from(m).ok())
            .map(|m| super::detach::of_pid(m.keys(), |k: &TypeKey| k.tgid == pid))
            .unwrap_or_default();
        let since = Some(std::time::UNIX_EPOCH + std::time::Duration::from_secs(p.since));
        if self.per_file {
            let file = FileKey::of(map);
            if !self.shared.is_probed(file) {
                self.drop_pinned(pid, p);
                return None;
            }
            // The marker is a second name of the file's first link: it
            // goes, the file's own fd stays.
            drop(p.links);
            let probes = self.shared.join(file, pid);
            let slot = (!self.mechanism.cookies()).then(|| {
                self.shared.take_slot_again(file);
                file
            });
            return Some(Attachment {
                probes,
                type_keys,
                since,
                file: Some(file),
                slot,
                ..Attachment::default()
            });
        }
        Some(Attachment {
            links: p.links,
            probes: p.probes,
            type_keys,
            since,
            ..Attachment::default()
        })
    }

    fn drop_pinned(&mut self, pid: u32, mut p: Pinned) {
        let links: Vec<OwnedFd> = p.links.drain(..).rev().collect();
        let done = Arc::new(AtomicBool::new(false));
        self.closer.close(links, done.clone());
        self.closing.push(Closing {
            pid: Some(pid),
            slot: None,
            done,
        });
    }

    /// Drops the adopted links no rank claimed (its registration failed,
    /// or its shim now times it): their probes go. Returns their pids.
    pub fn drop_unclaimed(&mut self) -> Vec<u32> {
        let left: Vec<(u32, Pinned)> = self.adopted.drain().collect();
        let pids = left.iter().map(|(p, _)| *p).collect();
        for (pid, p) in left {
            self.drop_pinned(pid, p);
        }
        pids
    }

    /// Forgets every process the adopted maps hold that is not in `keep`
    /// (ranks the earlier daemon had detached, or kept after their exit):
    /// a later process given the same pid must start from nothing.
    /// Returns those that had figures, which are not exported.
    pub fn forget_unowned(&mut self, keep: &HashSet<u32>) -> Vec<u32> {
        let mut pids: HashSet<u32> = HashSet::new();
        if let Some(Ok(m)) = self
            .ebpf
            .map(maps::PROCS)
            .map(BpfHashMap::<&MapData, u32, ProcConfig>::try_from)
        {
            pids.extend(m.keys().filter_map(Result::ok));
        }
        let mut with_figures: HashSet<u32> = HashSet::new();
        if let Some(Ok(m)) = self
            .ebpf
            .map(maps::STATS)
            .map(BpfHashMap::<&MapData, StatKey, CallStats>::try_from)
        {
            with_figures.extend(m.keys().filter_map(Result::ok).map(|k| k.tgid));
        }
        pids.extend(with_figures.iter().copied());
        let closing: HashSet<u32> = self.closing.iter().filter_map(|c| c.pid).collect();
        let mut lost: Vec<u32> = Vec::new();
        for pid in pids {
            if keep.contains(&pid) || closing.contains(&pid) {
                continue;
            }
            self.forget(pid);
            self.forget_config(pid);
            if let Some(Ok(mut types)) = self
                .ebpf
                .map_mut(maps::OMPI_TYPES)
                .map(BpfHashMap::<&mut MapData, TypeKey, u64>::try_from)
            {
                let keys = super::detach::of_pid(types.keys(), |k: &TypeKey| k.tgid == pid);
                keys.iter().for_each(|k| drop(types.remove(k)));
            }
            if with_figures.contains(&pid) {
                lost.push(pid);
            }
        }
        lost.sort_unstable();
        lost
    }

    /// Pins the maps and the links of `ranks` (pid, start ticks and
    /// attachment) for the next daemon, under `pins::DIR/<layout>/`,
    /// complete or not at all (made under a temporary name, then renamed).
    /// The caller then exits without detaching. Returns the links pinned.
    /// `since` is when each rank's probes went in.
    pub fn hand_over(
        &self,
        ranks: &[(u32, u64, std::time::SystemTime, &Attachment)],
    ) -> Result<usize, PinError> {
        if !self.mechanism.pinnable() {
            return Err(PinError::NotPinnable {
                mechanism: self.mechanism.name(),
            });
        }
        let base = pins::base_dir()?;
        let dir = base.join(format!("{:016x}", self.layout));
        // One nobody adopted (the daemon started without this layout's
        // maps): ours replaces it.
        if std::fs::symlink_metadata(&dir).is_ok() {
            pins::remove_tree(&dir);
        }
        // bpffs refuses names with a dot.
        let tmp = base.join(format!("{:016x}_{}", self.layout, std::process::id()));
        pins::remove_tree(&tmp);
        let pin_all = || -> Result<usize, PinError> {
            pins::make_dir(&tmp)?;
            pins::make_dir(&tmp.join("maps"))?;
            pins::make_dir(&tmp.join("links"))?;
            for (name, map) in self.ebpf.maps() {
                if name.starts_with('.') {
                    continue;
                }
                let Some(fd) = map_fd(map) else { continue };
                // SAFETY: the fd belongs to a map `self.ebpf` holds open
                // for the duration of this borrow.
                let fd = unsafe { BorrowedFd::borrow_raw(fd) };
                pins::pin(fd, &tmp.join("maps").join(name))?;
            }
            let mut n = 0;
            pins::make_dir(&tmp.join("files"))?;
            let mut firsts: HashMap<FileKey, BorrowedFd<'_>> = HashMap::new();
            for (file, slot, links) in self.shared.links() {
                for (i, l) in links.iter().enumerate() {
                    let name = file_name(file, slot, i);
                    pins::pin(l.as_fd(), &tmp.join("files").join(name))?;
                    n += 1;
                }
                if let Some(l) = links.first() {
                    firsts.insert(file, l.as_fd());
                }
            }
            for (pid, ticks, since, att) in ranks {
                let since = since
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_secs());
                if let Some(file) = att.file {
                    // A rank on its file's probes: a marker, so the next
                    // daemon knows which processes were counted (their
                    // figures are in the maps).
                    if let Some(l) = firsts.get(&file) {
                        let name = link_name(*pid, *ticks, att.probes, 0, since);
                        pins::pin(*l, &tmp.join("links").join(name))?;
                    }
                    continue;
                }
                for (i, l) in att.links.iter().enumerate() {
                    let name = link_name(*pid, *ticks, att.probes, i, since);
                    pins::pin(l.as_fd(), &tmp.join("links").join(name))?;
                    n += 1;
                }
            }
            std::fs::rename(&tmp, &dir).map_err(|source| PinError::Io {
                what: "rename into place",
                path: dir.display().to_string(),
                source,
            })?;
            Ok(n)
        };
        let r = pin_all();
        if r.is_err() {
            pins::remove_tree(&tmp);
        }
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn link_names_round_trip() {
        let n = link_name(4242, 987_654_321, 96, 3, 1_800_000_000);
        assert_eq!(
            parse_link_name(&n),
            Some((4242, 987_654_321, 96, 3, 1_800_000_000))
        );
        assert_eq!(parse_link_name("1-2-3-4"), None);
        assert_eq!(parse_link_name("1-2-3-4-5-6"), None);
        assert_eq!(parse_link_name("../x-1-2-3-4"), None);
    }

    #[test]
    fn layout_depends_on_sizes_and_pid_namespace() {
        let l = |size, percpu, pidns| {
            layout(
                crate::EBPF_OBJECT,
                &[(maps::STATS, size)],
                percpu,
                pidns,
                "v",
            )
            .unwrap()
        };
        let a = l(100, false, None);
        let b = l(101, false, None);
        let c = l(100, true, None);
        let ns = |ino| Some(PidNamespace { dev: 4, ino });
        let d = l(100, false, ns(4_026_532_000));
        let e = l(100, false, ns(4_026_532_001));
        assert_ne!(a.0, b.0);
        assert_ne!(a.0, c.0);
        assert_ne!(a.0, d.0);
        assert_ne!(d.0, e.0);
        assert_eq!(a, l(100, false, None));
        assert_eq!(d, l(100, false, ns(4_026_532_000)));
        assert!(a.1.iter().any(|n| n == maps::STATS));
        assert!(a.1.iter().all(|n| !n.starts_with('.')));
    }
}
