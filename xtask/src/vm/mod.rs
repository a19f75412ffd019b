//! `cargo xtask vm`: runs a command as root inside a QEMU guest booted on
//! one of Debian's own kernels (issue 35; arm64 for issue 36), with this
//! machine's root file system read-only under writable overlays, and hands
//! back its output whole and its exit status. [`run_suite`] runs the e2e
//! tests there the same way.
//!
//! One job per file: `kernels` (the pins), `cache` (what is kept between
//! runs, and getting it), `guest` (the script the guest runs), `boot` (vng,
//! its console, the deadlines, KVM or TCG), `output` (reading back what the
//! guest handed over). docs/vm.md says how to use it and what it costs.

pub mod boot;
pub mod cache;
pub mod foreign;
pub mod guest;
pub mod kernels;
pub mod output;
pub mod root;
pub mod steady;
pub mod wheels;

use std::{
    fs,
    io::Write as _,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail, ensure};

use self::{
    boot::{Accel, Boot, Ended},
    kernels::{Arch, Kernel},
    output::Outcome,
};
use crate::{setup::target_dir, workspace_root};

/// How to pick the accelerator.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum AccelChoice {
    /// KVM if `/dev/kvm` opens and the guest shows its first console line
    /// in time, TCG otherwise.
    Auto,
    /// KVM only: fail if it does not boot.
    Kvm,
    /// TCG only.
    Tcg,
}

/// `cargo xtask vm`'s arguments.
#[derive(Debug, clap::Args)]
pub struct VmArgs {
    /// The kernel: 5.10 (bullseye), 6.1 (bookworm), 6.12 (bookworm-backports);
    /// arm64 also 6.12-16k.
    #[arg(long)]
    pub kernel: String,
    /// The guest's architecture.
    #[arg(long, value_enum, default_value_t = Arch::X86_64)]
    pub arch: Arch,
    /// KVM or TCG.
    #[arg(long, value_enum, default_value_t = AccelChoice::Auto)]
    pub accel: AccelChoice,
    /// Stop the guest after this many seconds.
    #[arg(long, default_value_t = 3600)]
    pub timeout: u64,
    /// Do not stream the command's output while it runs (it is printed
    /// whole at the end either way).
    #[arg(long)]
    pub quiet: bool,
    /// Also set NAME=VALUE in the guest (CI, RUST_BACKTRACE and PATH are
    /// passed on from here).
    #[arg(long = "env", short = 'e', value_name = "NAME=VALUE")]
    pub env: Vec<String>,
    /// Only fetch and unpack what the kernel needs (and an arm64 guest's
    /// root); boot nothing.
    #[arg(long)]
    pub prepare: bool,
    /// Instead of a command: run the e2e tests whose names contain FILTER
    /// (the test executable built here, `--test-threads=1`, `CI=true`), and
    /// fail unless some ran and all passed.
    #[arg(long, value_name = "FILTER", conflicts_with = "command")]
    pub e2e: Option<String>,
    /// The command and its arguments, run as root in the checkout.
    #[arg(last = true)]
    pub command: Vec<String>,
}

/// What [`run`] needs.
#[derive(Debug)]
pub struct Options {
    /// The pinned kernel.
    pub kernel: &'static Kernel,
    /// KVM or TCG.
    pub accel: AccelChoice,
    /// The whole run's limit, boot included.
    pub timeout: Duration,
    /// Stream the live output to stderr.
    pub live: bool,
    /// Exported in the guest, after the defaults.
    pub env: Vec<(String, String)>,
}

/// `cargo xtask vm`: prints the command's stdout and stderr whole and
/// exits with its status.
pub fn cli(a: VmArgs) -> Result<()> {
    let kernel = kernels::find(&a.kernel, a.arch)?;
    if a.prepare {
        let (k, _) = cache::prepare(kernel)?;
        if kernel.arch == Arch::Arm64 {
            println!("{}", root::prepare(kernel, &k.vmlinuz)?.display());
        }
        println!("{}", k.vmlinuz.display());
        return Ok(());
    }
    if let Some(filter) = &a.e2e {
        let env = a
            .env
            .iter()
            .map(|e| parse_env(e))
            .collect::<Result<Vec<_>>>()?;
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        let filters: Vec<&str> = filter.split_whitespace().collect();
        return run_suite(&a.kernel, a.arch, &filters, &env);
    }
    ensure!(
        !a.command.is_empty(),
        "no command: give one after `--`, e.g. `cargo xtask vm --kernel {} -- uname -r`",
        a.kernel
    );
    let env = a
        .env
        .iter()
        .map(|e| parse_env(e))
        .collect::<Result<Vec<_>>>()?;
    let o = run(
        &Options {
            kernel,
            accel: a.accel,
            timeout: Duration::from_secs(a.timeout),
            live: !a.quiet,
            env,
        },
        &a.command,
    )?;
    std::io::stdout().write_all(&o.stdout)?;
    std::io::stdout().flush()?;
    std::io::stderr().write_all(&o.stderr)?;
    std::process::exit(o.status)
}

/// `NAME=VALUE`, or one line saying what is wrong with it.
fn parse_env(e: &str) -> Result<(String, String)> {
    match e.split_once('=') {
        Some((k, v)) if guest::valid_name(k) => Ok((k.to_string(), v.to_string())),
        _ => bail!("--env {e:?}: expected NAME=VALUE with NAME a shell variable name"),
    }
}

/// The host variables the guest gets too, when set.
const PASSED_ON: &[&str] = &["CI", "RUST_BACKTRACE", "RUST_LOG", "CARGO_TARGET_DIR"];

/// Set once KVM failed to bring a guest to its first console line in this
/// process: the next guests of the run go to TCG at once, instead of
/// waiting out KVM's first-line timeout again (45 s a kernel where KVM
/// hangs, as on this project's machines).
static KVM_HANGS: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Boots `o.kernel`, runs `command` in it as root in the checkout, and
/// returns what it did. The guest's own failures (no boot, a hang, a
/// panic) are errors; the command's failure is the outcome's status.
pub fn run(o: &Options, command: &[String]) -> Result<Outcome> {
    let k = o.kernel;
    let (unpacked, vng) = cache::prepare(k)?;
    // An arm64 guest boots a root of its own (root.rs), with the kernel's
    // modules inside it, where vng looks for them.
    let root = match k.arch {
        Arch::X86_64 => None,
        Arch::Arm64 => Some(root::prepare(k, &unpacked.vmlinuz)?),
    };
    let run_dir = new_run_dir(k)?;
    let cwd = workspace_root();
    if let Some(root) = &root {
        for d in [&run_dir, &cwd, Path::new("/etc/udev/rules.d")] {
            let m = root.join(d.strip_prefix("/").unwrap_or(d));
            fs::create_dir_all(&m).with_context(|| format!("creating {}", m.display()))?;
        }
    }
    let mut env: Vec<(String, String)> = vec![("PATH".into(), boot::guest_path())];
    for name in PASSED_ON {
        if let Ok(v) = std::env::var(name) {
            env.push(((*name).to_string(), v));
        }
    }
    env.extend(o.env.iter().cloned());
    // The checkout's target directory takes the tests' scratch files and
    // logs: an overlay, so that they stay in the guest, with exact appends.
    let overlays = [target_dir()];
    let (vng_overlays, script_overlays): (&[PathBuf], &[PathBuf]) = match root {
        None => (&overlays, &[]),
        Some(_) => (&[], &overlays),
    };
    let script = run_dir.join(guest::SCRIPT);
    // The holder is this machine's xtask: it runs in a guest of its own
    // instruction set only.
    let holder = std::env::current_exe().ok();
    fs::write(
        &script,
        guest::script(&guest::Run {
            out: &run_dir,
            cwd: &cwd,
            env: &env,
            command,
            holder: holder.as_deref().filter(|_| root.is_none()),
            overlays: script_overlays,
        }),
    )?;
    let live = o.live.then(|| format!("[vm {}] ", k.name));
    let start = Instant::now();
    let mut boot = Boot {
        vng: &vng,
        vmlinuz: &unpacked.vmlinuz,
        arch: k.arch,
        accel: Accel::Tcg,
        run_dir: &run_dir,
        overlays: vng_overlays,
        udev_rules: &unpacked.udev_rules,
        cwd: &cwd,
        script: &script,
        root: root.as_deref(),
    };
    let try_kvm = match o.accel {
        AccelChoice::Tcg => false,
        AccelChoice::Kvm => true,
        // KVM runs a guest of the host's own instruction set only.
        AccelChoice::Auto => {
            boot::kvm_opens()
                && cfg!(target_arch = "x86_64")
                && k.arch == Arch::X86_64
                && !KVM_HANGS.load(std::sync::atomic::Ordering::Relaxed)
        }
    };
    let mut ended = None;
    if try_kvm {
        boot.accel = Accel::Kvm;
        let e = boot::run(&boot, live.as_deref(), o.timeout)?;
        match &e {
            Ended::Exited {
                first_line: None, ..
            }
            | Ended::NoFirstLine(_)
                if o.accel == AccelChoice::Auto =>
            {
                KVM_HANGS.store(true, std::sync::atomic::Ordering::Relaxed);
                eprintln!(
                    "vm: KVM did not bring {} to its first console line ({}): using TCG, for the rest of this run too",
                    k.package,
                    match &e {
                        Ended::NoFirstLine(t) => format!("none in {:.0} s", t.as_secs_f64()),
                        _ => format!(
                            "QEMU exited: {}",
                            boot::tail(&run_dir.join("console.log"), 1).trim()
                        ),
                    }
                );
                boot.accel = Accel::Tcg;
            }
            _ => ended = Some(e),
        }
    }
    let ended = match ended {
        Some(e) => e,
        None => {
            let left = o.timeout.saturating_sub(start.elapsed());
            boot::run(&boot, live.as_deref(), left)?
        }
    };
    if let Err(e) = boot::require_exited(&ended, &run_dir) {
        return Err(e.context(format!(
            "{} under {} (run directory kept: {})",
            k.package,
            boot.accel.name(),
            run_dir.display()
        )));
    }
    if let Ended::Exited {
        first_line,
        started,
        ..
    } = &ended
    {
        eprintln!(
            "vm: {} under {}: first console line after {}, command started after {}, all done after {:.0} s",
            k.package,
            boot.accel.name(),
            secs(*first_line),
            secs(*started),
            start.elapsed().as_secs_f64()
        );
    }
    let vng_status = match &ended {
        Ended::Exited { status, .. } => status.to_string(),
        _ => String::new(),
    };
    let outcome = output::read(&run_dir).with_context(|| {
        format!(
            "{} under {} (vng: {vng_status}): the guest's console ends:\n{}\n(run directory kept: {})",
            k.package,
            boot.accel.name(),
            boot::tail(&run_dir.join("console.log"), 30),
            run_dir.display()
        )
    })?;
    if std::env::var_os("MPI_OBSERVER_VM_KEEP").is_some() {
        eprintln!("vm: run directory kept: {}", run_dir.display());
    } else {
        fs::remove_dir_all(&run_dir).with_context(|| format!("removing {}", run_dir.display()))?;
    }
    Ok(outcome)
}

fn secs(d: Option<Duration>) -> String {
    d.map_or_else(|| "-".to_string(), |d| format!("{:.0} s", d.as_secs_f64()))
}

/// A fresh directory shared with the guest, in the cache (the checkout's
/// target directory is an overlay in the guest, so the guest's writes
/// there never reach the host).
fn new_run_dir(k: &Kernel) -> Result<PathBuf> {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    let d = cache::dir().join("runs").join(format!(
        "{}-{}-{}-{}",
        k.arch.deb(),
        k.name,
        std::process::id(),
        t.as_millis()
    ));
    fs::create_dir_all(&d).with_context(|| format!("creating {}", d.display()))?;
    Ok(d)
}

/// Boots `kernel` once and runs the e2e tests matching `filter` in it
/// (`--test-threads=1`, `CI=true`: a missing prerequisite fails), from the
/// test executable built here. Fails with the guest's whole output when
/// anything fails, and when no test matched: a run that ran nothing proves
/// nothing.
pub fn run_suite(kernel: &str, arch: Arch, filters: &[&str], env: &[(&str, &str)]) -> Result<()> {
    let k = kernels::find(kernel, arch)?;
    let mut guest_env = vec![("CI".to_string(), "true".to_string())];
    if arch == Arch::Arm64 {
        // The arm64 daemon, shim and stubs the tests run in the guest,
        // found under CARGO_TARGET_DIR: the cross build's.
        foreign::arm64_sysroot()?;
        foreign::cross_build()?;
        // PyPI's aarch64 Open MPI 5, MPICH 5 and mpi4py, for mpi4py's suite.
        wheels::mpi4py_stacks()?;
        guest_env.push((
            "CARGO_TARGET_DIR".to_string(),
            target_dir()
                .join(crate::setup::AARCH64)
                .display()
                .to_string(),
        ));
    }
    let exe = e2e_executable(arch)?;
    let mut command = vec![exe.display().to_string()];
    command.extend(filters.iter().map(|f| f.to_string()));
    command.push("--test-threads=1".to_string());
    guest_env.extend(env.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    let filter = filters.join(" ");
    let o = run(
        &Options {
            kernel: k,
            accel: AccelChoice::Auto,
            timeout: Duration::from_secs(3600),
            live: true,
            env: guest_env,
        },
        &command,
    )?;
    let stdout = String::from_utf8_lossy(&o.stdout);
    let counts = output::libtest_counts(&stdout);
    let failed = o.status != 0 || !matches!(counts, Some((p, 0)) if p > 0);
    if failed {
        let mut e = std::io::stderr().lock();
        let _ = writeln!(e, "vm: the guest's whole output follows");
        let _ = e.write_all(&o.stdout);
        let _ = e.write_all(&o.stderr);
        bail!(
            "e2e `{filter}` in {} ({}): exit status {}, {}\n{}",
            k.package,
            arch,
            o.status,
            match counts {
                Some((p, f)) => format!("{p} passed, {f} failed"),
                None => "no libtest summary".to_string(),
            },
            crate::test_log::digest(&stdout)
        );
    }
    let (p, _) = counts.unwrap_or_default();
    println!("vm: e2e `{filter}` in {}: {p} passed, 0 failed", k.package);
    Ok(())
}

/// The e2e test executable for `arch`, built now if it is not (cargo
/// says where); arm64's by the cross toolchain.
fn e2e_executable(arch: Arch) -> Result<PathBuf> {
    let mut c = crate::cargo();
    c.args([
        "test",
        "--release",
        "-p",
        "e2e",
        "--test",
        "e2e",
        "--no-run",
        "--message-format=json-render-diagnostics",
    ]);
    if arch == Arch::Arm64 {
        c.args(["--target", crate::setup::AARCH64]);
        foreign::cross_env(&mut c);
    }
    let o = c
        .stderr(std::process::Stdio::inherit())
        .output()
        .context("running cargo test --no-run")?;
    ensure!(o.status.success(), "building the e2e tests failed");
    executable_from(&String::from_utf8_lossy(&o.stdout))
        .context("cargo named no executable for the e2e test target")
}

/// The `executable` of the e2e test target in cargo's JSON messages.
fn executable_from(messages: &str) -> Option<PathBuf> {
    messages.lines().rev().find_map(|l| {
        let v: serde_json::Value = serde_json::from_str(l).ok()?;
        (v["reason"] == "compiler-artifact"
            && v["target"]["name"] == "e2e"
            && v["profile"]["test"] == true)
            .then(|| v["executable"].as_str().map(PathBuf::from))
            .flatten()
    })
}

#[cfg(test)]
mod tests {
    use clap::Parser as _;

    use super::*;

    #[derive(clap::Parser)]
    struct T {
        #[command(flatten)]
        vm: VmArgs,
    }

    #[test]
    fn the_command_is_everything_after_the_double_dash() {
        let t = T::try_parse_from([
            "x", "--kernel", "6.1", "-e", "A=b c", "--", "sh", "-c", "exit 3",
        ])
        .unwrap();
        assert_eq!(t.vm.kernel, "6.1");
        assert_eq!(t.vm.arch, Arch::X86_64);
        assert_eq!(t.vm.accel, AccelChoice::Auto);
        assert_eq!(t.vm.env, ["A=b c"]);
        assert_eq!(t.vm.command, ["sh", "-c", "exit 3"]);
    }

    #[test]
    fn arch_and_accel_take_their_names() {
        let t = T::try_parse_from([
            "x", "--kernel", "6.12-16k", "--arch", "arm64", "--accel", "tcg", "--", "true",
        ])
        .unwrap();
        assert_eq!(t.vm.arch, Arch::Arm64);
        assert_eq!(t.vm.accel, AccelChoice::Tcg);
        assert!(T::try_parse_from(["x", "--kernel", "6.1", "--arch", "i386"]).is_err());
        assert!(
            T::try_parse_from(["x", "--", "true"]).is_err(),
            "--kernel is required"
        );
    }

    #[test]
    fn env_needs_a_name_and_an_equals_sign() {
        assert_eq!(parse_env("A=1=2").unwrap(), ("A".into(), "1=2".into()));
        assert_eq!(parse_env("A=").unwrap(), ("A".into(), String::new()));
        for bad in ["A", "=1", "1A=x", "A B=x"] {
            let e = parse_env(bad).unwrap_err().to_string();
            assert!(e.contains("NAME=VALUE"), "{e}");
        }
    }

    #[test]
    fn the_e2e_executable_is_found_among_cargos_messages() {
        let m = r#"{"reason":"compiler-artifact","target":{"name":"e2e","kind":["lib"]},"profile":{"test":false},"executable":null}
{"reason":"compiler-artifact","target":{"name":"e2e","kind":["test"]},"profile":{"test":true},"executable":"/w/target/release/deps/e2e-0123"}
{"reason":"build-finished","success":true}"#;
        assert_eq!(
            executable_from(m),
            Some(PathBuf::from("/w/target/release/deps/e2e-0123"))
        );
        assert_eq!(executable_from("{\"reason\":\"build-finished\"}"), None);
    }
}
