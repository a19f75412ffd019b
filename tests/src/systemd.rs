//! A real systemd, booted as PID 1 of a private pid and mount namespace on
//! this machine (whose own PID 1 is not systemd, nor in CI), so the
//! package's unit runs as a site runs it: its user, its sandbox,
//! `LoadCredential=`, `RuntimeDirectory=`, `ExecStartPre=+`, and dpkg's
//! maintainer scripts talking to it (`deb-systemd-invoke try-restart`).
//!
//! The namespace shares the host's file systems, network and kernel but
//! has its own `/proc` and `/run` (a tmpfs: the unit's runtime directory,
//! the restart request and systemd's own state stay in it). Its systemd
//! loads units from one directory only ([`Systemd::UNITS`], through
//! `SYSTEMD_UNIT_PATH`): empty stand-ins for the standard targets, journald
//! (volatile, so nothing reaches the host's journal) and links to the
//! units a test names, so none of the host's services start. A container
//! image's `/usr/sbin/policy-rc.d` (exit 101: maintainer scripts may not
//! start or restart services) is replaced, inside the namespace only, by
//! one that allows them, as on a site's node. Processes
//! that must be seen by a daemon under it (an MPI job) run in the same
//! namespaces ([`Systemd::command`]): the daemon names processes by the
//! pids of its own namespace.
//!
//! Dropping it kills the namespace's PID 1, which kills every process in
//! it.

use std::{
    path::{Path, PathBuf},
    process::{Child, Command, Output, Stdio},
    time::Duration,
};

use crate::{run_with_timeout, wait_for};

/// systemd's binary.
pub const SYSTEMD: &str = "/lib/systemd/systemd";

/// The script that becomes the namespace's PID 1: makes `/` shared again
/// inside the namespace (systemd mounts a unit's credentials in a child
/// namespace and relies on propagation back, which a container's systemd
/// does not set up), mounts the private `/run`, writes the units, and
/// executes systemd. `$1`: the units to link from /usr/lib/systemd/system.
const BOOT: &str = r#"#!/bin/sh
set -e
mount --make-rprivate /
mount --make-rshared /
mount -t tmpfs -o mode=0755 tmpfs /run
mkdir -p /run/lock /run/systemd/journald.conf.d "$UNITS"
if [ -e /usr/sbin/policy-rc.d ]; then
	printf '#!/bin/sh\nexit 0\n' >/run/test-bed/policy-rc.d
	chmod 755 /run/test-bed/policy-rc.d
	mount --bind /run/test-bed/policy-rc.d /usr/sbin/policy-rc.d
fi
printf '[Journal]\nStorage=volatile\nReadKMsg=no\n' >/run/systemd/journald.conf.d/test-bed.conf
for t in sysinit basic shutdown multi-user network network-online network-pre \
	local-fs local-fs-pre remote-fs sockets timers paths slices swap emergency \
	rescue default final umount; do
	printf '[Unit]\nDescription=%s (test bed)\n' "$t" >"$UNITS/$t.target"
done
printf '[Unit]\nDescription=system slice (test bed)\n' >"$UNITS/system.slice"
for u in systemd-journald.service systemd-journald.socket \
	systemd-journald-dev-log.socket $1; do
	ln -s "/usr/lib/systemd/system/$u" "$UNITS/$u"
done
printf '[Unit]\nDescription=test bed\nWants=systemd-journald.socket systemd-journald-dev-log.socket systemd-journald.service\n' \
	>"$UNITS/test-bed.target"
export SYSTEMD_UNIT_PATH="$UNITS" container=mpi-observer-test-bed
exec /lib/systemd/systemd --system --unit=test-bed.target --log-target=journal
"#;

/// A systemd booted as PID 1 of its own pid and mount namespaces.
pub struct Systemd {
    child: Child,
    /// Its pid, as the host sees it.
    pid: u32,
}

impl Systemd {
    /// Where its units are, inside the namespace.
    pub const UNITS: &'static str = "/run/test-bed/units";

    /// Boots one; `units` are unit files of /usr/lib/systemd/system to link
    /// in (they may not exist yet: a package installed later brings them,
    /// then `systemctl daemon-reload`). `dir` holds the boot script.
    pub fn boot(dir: &Path, units: &[&str]) -> Systemd {
        std::fs::create_dir_all(dir).unwrap();
        let script = dir.join("boot.sh");
        std::fs::write(&script, BOOT).unwrap();
        let child = Command::new("unshare")
            .args(["--pid", "--mount", "--fork", "--mount-proc", "sh"])
            .arg(&script)
            .arg(units.join(" "))
            .env("UNITS", Self::UNITS)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("unshare");
        // unshare --fork: its child is the namespace's PID 1.
        let unshare = child.id();
        let pid = wait_for(
            "unshare to fork the namespace's PID 1",
            Duration::from_secs(10),
            || {
                let kids =
                    std::fs::read_to_string(format!("/proc/{unshare}/task/{unshare}/children"))
                        .ok()?;
                kids.split_whitespace().next()?.parse::<u32>().ok()
            },
        );
        let sd = Systemd { child, pid };
        wait_for(
            "the test bed's systemd to be up",
            Duration::from_secs(60),
            || {
                let o = sd.run(&["systemctl", "is-system-running"], Duration::from_secs(10));
                let s = String::from_utf8_lossy(&o.stdout).trim().to_string();
                match s.as_str() {
                    "running" | "degraded" => Some(()),
                    _ => {
                        assert!(
                            Path::new(&format!("/proc/{}", sd.pid)).exists(),
                            "the test bed's systemd exited"
                        );
                        None
                    }
                }
            },
        );
        sd
    }

    /// `argv` run inside its namespaces (nsenter), as root.
    pub fn command(&self, argv: &[&str]) -> Command {
        let mut c = Command::new("nsenter");
        c.arg("-t")
            .arg(self.pid.to_string())
            .args(["-p", "-m", "--"])
            .args(argv);
        c
    }

    /// [`Systemd::command`] run to its end within `limit`, stdin closed.
    pub fn run(&self, argv: &[&str], limit: Duration) -> Output {
        run_with_timeout(self.command(argv).stdin(Stdio::null()), limit)
    }

    /// `systemctl ARGS` in the namespace, asserting success.
    pub fn systemctl(&self, args: &[&str]) -> String {
        let mut argv = vec!["systemctl"];
        argv.extend_from_slice(args);
        let o = self.run(&argv, Duration::from_secs(120));
        assert!(
            o.status.success(),
            "systemctl {args:?} ({}): {}{}\n{}",
            o.status,
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr),
            self.journal(args.last().copied().unwrap_or(""))
        );
        String::from_utf8_lossy(&o.stdout).into_owned()
    }

    /// A unit's property (`systemctl show -P`).
    pub fn property(&self, unit: &str, name: &str) -> String {
        self.systemctl(&["show", "-P", name, unit])
            .trim()
            .to_string()
    }

    /// What `unit` logged (journalctl -u), for assertions and messages.
    pub fn journal(&self, unit: &str) -> String {
        let o = self.run(
            &["journalctl", "--no-pager", "-o", "cat", "-u", unit],
            Duration::from_secs(30),
        );
        String::from_utf8_lossy(&o.stdout).into_owned()
    }

    /// A path of the namespace's private /run, as the host can read it
    /// (through its PID 1's root).
    pub fn run_path(&self, path: &str) -> PathBuf {
        PathBuf::from(format!("/proc/{}/root{path}", self.pid))
    }
}

impl Drop for Systemd {
    fn drop(&mut self) {
        // SIGKILL to a pid namespace's init kills every process in it.
        // SAFETY: plain syscall on a pid we started.
        unsafe { crate::kill(self.pid as i32, crate::signal::KILL) };
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Systemd {
    /// `c` (program, arguments, environment, directory) run inside the
    /// namespaces instead: an MPI job a daemon under this systemd observes.
    pub fn wrap(&self, c: &Command) -> Command {
        let mut w = Command::new("nsenter");
        w.arg("-t")
            .arg(self.pid.to_string())
            .args(["-p", "-m", "--"])
            .arg(c.get_program())
            .args(c.get_args());
        for (k, v) in c.get_envs() {
            match v {
                Some(v) => w.env(k, v),
                None => w.env_remove(k),
            };
        }
        if let Some(d) = c.get_current_dir() {
            w.current_dir(d);
        }
        w
    }
}
