//! The shim's files in `/dev/shm` as the tests see them, and an attacker
//! ([`crate::attack`]) that squats their names (issue 21, attack 10).

use std::path::{Path, PathBuf};

/// The shim's files (stats segment, `.trace` rings) that process `pid`
/// maps, by their path in `/proc/PID/maps` (without ` (deleted)`), the
/// segment first. Empty if it maps none or is gone.
pub fn files_of(pid: u32) -> Vec<PathBuf> {
    let Ok(maps) = std::fs::read_to_string(format!("/proc/{pid}/maps")) else {
        return Vec::new();
    };
    let mut out: Vec<PathBuf> = Vec::new();
    for line in maps.lines() {
        let Some(i) = line.find("/dev/shm/mpi-observer.") else {
            continue;
        };
        let p = line[i..].trim_end_matches(" (deleted)");
        let name = &p["/dev/shm/".len()..];
        // mpi-observer.<uid>.<pid>.<random>[.trace]: this process's own.
        if name.split('.').nth(2) != Some(&pid.to_string()) {
            continue;
        }
        let p = PathBuf::from(p);
        if !out.contains(&p) {
            out.push(p);
        }
    }
    out.sort_by_key(|p| p.to_string_lossy().ends_with(".trace"));
    out
}

/// The stats segment `pid` maps; panics if it has none.
pub fn segment_of(pid: u32) -> PathBuf {
    files_of(pid)
        .into_iter()
        .find(|p| !p.to_string_lossy().ends_with(".trace"))
        .unwrap_or_else(|| panic!("pid {pid} maps no stats segment"))
}

/// The recording rings `pid` maps; panics if it has none.
pub fn trace_of(pid: u32) -> PathBuf {
    files_of(pid)
        .into_iter()
        .find(|p| p.to_string_lossy().ends_with(".trace"))
        .unwrap_or_else(|| panic!("pid {pid} maps no trace file"))
}

/// Files the attacker ([`crate::attack::ATTACKER`]) pre-created in
/// `/dev/shm`; removed on drop.
pub struct Squat {
    /// Their paths.
    pub files: Vec<PathBuf>,
    /// The attacker's uid.
    pub attacker: u32,
}

/// The last pid the kernel handed out (the fifth field of /proc/loadavg).
fn last_pid() -> u32 {
    std::fs::read_to_string("/proc/loadavg")
        .expect("read /proc/loadavg")
        .split_whitespace()
        .nth(4)
        .and_then(|f| f.split('/').nth(1).or(Some(f)))
        .and_then(|f| f.parse().ok())
        .expect("the last pid in /proc/loadavg")
}

/// The attacker pre-creates, for each of the next `pids` pids, every name
/// of the shim it can guess for a victim of uid `victim`: the old
/// `mpi-observer.<pid>` and `.trace`, and the new form with an all-zero
/// random part (the real one cannot be guessed): 4 files a pid.
pub fn squat(victim: u32, pids: u32) -> Squat {
    let first = last_pid() + 1;
    let last = first + pids - 1;
    let script = format!(
        "cd /dev/shm && for p in $(seq {first} {last}); do \
         : > mpi-observer.$p; : > mpi-observer.$p.trace; \
         : > mpi-observer.{victim}.$p.0000000000000000; \
         : > mpi-observer.{victim}.$p.0000000000000000.trace; done"
    );
    let user = crate::attack::User::ensure(crate::attack::ATTACKER);
    let o = user
        .command("sh")
        .args(["-c", &script])
        .output()
        .expect("run the squatter");
    let mut files = Vec::new();
    for p in first..=last {
        for name in [
            format!("mpi-observer.{p}"),
            format!("mpi-observer.{p}.trace"),
            format!("mpi-observer.{victim}.{p}.0000000000000000"),
            format!("mpi-observer.{victim}.{p}.0000000000000000.trace"),
        ] {
            files.push(Path::new("/dev/shm").join(name));
        }
    }
    let s = Squat {
        files,
        attacker: user.uid,
    };
    assert!(
        o.status.success(),
        "the squatter failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    s
}

impl Drop for Squat {
    fn drop(&mut self) {
        for f in &self.files {
            let _ = std::fs::remove_file(f);
        }
    }
}
