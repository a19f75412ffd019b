//! The Debian package `cargo xtask package` builds
//! (target/debian/mpi-observer.deb), installed on this machine with dpkg:
//! where it puts things, a guard that purges it, and the unit's ExecStart
//! run as systemd runs it (PID 1 is not systemd here, nor in CI). Used by
//! `tests/tests/e2e/package.rs`; a Slurm test installs it the same way.

use std::{
    path::{Path, PathBuf},
    process::{Command, Output, Stdio},
    time::Duration,
};

use crate::{run_with_timeout, target_dir};

/// The package's name.
pub const PKG: &str = "mpi-observer";
/// The installed daemon.
pub const BIN: &str = "/usr/bin/mpi-observer";
/// The installed shim, where `mpi-observer shim-path` finds it.
pub const SHIM: &str = "/usr/lib/mpi-observer/libmpi_observer_shim.so";
/// The installed systemd unit.
pub const UNIT: &str = "/usr/lib/systemd/system/mpi-observer.service";
/// The unit's options (`MPI_OBSERVER_OPTS`), a conffile.
pub const DEFAULTS: &str = "/etc/default/mpi-observer";
/// The Slurm SPANK plugin, in Debian's Slurm plugin directory, which is
/// under the machine's multiarch directory ([`multiarch`]).
pub fn plugin() -> String {
    format!("/usr/lib/{}/slurm-wlm/spank_mpi_observer.so", multiarch())
}

/// Debian's multiarch directory name for this machine
/// (`x86_64-linux-gnu`, `aarch64-linux-gnu`, ...): the directory of the C
/// library this process runs with.
pub fn multiarch() -> String {
    let maps = std::fs::read_to_string("/proc/self/maps").expect("read /proc/self/maps");
    maps.lines()
        .filter_map(|l| l.split_whitespace().nth(5).map(Path::new))
        .filter(|p| {
            p.file_name()
                .is_some_and(|f| f.to_string_lossy().starts_with("libc.so."))
        })
        .find_map(|p| Some(p.parent()?.file_name()?.to_string_lossy().into_owned()))
        .expect("this process's C library in /proc/self/maps")
}

/// Where Debian's `plugstack.conf` includes `*.conf` from.
pub const PLUGSTACK_DIR: &str = "/etc/slurm/plugstack.conf.d";
/// The plugstack line the postinst writes and the prerm deletes.
pub const PLUGSTACK: &str = "/etc/slurm/plugstack.conf.d/mpi-observer.conf";
/// How long one dpkg run may take.
pub const DPKG_LIMIT: Duration = Duration::from_secs(180);

/// Where `cargo xtask package` writes the package, in cargo's target
/// directory: one name whatever the version.
pub const DEB: &str = "debian/mpi-observer.deb";

/// The package `cargo xtask package` built (`cargo xtask test` builds it
/// before the end-to-end tests).
pub fn deb() -> PathBuf {
    let p = target_dir().join(DEB);
    assert!(
        p.is_file(),
        "{} is missing: run `cargo xtask package` first",
        p.display()
    );
    p
}

/// Runs dpkg (stdin closed: a question is a failure, not a hang) and
/// asserts it succeeded.
pub fn dpkg(args: &[&str]) -> Output {
    let o = run_with_timeout(
        Command::new("dpkg").args(args).stdin(Stdio::null()),
        DPKG_LIMIT,
    );
    assert!(
        o.status.success(),
        "dpkg {args:?} failed ({}):\n{}{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    o
}

/// dpkg's state of the package: "installed", "config-files", or "" when it
/// is unknown (purged or never installed).
pub fn status() -> String {
    let o = Command::new("dpkg-query")
        .args(["-W", "-f=${db:Status-Status}", PKG])
        .output()
        .expect("dpkg-query");
    String::from_utf8_lossy(&o.stdout).trim().to_string()
}

/// `dpkg --purge mpi-observer`, whatever its state, ignoring failure.
pub fn purge() {
    let _ = run_with_timeout(
        Command::new("dpkg")
            .args(["--purge", PKG])
            .stdin(Stdio::null()),
        DPKG_LIMIT,
    );
}

/// The package installed from `deb`; purged when dropped, so a failed test
/// leaves no install behind. A stale install is purged first.
pub struct Installed;

impl Installed {
    /// Installs `deb` (purging a stale install first).
    pub fn new(deb: &Path) -> Installed {
        if !status().is_empty() {
            purge();
        }
        let guard = Installed;
        dpkg(&["--install", deb.to_str().unwrap()]);
        assert_eq!(status(), "installed");
        guard
    }
}

impl Drop for Installed {
    fn drop(&mut self) {
        purge();
    }
}

/// `/usr/bin/mpi-observer ARGS`' stdout, asserting success.
pub fn installed_output(args: &[&str]) -> String {
    let o = run_with_timeout(Command::new(BIN).args(args), Duration::from_secs(30));
    assert!(
        o.status.success(),
        "{BIN} {args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8(o.stdout).unwrap().trim().to_string()
}

/// The installed unit's `KEY=` value.
pub fn unit_value(unit: &str, key: &str) -> String {
    unit.lines()
        .find_map(|l| l.strip_prefix(&format!("{key}=")))
        .unwrap_or_else(|| panic!("the installed unit has no {key}="))
        .to_string()
}

/// A script that runs the installed unit's ExecStart as systemd would:
/// EnvironmentFile= read, `%d` (the credentials directory) replaced by a
/// directory holding a web config without TLS or passwords (so the test
/// scrapes plain HTTP), `$MPI_OBSERVER_OPTS` split at spaces. The harness
/// calls it as `SCRIPT attach ARGS`: the ExecStart has its own `attach`.
pub fn unit_launcher(dir: &Path) -> PathBuf {
    let creds = dir.join("credentials");
    std::fs::create_dir_all(&creds).unwrap();
    std::fs::write(
        creds.join("web-config.yml"),
        "http_server_config:\n  headers:\n    X-Content-Type-Options: nosniff\n",
    )
    .unwrap();
    launcher(dir, &creds)
}

/// As [`unit_launcher`], but `%d` holds what the unit's `LoadCredential=`
/// lines load, copied now as systemd copies them at start (each
/// `NAME:PATH` to `%d/NAME`, mode 0400): the site's web config,
/// certificate and key from /etc/mpi-observer/, so the daemon serves what
/// the installed unit serves, HTTPS with basic authentication. Panics
/// when a file is missing or not a regular file, as the unit would fail to
/// start.
pub fn unit_launcher_with_credentials(dir: &Path) -> PathBuf {
    use std::os::unix::fs::PermissionsExt as _;
    let unit = std::fs::read_to_string(UNIT).unwrap();
    let creds = dir.join("credentials");
    let _ = std::fs::remove_dir_all(&creds);
    std::fs::create_dir_all(&creds).unwrap();
    std::fs::set_permissions(&creds, std::fs::Permissions::from_mode(0o700)).unwrap();
    let mut loaded = 0;
    for l in unit.lines() {
        let Some(v) = l.strip_prefix("LoadCredential=") else {
            continue;
        };
        let (name, src) = v
            .split_once(':')
            .unwrap_or_else(|| panic!("LoadCredential={v}: no NAME:PATH"));
        let md = std::fs::symlink_metadata(src).unwrap_or_else(|e| {
            panic!("{src} (the unit's LoadCredential={v}): {e}: install the site's files first")
        });
        assert!(md.is_file(), "{src}: not a regular file");
        let to = creds.join(name);
        std::fs::copy(src, &to).unwrap();
        std::fs::set_permissions(&to, std::fs::Permissions::from_mode(0o400)).unwrap();
        loaded += 1;
    }
    assert!(loaded > 0, "the installed unit has no LoadCredential=");
    launcher(dir, &creds)
}

/// `dir/exec-start.sh`: the installed unit's ExecStart with `%d` = `creds`.
fn launcher(dir: &Path, creds: &Path) -> PathBuf {
    let unit = std::fs::read_to_string(UNIT).unwrap();
    assert_eq!(unit_value(&unit, "EnvironmentFile"), DEFAULTS);
    let exec = unit_value(&unit, "ExecStart");
    assert!(
        exec.starts_with(&format!("{BIN} attach ")) && exec.ends_with(" $MPI_OBSERVER_OPTS"),
        "ExecStart: {exec}"
    );
    let script = dir.join("exec-start.sh");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\nset -a\n. {DEFAULTS}\nset +a\nshift\nexec {} \"$@\"\n",
            exec.replace("%d", creds.to_str().unwrap())
        ),
    )
    .unwrap();
    let o = Command::new("chmod")
        .arg("755")
        .arg(&script)
        .status()
        .unwrap();
    assert!(o.success());
    script
}
