//! Booting one guest with virtme-ng (`vng`) and watching it: its console
//! (the kernel's lines, on vng's stderr, kept in `console.log`), the live
//! stream of the command (vng's stdout, kept in `live.log`), and the
//! deadlines that tell a hung guest from a slow one.
//!
//! KVM: on this project's machines `/dev/kvm` is PVM (`kvm_pvm`, nested
//! virtualization without VMX/SVM), which boots only kernels built as PVM
//! guests; Debian's hang before their first console line (docs/vm.md has
//! what was tried). So KVM is tried first only where `/dev/kvm` opens, and
//! it must show the kernel's first console line within [`KVM_FIRST_LINE`];
//! otherwise the guest is stopped and booted again under TCG.

use std::{
    ffi::OsString,
    fs,
    io::{BufRead as _, BufReader, Read, Write as _},
    os::unix::process::CommandExt as _,
    path::{Path, PathBuf},
    process::{Child, Command, ExitStatus, Stdio},
    sync::{Arc, Mutex, mpsc},
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};

use super::kernels::Arch;

/// How the guest's CPU runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Accel {
    /// Hardware virtualization through `/dev/kvm`.
    Kvm,
    /// QEMU's translator: slow, works everywhere.
    Tcg,
}

impl Accel {
    /// Its name in the one line that says which was used.
    pub fn name(self) -> &'static str {
        match self {
            Accel::Kvm => "KVM",
            Accel::Tcg => "TCG",
        }
    }
}

/// Under KVM a kernel prints its first line within a second of QEMU's
/// start; vng first builds an initramfs (a few seconds, more on a loaded
/// machine). Past this, KVM is taken as not working.
pub const KVM_FIRST_LINE: Duration = Duration::from_secs(45);

/// Under TCG on a loaded two-core machine the first kernel line came after
/// about 10 s; a guest silent this long is broken, not slow.
const TCG_FIRST_LINE: Duration = Duration::from_secs(300);

/// Guest memory (virtme-ng's `--memory`) and CPUs.
pub const MEMORY: &str = "4G";
/// Two vCPUs: MPI jobs of two ranks, as on the host.
pub const CPUS: u32 = 2;

/// One boot.
#[derive(Debug)]
pub struct Boot<'a> {
    /// `vng` in its venv.
    pub vng: &'a Path,
    /// The kernel image (its modules are beside it).
    pub vmlinuz: &'a Path,
    /// The guest's architecture.
    pub arch: Arch,
    /// KVM or TCG.
    pub accel: Accel,
    /// Shared with the guest, writable (the same path on both sides).
    pub run_dir: &'a Path,
    /// Host directories the guest may write into an overlay of its own
    /// (the writes stay in the guest).
    pub overlays: &'a [PathBuf],
    /// Mounted read-only over the guest's `/etc/udev/rules.d`
    /// (`cache::udev_rules`).
    pub udev_rules: &'a Path,
    /// The guest's working directory (the checkout).
    pub cwd: &'a Path,
    /// The script the guest runs (`guest.rs`), inside `run_dir`.
    pub script: &'a Path,
    /// The guest's root file system when it is not this machine's (an
    /// arm64 guest's, `root.rs`): the checkout is then mounted read-only
    /// at its own path, and `overlays` must be empty (the guest script
    /// lays them, after the mounts).
    pub root: Option<&'a Path>,
}

/// vng's arguments for `b`.
pub fn vng_args(b: &Boot) -> Vec<OsString> {
    let mut a: Vec<OsString> = Vec::new();
    let mut push = |s: &str| a.push(s.into());
    push("--run");
    push(&b.vmlinuz.display().to_string());
    // Debian's kernels build virtio and 9p as modules: they must come in an
    // initramfs.
    push("--force-initramfs");
    // virtiofsd from Debian 12's QEMU does not take vng's options; vng
    // would wait for it, then fall back to 9p anyway.
    push("--force-9p");
    // The kernel's console on stderr: the watchdog reads it.
    push("--verbose");
    push("--memory");
    push(MEMORY);
    push("--cpus");
    push(&CPUS.to_string());
    if b.arch != Arch::X86_64 {
        push("--arch");
        push(b.arch.vng());
    }
    if b.arch == Arch::Arm64 {
        // vng's default Cortex-A57 has no 16 KiB translation granule: the
        // -arm64-16k kernel never printed a line on it. QEMU's `max` has
        // every granule (and the Armv8.x features of today's server
        // cores); its pointer authentication with QEMU's own cheap
        // algorithm, not the architected one, which is slow to emulate.
        // QEMU takes the last -cpu.
        push("--qemu-opt=-cpu");
        push("--qemu-opt=max,pauth-impdef=on");
    }
    if b.accel == Accel::Tcg {
        push("--disable-kvm");
    }
    if let Some(root) = b.root {
        // Its own busybox: vng's check for a static one rejects another
        // instruction set's.
        push("--root");
        push(&root.display().to_string());
        push("--busybox");
        push(&root.join("bin/busybox").display().to_string());
        // Host paths, at the same path in the guest (vng's short form
        // takes them relative to the root).
        for (dir, mode) in [(b.run_dir, "rwdir"), (b.cwd, "rodir")] {
            let d = dir.display();
            push(&format!("--{mode}={d}={d}"));
        }
    } else {
        push(&format!("--rwdir={}", b.run_dir.display()));
    }
    push(&format!(
        "--rodir=/etc/udev/rules.d={}",
        b.udev_rules.display()
    ));
    for o in b.overlays {
        push(&format!("--overlay-rwdir={}", o.display()));
    }
    // vng takes --cwd only inside the root; the script changes into it.
    if b.root.is_none() {
        push("--cwd");
        push(&b.cwd.display().to_string());
    }
    push("--exec");
    push(&format!(
        "bash {}",
        super::guest::quote(&b.script.display().to_string())
    ));
    a
}

/// Whether `line` (from the serial console) is the kernel's: `[    0.000000] …`.
/// The firmware and the kernel's real-mode setup print on the same port
/// before it ("SeaBIOS …", "Probing EDD …"), and do so under PVM too.
pub fn is_kernel_line(line: &str) -> bool {
    let Some(rest) = line.trim_start_matches(['\r', '\u{1b}']).strip_prefix('[') else {
        return false;
    };
    let Some((stamp, _)) = rest.split_once(']') else {
        return false;
    };
    let stamp = stamp.trim_start();
    let Some((s, us)) = stamp.split_once('.') else {
        return false;
    };
    !s.is_empty()
        && s.bytes().all(|c| c.is_ascii_digit())
        && us.len() == 6
        && us.bytes().all(|c| c.is_ascii_digit())
}

/// How a boot ended.
#[derive(Debug)]
pub enum Ended {
    /// vng exited by itself.
    Exited {
        /// Its status (the guest script's, when it ran).
        status: ExitStatus,
        /// From spawn to the kernel's first console line, if one came.
        first_line: Option<Duration>,
        /// From spawn to the guest's command starting, if it did.
        started: Option<Duration>,
    },
    /// No kernel line in time: the guest was stopped.
    NoFirstLine(Duration),
    /// The whole run took longer than allowed: the guest was stopped.
    TimedOut(Duration),
}

enum Event {
    FirstLine,
    Started,
}

/// Boots `b`, forwards the live stream to stderr if `live` (each line
/// after `prefix`), and waits for the guest to end, at most `limit`.
pub fn run(b: &Boot, live: Option<&str>, limit: Duration) -> Result<Ended> {
    let console = b.run_dir.join("console.log");
    let live_log = b.run_dir.join("live.log");
    let mut cmd = Command::new(b.vng);
    cmd.args(vng_args(b))
        .current_dir(b.cwd)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        // vng runs virtme-run from its venv by name.
        .env("PATH", vng_path(b.vng))
        // A group of its own, so that stopping it stops QEMU too.
        .process_group(0);
    let start = Instant::now();
    let mut child = cmd
        .spawn()
        .with_context(|| format!("starting {}", b.vng.display()))?;
    let (tx, rx) = mpsc::channel();
    let err = child.stderr.take().expect("piped");
    let out = child.stdout.take().expect("piped");
    let console_file = fs::File::create(&console)?;
    let live_sink = Arc::new(Live {
        log: Mutex::new(fs::File::create(&live_log)?),
        prefix: live.map(str::to_string),
        start: Instant::now(),
    });
    let tx2 = tx.clone();
    let sink = Arc::clone(&live_sink);
    let watcher = thread::spawn(move || watch_console(err, console_file, &tx2, &sink));
    let streamer = thread::spawn(move || {
        for line in BufReader::new(out).split(b'\n') {
            let Ok(line) = line else { break };
            live_sink.line(&line);
        }
    });
    drop(tx);
    let first_limit = match b.accel {
        Accel::Kvm => KVM_FIRST_LINE,
        Accel::Tcg => TCG_FIRST_LINE,
    };
    let (mut first_line, mut started) = (None, None);
    let ended = loop {
        match rx.recv_timeout(Duration::from_millis(200)) {
            Ok(Event::FirstLine) => first_line = Some(start.elapsed()),
            Ok(Event::Started) => started = Some(start.elapsed()),
            Err(_) => {}
        }
        if let Some(status) = child.try_wait()? {
            break Ended::Exited {
                status,
                first_line,
                started,
            };
        }
        let t = start.elapsed();
        if first_line.is_none() && t > first_limit {
            stop(&mut child);
            break Ended::NoFirstLine(t);
        }
        if t > limit {
            stop(&mut child);
            break Ended::TimedOut(t);
        }
    };
    // The pipes close with QEMU; a stray holder cannot keep us here.
    let _ = watcher.join();
    let _ = streamer.join();
    Ok(ended)
}

/// The host's PATH with the system directories a root shell has, so that
/// the guest finds `ip`, `useradd`, `mpirun.openmpi` and our tools.
pub fn guest_path() -> String {
    let host = std::env::var("PATH").unwrap_or_default();
    let mut dirs: Vec<&str> = host.split(':').filter(|d| !d.is_empty()).collect();
    for d in [
        "/usr/local/sbin",
        "/usr/local/bin",
        "/usr/sbin",
        "/usr/bin",
        "/sbin",
        "/bin",
    ] {
        if !dirs.contains(&d) {
            dirs.push(d);
        }
    }
    dirs.join(":")
}

/// PATH for vng: its venv's `bin` first, then [`guest_path`].
fn vng_path(vng: &Path) -> String {
    match vng.parent() {
        Some(bin) => format!("{}:{}", bin.display(), guest_path()),
        None => guest_path(),
    }
}

/// Stops vng's whole group: TERM (QEMU exits, vng cleans its files up),
/// then KILL if anything is left after five seconds.
fn stop(child: &mut Child) {
    let group = format!("-{}", child.id());
    let _ = Command::new("kill").args(["-TERM", "--", &group]).status();
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(5) {
        if child.try_wait().ok().flatten().is_some() {
            break;
        }
        thread::sleep(Duration::from_millis(100));
    }
    let _ = Command::new("kill").args(["-KILL", "--", &group]).status();
    let _ = child.wait();
}

/// The command's live stream: `live.log`, and stderr after a prefix and
/// the seconds since the boot began (what each test costs CI) when asked.
/// Lines come from vng's stdout (the named virtio port) or, without udev
/// to name the ports, from the console.
struct Live {
    log: Mutex<fs::File>,
    prefix: Option<String>,
    start: Instant,
}

impl Live {
    fn line(&self, line: &[u8]) {
        if let Ok(mut log) = self.log.lock() {
            let _ = log.write_all(line);
            let _ = log.write_all(b"\n");
        }
        if let Some(p) = &self.prefix {
            let mut e = std::io::stderr().lock();
            let _ = e.write_all(p.as_bytes());
            let _ = write!(e, "{:4.0} s| ", self.start.elapsed().as_secs_f64());
            let _ = e.write_all(line);
            let _ = e.write_all(b"\n");
        }
    }
}

fn watch_console(err: impl Read, mut log: fs::File, tx: &mpsc::Sender<Event>, live: &Live) {
    let (mut first, mut started) = (true, false);
    for line in BufReader::new(err).split(b'\n') {
        let Ok(line) = line else { break };
        let _ = log.write_all(&line);
        let _ = log.write_all(b"\n");
        let text = String::from_utf8_lossy(&line);
        let kernel = is_kernel_line(&text);
        if first && kernel {
            first = false;
            let _ = tx.send(Event::FirstLine);
        }
        if started && !kernel {
            live.line(line.strip_suffix(b"\r").unwrap_or(&line));
        }
        // virtme-ng's init, just before it runs our script: its Rust
        // binary, or on an arm64 root its shell script (`virtme-init:
        // starting script (console fallback)`).
        if text.contains("virtme-ng-init: starting script")
            || text.contains("virtme-init: starting script")
        {
            started = true;
            let _ = tx.send(Event::Started);
        }
    }
}

/// Whether `/dev/kvm` opens for reading and writing: without that, KVM is
/// not worth a try.
pub fn kvm_opens() -> bool {
    fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/kvm")
        .is_ok()
}

/// The last `n` lines of `path`, for an error message.
pub fn tail(path: &Path, n: usize) -> String {
    let text = fs::read(path).unwrap_or_default();
    let text = String::from_utf8_lossy(&text);
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// Fails unless `ended` is a guest that booted and exited (its script may
/// still have failed: `output.rs` tells), with what the console showed last.
pub fn require_exited(ended: &Ended, run_dir: &Path) -> Result<()> {
    let console = run_dir.join("console.log");
    match ended {
        Ended::Exited {
            first_line: None,
            status,
            ..
        } => bail!(
            "vng exited ({status}) before the kernel printed anything; it said:\n{}",
            tail(&console, 20)
        ),
        Ended::Exited { .. } => Ok(()),
        Ended::NoFirstLine(t) => bail!(
            "the guest printed no kernel line in {:.0} s; its console ends:\n{}",
            t.as_secs_f64(),
            tail(&console, 20)
        ),
        Ended::TimedOut(t) => bail!(
            "the guest was stopped after {:.0} s (the run's time limit); the command's live output ends:\n{}\n\
             and the console:\n{}",
            t.as_secs_f64(),
            tail(&run_dir.join("live.log"), 40),
            tail(&console, 20)
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_lines_are_told_from_the_firmware() {
        assert!(is_kernel_line(
            "[    0.000000] Linux version 6.1.0-50-amd64 (debian-kernel@lists.debian.org)"
        ));
        assert!(is_kernel_line("[12345.123456] x"));
        assert!(is_kernel_line(
            "\r[    1.500000] virtme-ng-init: starting script"
        ));
        for not in [
            "SeaBIOS (version 1.16.2-debian-1.16.2-1)",
            "Probing EDD (edd=off to disable)... ok",
            "Booting from ROM...",
            "[ 1.5] short",
            "[    x.000000] y",
            "[] empty",
            "",
        ] {
            assert!(!is_kernel_line(not), "{not:?}");
        }
    }

    fn boot<'a>(accel: Accel, arch: Arch, overlays: &'a [PathBuf]) -> Boot<'a> {
        Boot {
            vng: Path::new("/c/venv/bin/vng"),
            vmlinuz: Path::new("/c/kernels/amd64/6.1/boot/vmlinuz-6.1.0-50-amd64"),
            arch,
            accel,
            run_dir: Path::new("/c/runs/1"),
            overlays,
            udev_rules: Path::new("/c/udev/rules.d"),
            cwd: Path::new("/work/wt/vm"),
            script: Path::new("/c/runs/1/guest.sh"),
            root: None,
        }
    }

    #[test]
    fn a_root_of_its_own_brings_its_busybox_and_the_checkout_by_path() {
        let mut b = boot(Accel::Tcg, Arch::Arm64, &[]);
        b.root = Some(Path::new("/c/root-arm64"));
        let a: Vec<String> = vng_args(&b)
            .into_iter()
            .map(|x| x.into_string().unwrap())
            .collect();
        let after = |k: &str| &a[a.iter().position(|x| x == k).unwrap() + 1];
        assert_eq!(after("--root"), "/c/root-arm64");
        assert_eq!(after("--busybox"), "/c/root-arm64/bin/busybox");
        assert!(
            a.contains(&"--rwdir=/c/runs/1=/c/runs/1".to_string()),
            "{a:?}"
        );
        assert!(
            a.contains(&"--rodir=/work/wt/vm=/work/wt/vm".to_string()),
            "{a:?}"
        );
        assert!(!a.contains(&"--cwd".to_string()), "{a:?}");
    }

    #[test]
    fn tcg_disables_kvm_and_kvm_does_not() {
        let o = [PathBuf::from("/work/wt/vm/target")];
        let s = |a: Vec<OsString>| -> Vec<String> {
            a.into_iter().map(|x| x.into_string().unwrap()).collect()
        };
        let tcg = s(vng_args(&boot(Accel::Tcg, Arch::X86_64, &o)));
        let kvm = s(vng_args(&boot(Accel::Kvm, Arch::X86_64, &o)));
        assert!(tcg.contains(&"--disable-kvm".to_string()));
        assert!(!kvm.contains(&"--disable-kvm".to_string()));
        for a in [&tcg, &kvm] {
            assert_eq!(
                a[..2],
                ["--run", "/c/kernels/amd64/6.1/boot/vmlinuz-6.1.0-50-amd64"]
            );
            assert!(a.contains(&"--force-initramfs".to_string()));
            assert!(a.contains(&"--rwdir=/c/runs/1".to_string()));
            assert!(a.contains(&"--rodir=/etc/udev/rules.d=/c/udev/rules.d".to_string()));
            assert!(a.contains(&"--overlay-rwdir=/work/wt/vm/target".to_string()));
            assert!(!a.contains(&"--arch".to_string()));
            assert_eq!(a[a.len() - 2..], ["--exec", "bash /c/runs/1/guest.sh"]);
        }
        let arm = s(vng_args(&boot(Accel::Tcg, Arch::Arm64, &o)));
        let i = arm.iter().position(|x| x == "--arch").unwrap();
        assert_eq!(arm[i + 1], "arm64");
        let i = arm.iter().position(|x| x == "--qemu-opt=-cpu").unwrap();
        assert_eq!(arm[i + 1], "--qemu-opt=max,pauth-impdef=on");
        assert!(!tcg.iter().any(|x| x.starts_with("--qemu-opt")));
    }

    #[test]
    fn the_guest_path_keeps_the_hosts_order_and_adds_the_system_directories() {
        let p = guest_path();
        assert!(p.contains("/usr/sbin") && p.contains("/sbin"), "{p}");
        assert!(!p.contains("::") && !p.starts_with(':'), "{p}");
    }
}
