//! A planned restart (a package upgrade): the daemon stopping hands its
//! probes over to the next one instead of detaching them, so ranks already
//! running lose no call (the mechanism: `crate::attach::probes`'s
//! `handover` module; the why: docs/architecture.md, "Restart").
//!
//! Which stop is a restart is said by the file [`REQUEST`], written by the
//! package's prerm in `upgrade` mode: one `PID START_TICKS` line per daemon
//! to hand over. A daemon stopped (SIGTERM or SIGINT) while a line names it
//! hands over; any other stop detaches everything, as always. A file, not
//! a signal, because systemd's `try-restart` after the upgrade is what
//! stops the daemon, with the SIGTERM it sends for every stop: the prerm
//! cannot change that signal, only say beforehand what this one means.
//! Naming the process (pid and start time) keeps a request from meaning
//! anything to a later daemon.

use std::{
    collections::HashSet,
    io::Read as _,
    os::unix::fs::{MetadataExt as _, OpenOptionsExt as _},
    path::Path,
    sync::{Arc, Mutex},
};

use crate::{
    attach::{pins, probes::Adoption},
    export::registry::{self, Admission, State},
    os::procfs,
};

/// The restart request the package's prerm writes.
pub const REQUEST: &str = "/run/mpi-observer/restart";

/// The request file's size cap.
const MAX_REQUEST: u64 = 64 * 1024;

/// How old a restart request may be: the prerm writes it moments before
/// the upgrade's restart.
const REQUEST_FRESH: std::time::Duration = std::time::Duration::from_secs(15 * 60);

/// Whether [`REQUEST`] asks this process to hand over at its stop.
pub fn requested() -> bool {
    let me = std::process::id();
    let Ok(ticks) = procfs::start_ticks(me) else {
        return false;
    };
    read_request(Path::new(REQUEST)).is_some_and(|l| l.contains(&(me, ticks)))
}

/// Root's or ours, and writable by no one else.
fn trusted(m: &std::fs::Metadata) -> bool {
    // SAFETY: geteuid cannot fail.
    let euid = unsafe { libc::geteuid() };
    (m.uid() == 0 || m.uid() == euid) && m.mode() & 0o022 == 0
}

/// The (pid, start ticks) lines of the request at `path`: a regular file,
/// not a symlink, in a directory that is not one either, both root's (or
/// ours) and writable by no one else, at most [`MAX_REQUEST`] bytes.
fn read_request(path: &Path) -> Option<Vec<(u32, u64)>> {
    let parent = std::fs::symlink_metadata(path.parent()?).ok()?;
    if !parent.file_type().is_dir() || !trusted(&parent) {
        return None;
    }
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
        .ok()?;
    let m = f.metadata().ok()?;
    if !m.file_type().is_file() || !trusted(&m) || m.len() > MAX_REQUEST {
        return None;
    }
    // A request left by an upgrade that failed before its restart must
    // not turn a later plain stop into a handover nobody takes.
    if m.modified()
        .ok()
        .and_then(|t| t.elapsed().ok())
        .is_none_or(|age| age > REQUEST_FRESH)
    {
        return None;
    }
    let mut text = String::new();
    f.take(MAX_REQUEST).read_to_string(&mut text).ok()?;
    Some(parse_request(&text))
}

fn parse_request(text: &str) -> Vec<(u32, u64)> {
    text.lines()
        .filter_map(|l| {
            let mut it = l.split_whitespace();
            let v = (it.next()?.parse().ok()?, it.next()?.parse().ok()?);
            it.next().is_none().then_some(v)
        })
        .collect()
}

/// Takes over what an earlier daemon handed over (`adoption`, from
/// `Probes::load_adopting`): registers each of its live ranks now, with
/// the probes it had; says in one line, and counts, each rank whose probes
/// were dropped instead.
pub fn adopt(state: &Arc<Mutex<State>>, adoption: Adoption) {
    if let Some(why) = &adoption.unavailable {
        log::warn!(
            "the probes an earlier daemon handed over cannot be looked for: {why}; any it pinned stay until that directory is removed"
        );
    }
    let lock = || state.lock().unwrap_or_else(|p| p.into_inner());
    let mut dropped = adoption.lost.len() as u64;
    for (_, line) in &adoption.lost {
        log::warn!("{line}");
    }
    let mut adopted = 0;
    let mut why = std::collections::HashMap::new();
    for &(pid, ticks) in &adoption.ranks {
        // Read without the lock, registered under it, as the attacher does.
        let prepared = registry::prepare(pid, ticks);
        let mut st = lock();
        match st.commit(prepared, Admission::Named) {
            Ok(()) if st.rank(pid).is_some_and(|r| r.is_probed()) => {
                adopted += 1;
                log::info!(
                    "pid {pid}: adopted with the probes the earlier daemon handed over; its figures carry on"
                );
            }
            Ok(()) => {
                why.insert(pid, "its shim now counts its calls".to_string());
            }
            Err(e) => {
                why.insert(pid, e.to_string());
            }
        }
    }
    let mut st = lock();
    let Some(probes) = st.probes.as_mut() else {
        return;
    };
    for pid in probes.drop_unclaimed() {
        dropped += 1;
        let why = why.remove(&pid).unwrap_or_else(|| "not registered".into());
        log::warn!(
            "pid {pid}: the probes an earlier daemon handed over are dropped ({why}); a live rank is attached afresh and counts from then"
        );
    }
    if adoption.maps {
        let keep: HashSet<u32> = st.ranks.keys().copied().collect();
        let Some(probes) = st.probes.as_mut() else {
            return;
        };
        // Those already said and counted (a rank gone meanwhile) are not
        // again.
        let gone: Vec<u32> = probes
            .forget_unowned(&keep)
            .into_iter()
            .filter(|p| !adoption.lost.iter().any(|(l, _)| l == p))
            .collect();
        if !gone.is_empty() {
            dropped += gone.len() as u64;
            log::warn!(
                "the earlier daemon's figures of {} exited or detached processes ({gone:?}) are not carried over",
                gone.len()
            );
        }
    }
    st.selfm
        .restart_handovers
        .with_label_values(&["adopted"])
        .inc_by(adopted);
    st.selfm
        .restart_handovers
        .with_label_values(&["dropped"])
        .inc_by(dropped);
}

/// Hands every live rank's probes over to the next daemon (the maps and
/// links pinned under [`pins::DIR`]). True if done: the caller exits
/// without detaching, nor ejecting injected shims (the next daemon adopts
/// them too). False, with one line, if not: the caller detaches as at any
/// stop.
pub fn hand_over(state: &Mutex<State>) -> bool {
    let st = state.lock().unwrap_or_else(|p| p.into_inner());
    let Some(probes) = st.probes.as_ref() else {
        log::info!("restart requested; no probes to hand over (--no-bpf)");
        return true;
    };
    let ranks: Vec<_> = st
        .ranks
        .values()
        .filter(|r| r.exited_at.is_none())
        .filter_map(|r| Some((r.pid, r.ticks, r.attached_at, r.attachment()?)))
        .collect();
    match probes.hand_over(&ranks) {
        Ok(links) => {
            log::info!(
                "restart requested: the probes of {} ranks ({links} links) and the maps are pinned in {} for the next daemon; exiting without detaching",
                ranks.len(),
                pins::DIR
            );
            true
        }
        Err(e) => {
            log::warn!(
                "restart requested, but the probes cannot be handed over ({e}); detaching them: the next daemon attaches the ranks afresh, counting from then"
            );
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_lines() {
        assert_eq!(
            parse_request("12 345\n\n 7 8 \nbad\n1 2 3\n-1 2\n"),
            vec![(12, 345), (7, 8)]
        );
    }

    #[test]
    fn request_refuses_a_symlink() {
        let dir = std::env::temp_dir().join(format!("handover-req-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir(&dir).unwrap();
        std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .unwrap();
        let real = dir.join("real");
        std::fs::write(&real, "1 2\n").unwrap();
        std::fs::set_permissions(&real, std::os::unix::fs::PermissionsExt::from_mode(0o644))
            .unwrap();
        assert_eq!(read_request(&real), Some(vec![(1, 2)]));
        let link = dir.join("link");
        std::os::unix::fs::symlink(&real, &link).unwrap();
        assert_eq!(read_request(&link), None);
        std::fs::set_permissions(&real, std::os::unix::fs::PermissionsExt::from_mode(0o666))
            .unwrap();
        assert_eq!(read_request(&real), None, "writable by others");
        std::fs::set_permissions(&real, std::os::unix::fs::PermissionsExt::from_mode(0o644))
            .unwrap();
        // Left by an upgrade that failed before its restart.
        let old = std::time::SystemTime::now() - REQUEST_FRESH - std::time::Duration::from_secs(1);
        std::fs::File::options()
            .write(true)
            .open(&real)
            .unwrap()
            .set_modified(old)
            .unwrap();
        assert_eq!(read_request(&real), None, "stale");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
