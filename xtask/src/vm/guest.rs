//! The script the guest runs as root: it readies what our tests need, runs
//! the command, and hands its output back whole.
//!
//! Output: the command writes into files on the guest's own tmpfs, where
//! appends from many processes are exact (appends to a shared 9p file can
//! overwrite each other). `tee` also streams both to virtme-ng's stdout
//! port, for progress only. When the command is done the script copies the
//! files into the shared run directory, one writer and one copy each, and
//! writes the status last: a run directory with a status holds complete
//! output (`output.rs` reads it).

use std::{fmt::Write as _, path::Path};

/// File names in the run directory; `output.rs` reads the same.
pub const STDOUT: &str = "stdout";
/// The command's standard error.
pub const STDERR: &str = "stderr";
/// The command's exit status, written last, as a decimal number.
pub const STATUS: &str = "status";
/// The guest kernel's log at the end.
pub const DMESG: &str = "dmesg";
/// The guest script itself.
pub const SCRIPT: &str = "guest.sh";

/// What to run in the guest.
#[derive(Debug)]
pub struct Run<'a> {
    /// The shared run directory (the same path on both sides).
    pub out: &'a Path,
    /// The working directory: the checkout.
    pub cwd: &'a Path,
    /// Exported before the command runs.
    pub env: &'a [(String, String)],
    /// The command and its arguments.
    pub command: &'a [String],
    /// This xtask binary, run first as `guest-hold-perf-key` (`steady.rs`).
    pub holder: Option<&'a Path>,
    /// Directories the script lays a writable overlay over (on the
    /// guest's tmpfs, so writes stay in the guest): with a root of the
    /// guest's own, vng's overlays come before its mounts and would be
    /// hidden by the checkout's.
    pub overlays: &'a [std::path::PathBuf],
}

/// `s` as one word for bash, in single quotes.
pub fn quote(s: &str) -> String {
    if !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_./=:,+@%".contains(&b))
    {
        return s.to_string();
    }
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// Whether `k` may be exported as written (a shell variable name).
pub fn valid_name(k: &str) -> bool {
    let mut b = k.bytes();
    b.next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == b'_')
        && b.all(|c| c.is_ascii_alphanumeric() || c == b'_')
}

/// The script for `run`; panics on an environment name bash cannot export
/// (the caller checks them first, see `mod.rs`).
pub fn script(run: &Run) -> String {
    let out = quote(&run.out.display().to_string());
    let mut s = String::new();
    s.push_str(PRELUDE);
    let _ = writeln!(s, "out={out}");
    for (k, v) in run.env {
        assert!(valid_name(k), "environment name {k:?}");
        let _ = writeln!(s, "export {k}={}", quote(v));
    }
    for (i, d) in run.overlays.iter().enumerate() {
        let d = quote(&d.display().to_string());
        let _ = writeln!(
            s,
            "mkdir -p /run/vm-overlay/{i}/u /run/vm-overlay/{i}/w {d} && mount -t overlay overlay -o lowerdir={d},upperdir=/run/vm-overlay/{i}/u,workdir=/run/vm-overlay/{i}/w {d} || exit 125"
        );
    }
    let _ = writeln!(
        s,
        "cd {} || exit 125",
        quote(&run.cwd.display().to_string())
    );
    if let Some(h) = run.holder {
        let _ = writeln!(s, "holder={}", quote(&h.display().to_string()));
        s.push_str("cpu_dir=/sys/devices/system/cpu\n");
        s.push_str(HOLD);
    }
    let words: Vec<String> = run.command.iter().map(|w| quote(w)).collect();
    let _ = writeln!(s, "set -- {}", words.join(" "));
    s.push_str(RUN);
    s
}

/// Before the command: what virtme-ng's init does not set up, or sets up in
/// a way our tests cannot use.
const PRELUDE: &str = r#"#!/bin/bash
# Written by `cargo xtask vm` (xtask/src/vm/guest.rs); runs as root in the guest.
set -u
# The eBPF daemon pins under /sys/fs/bpf; probes need tracefs.
mountpoint -q /sys/fs/bpf || mount -t bpf bpf /sys/fs/bpf
mountpoint -q /sys/kernel/tracing || mount -t tracefs tracefs /sys/kernel/tracing
mountpoint -q /sys/kernel/debug || mount -t debugfs debugfs /sys/kernel/debug
# virtme-ng binds a copy over /etc/shadow; useradd replaces the file by a
# rename, which a mount point refuses. Under it is /etc's overlay: writable.
mountpoint -q /etc/shadow && umount /etc/shadow
ip link set lo up
export HOME=/root LANG=C.UTF-8
work=$(mktemp -d /run/vm-out.XXXXXX) || exit 125
"#;

/// Keeps the perf_sched_events static key enabled, so that the kernel does
/// not patch `__schedule` at each attach under TCG (`steady.rs`). That one
/// flip is made with every other CPU offline: a vCPU that is offline runs
/// no stale translation of `__schedule` (the holder's own flip killed a
/// 6.12 guest, issue 34). Failing either is said, not fatal: it only
/// narrows an emulator's race.
const HOLD: &str = r#"offline=
stuck=
for c in "$cpu_dir"/cpu[0-9]*/online; do
    [ "$(cat "$c" 2>/dev/null)" = 1 ] || continue
    if echo 0 2>/dev/null > "$c"; then offline="$offline $c"; else stuck="$stuck ${c%/online}"; fi
done
held=
read -r held < <("$holder" guest-hold-perf-key 2>&1)
for c in $offline; do
    echo 1 > "$c" || echo "vm: could not bring ${c%/online} back online"
done
if [ "$held" != held ]; then
    echo "vm: could not hold the perf_sched_events key enabled (${held:-no answer}): the guest may die in a TCG static-key race (xtask/src/vm/steady.rs)"
elif [ -n "$stuck" ]; then
    echo "vm: could not take$stuck offline to enable the perf_sched_events key: the guest may die in a TCG static-key race (xtask/src/vm/steady.rs)"
fi
"#;

/// The command, its output into `$work`, then copied out whole.
const RUN: &str = r#"echo "vm: guest $(uname -r) up after $(cut -d' ' -f1 /proc/uptime) s, running: $*"
mkfifo "$work/o" "$work/e"
tee "$work/stdout" < "$work/o" & t1=$!
tee "$work/stderr" < "$work/e" & t2=$!
"$@" > "$work/o" 2> "$work/e" < /dev/null
status=$?
# A process the command left behind may hold the pipes open: give the tees
# ten seconds, then stop them (what they read is in the files already).
for _ in $(seq 100); do
    kill -0 "$t1" 2>/dev/null || kill -0 "$t2" 2>/dev/null || break
    sleep 0.1
done
kill "$t1" "$t2" 2>/dev/null
wait "$t1" "$t2" 2>/dev/null
dmesg > "$work/dmesg" 2>&1
for f in stdout stderr dmesg; do
    cp "$work/$f" "$out/$f.partial" && mv "$out/$f.partial" "$out/$f"
done
echo "$status" > "$out/status.partial" && mv "$out/status.partial" "$out/status"
sync
exit "$status"
"#;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoting_keeps_every_byte_as_one_word() {
        assert_eq!(quote("plain-word_1.2/x=y"), "plain-word_1.2/x=y");
        assert_eq!(quote(""), "''");
        assert_eq!(quote("a b"), "'a b'");
        assert_eq!(quote("it's"), r"'it'\''s'");
        assert_eq!(quote("$(reboot)"), "'$(reboot)'");
        assert_eq!(quote("a\nb"), "'a\nb'");
    }

    #[test]
    fn quoted_words_come_back_unchanged_from_bash() {
        let words = ["a b", "it's", "$HOME", "`id`", "x\ny", "*", "", "--flag=1"];
        let line: Vec<String> = words.iter().map(|w| quote(w)).collect();
        let o = std::process::Command::new("bash")
            .args(["-c", &format!("printf '%s\\0' {}", line.join(" "))])
            .output()
            .unwrap();
        let got: Vec<&str> = std::str::from_utf8(&o.stdout)
            .unwrap()
            .split_terminator('\0')
            .collect();
        assert_eq!(got, words);
    }

    #[test]
    fn the_script_exports_changes_directory_and_runs_the_command() {
        let env = [("CI".to_string(), "true".to_string())];
        let cmd = [
            "target/release/deps/e2e-1".to_string(),
            "shim::".to_string(),
        ];
        let s = script(&Run {
            out: Path::new("/root/.cache/x/runs/1"),
            cwd: Path::new("/work/wt/vm"),
            env: &env,
            command: &cmd,
            holder: Some(Path::new("/w/target/debug/xtask")),
            overlays: &[],
        });
        assert!(s.starts_with("#!/bin/bash\n"), "{s}");
        assert!(s.contains("\nholder=/w/target/debug/xtask\n"), "{s}");
        assert!(s.find("guest-hold-perf-key").unwrap() < s.find("\nset -- ").unwrap());
        assert!(s.contains("\nout=/root/.cache/x/runs/1\n"), "{s}");
        assert!(s.contains("\nexport CI=true\n"), "{s}");
        assert!(s.contains("\ncd /work/wt/vm || exit 125\n"), "{s}");
        assert!(
            s.contains("\nset -- target/release/deps/e2e-1 shim::\n"),
            "{s}"
        );
        // The status is written after the output it vouches for.
        let status = s.find("status.partial").unwrap();
        assert!(s.find("$f.partial").unwrap() < status, "{s}");
    }

    /// The hold step says when it failed, and only then, and goes on.
    #[test]
    fn a_holder_that_fails_is_said_and_the_script_goes_on() {
        let dir = std::env::temp_dir().join(format!("xtask-hold-{}", std::process::id()));
        // A CPU directory of our own: cpu0 (no online file, as on x86),
        // cpu1 online, cpu2 offline.
        let cpus = dir.join("cpu");
        for c in ["cpu0", "cpu1", "cpu2"] {
            std::fs::create_dir_all(cpus.join(c)).unwrap();
        }
        std::fs::write(cpus.join("cpu1/online"), "1\n").unwrap();
        std::fs::write(cpus.join("cpu2/online"), "0\n").unwrap();
        let run = |holder: &str| {
            let o = std::process::Command::new("bash")
                .args([
                    "-c",
                    &format!(
                        "set -u\nholder={holder}\ncpu_dir={}\n{HOLD}echo next",
                        cpus.display()
                    ),
                ])
                .output()
                .unwrap();
            String::from_utf8(o.stdout).unwrap()
        };
        let online = |c: &str| std::fs::read_to_string(cpus.join(c).join("online")).unwrap();
        // The holder sees every other CPU offline, and says what it saw.
        let ok = dir.join("ok");
        std::fs::write(
            &ok,
            format!(
                "#!/bin/sh\ncat {}/cpu1/online > {}/seen\necho held\n",
                cpus.display(),
                dir.display()
            ),
        )
        .unwrap();
        let bad = dir.join("bad");
        std::fs::write(
            &bad,
            "#!/bin/sh\necho 'Error: perf_event_open: EACCES' >&2\nexit 1\n",
        )
        .unwrap();
        for f in [&ok, &bad] {
            std::process::Command::new("chmod")
                .arg("+x")
                .arg(f)
                .status()
                .unwrap();
        }
        assert_eq!(run(&ok.display().to_string()), "next\n");
        assert_eq!(std::fs::read_to_string(dir.join("seen")).unwrap(), "0\n");
        assert_eq!(
            (online("cpu1"), online("cpu2")),
            ("1\n".into(), "0\n".into())
        );
        let said = run(&bad.display().to_string());
        assert_eq!(online("cpu1"), "1\n");
        assert!(
            said.starts_with("vm: could not hold the perf_sched_events key enabled (Error: perf_event_open: EACCES)")
                && said.ends_with("\nnext\n"),
            "{said}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn names_bash_cannot_export_are_refused() {
        assert!(valid_name("CI") && valid_name("_X1"));
        assert!(!valid_name("1X") && !valid_name("A-B") && !valid_name("") && !valid_name("A B"));
    }
}
