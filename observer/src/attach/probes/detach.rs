//! Taking probes off: a rank's links closed in the background (their
//! grace periods cost the daemon's loop nothing), a library file's shared
//! probes once no rank has used them for [`shared::LINGER`], and a rank's
//! entries in the maps once its links are gone.

use std::{
    os::fd::OwnedFd,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
};

use aya::maps::{HashMap as BpfHashMap, MapData, PerCpuHashMap};
use observer_common::maps::{
    self, CallStats, Inflight, ProcConfig, SiteCount, SiteKey, SiteStats, StatKey, TypeKey,
};

use super::{
    Attachment, Closing, Probes,
    shared::{self, FileKey},
};

impl Probes {
    /// Removes a process's probes. Entry links close before the return link
    /// (they were pushed after it; we close in reverse), so no new call
    /// starts being timed while its return probe goes away. The closing
    /// waits for RCU grace periods (about 200 ms here), so it runs on
    /// background threads; until it is done the probes still fire, and the
    /// process's configuration stays in `PROCS` for them: an injected
    /// rank's skip range must outlive its probes, or the calls its shim
    /// makes would be counted by both (docs/inject.md, "Handover"). A rank
    /// on its library file's shared probes has no links: its
    /// configuration goes at once, and with it every new call of it (the
    /// calls open then finish as they would). Statistics stay in the map
    /// until the rank is forgotten.
    pub fn detach(&mut self, pid: u32, mut att: Attachment) {
        let done = Arc::new(AtomicBool::new(false));
        if let Some(file) = att.file {
            self.shared.leave(file, pid);
            done.store(true, Ordering::Release);
        }
        let links: Vec<OwnedFd> = att.links.drain(..).rev().collect();
        self.closer.close(links, done.clone());
        self.closing.push(Closing {
            pid: Some(pid),
            slot: att.slot,
            done,
        });
        if let Some(Ok(mut types)) = self
            .ebpf
            .map_mut(maps::OMPI_TYPES)
            .map(BpfHashMap::<&mut MapData, TypeKey, u64>::try_from)
        {
            for k in &att.type_keys {
                let _ = types.remove(k);
            }
        }
        self.reap();
    }

    /// Drops the configuration of processes whose links are all closed,
    /// and closes the probes of library files no rank has used for
    /// [`shared::LINGER`]. Called on every detach and from the daemon's
    /// loop.
    pub fn reap(&mut self) {
        let idle = self.shared.take_idle(Some(shared::LINGER), false);
        self.close_files(idle);
        let (done, open): (Vec<_>, Vec<_>) = std::mem::take(&mut self.closing)
            .into_iter()
            .partition(|c| c.done.load(Ordering::Acquire));
        self.closing = open;
        for c in done {
            if let Some(pid) = c.pid {
                self.forget_config(pid);
            }
            if let Some(file) = c.slot {
                self.shared.release_slot(&mut self.ebpf, file);
            }
        }
    }

    /// Closes library files' shared probes in the background; each file's
    /// by-address slot goes once they are closed.
    fn close_files(&mut self, files: Vec<(FileKey, Vec<OwnedFd>)>) {
        let by_address = !self.mechanism.cookies();
        for (file, links) in files {
            let done = Arc::new(AtomicBool::new(false));
            self.closer
                .close(links.into_iter().rev().collect(), done.clone());
            self.closing.push(Closing {
                pid: None,
                slot: by_address.then_some(file),
                done,
            });
        }
    }

    pub(super) fn forget_config(&mut self, pid: u32) {
        if self.closing.iter().any(|c| c.pid == Some(pid)) {
            return;
        }
        if let Some(Ok(mut procs)) = self
            .ebpf
            .map_mut(maps::PROCS)
            .map(BpfHashMap::<&mut MapData, u32, ProcConfig>::try_from)
        {
            let _ = procs.remove(&pid);
        }
    }

    /// Deletes everything the maps hold for process `pid`: its statistics
    /// and call sites, and any call it was in when it died (a later process
    /// given the same pid must not inherit that open call and see its first
    /// calls as nested).
    pub fn forget(&mut self, pid: u32) {
        let ebpf = &mut self.ebpf;
        if let Some(Ok(mut m)) = ebpf
            .map_mut(maps::STATS_PERCPU)
            .map(PerCpuHashMap::<&mut MapData, StatKey, CallStats>::try_from)
        {
            let keys = of_pid(m.keys(), |k: &StatKey| k.tgid == pid);
            keys.iter().for_each(|k| drop(m.remove(k)));
        }
        if let Some(Ok(mut m)) = ebpf
            .map_mut(maps::STATS)
            .map(BpfHashMap::<&mut MapData, StatKey, CallStats>::try_from)
        {
            let keys = of_pid(m.keys(), |k: &StatKey| k.tgid == pid);
            keys.iter().for_each(|k| drop(m.remove(k)));
        }
        if self.callsites {
            if let Some(Ok(mut m)) = ebpf
                .map_mut(maps::CALLSITES)
                .map(BpfHashMap::<&mut MapData, SiteKey, SiteStats>::try_from)
            {
                let keys = of_pid(m.keys(), |k: &SiteKey| k.tgid == pid);
                keys.iter().for_each(|k| drop(m.remove(k)));
            }
            // With its sites gone, the process's count starts again.
            if let Some(Ok(mut counts)) = ebpf
                .map_mut(maps::SITE_COUNTS)
                .map(BpfHashMap::<&mut MapData, u32, SiteCount>::try_from)
            {
                let _ = counts.remove(&pid);
            }
        }
        if let Some(Ok(mut m)) = ebpf
            .map_mut(maps::INFLIGHT)
            .map(BpfHashMap::<&mut MapData, u64, Inflight>::try_from)
        {
            let keys = of_pid(m.keys(), |k: &u64| (k >> 32) as u32 == pid);
            keys.iter().for_each(|k| drop(m.remove(k)));
        }
    }

    /// Waits until every detached probe is really gone from the kernel,
    /// library files' shared probes included; the closers stop resting
    /// between probes (shutdown: nothing else to do).
    pub fn finish_detaching(&mut self) {
        self.closer.hurry();
        let files = self.shared.take_idle(None, true);
        self.close_files(files);
        while !self.closing.is_empty() {
            self.reap();
            if !self.closing.is_empty() {
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
        }
    }
}

/// The keys a map iteration yields that `mine` accepts, collected first:
/// a hash map's keys are not removed while it is being walked.
pub(super) fn of_pid<K>(
    keys: impl Iterator<Item = Result<K, aya::maps::MapError>>,
    mine: impl Fn(&K) -> bool,
) -> Vec<K> {
    keys.filter_map(Result::ok).filter(|k| mine(k)).collect()
}
