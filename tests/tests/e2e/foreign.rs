//! A process whose MPI library is another machine's code (an arm64 rank run
//! by qemu-user through binfmt_misc on this x86-64 node): the daemon must
//! not put this machine's breakpoints into it. `--pid` refuses it in one
//! line and a non-zero exit; `--all` says so once and leaves it alone; the
//! process runs to its end with every call answered.
#![cfg(target_arch = "x86_64")]

use std::{
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use e2e::{
    Daemon, Need, observer_bin, program, require, run_with_timeout, target_dir, workspace_root,
};

const CC: &str = "aarch64-linux-gnu-gcc";
const QEMU: &str = "qemu-aarch64-static";

fn cc(args: &[&str]) {
    let o = Command::new(CC).args(args).output().expect(CC);
    assert!(
        o.status.success(),
        "{CC} {args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
}

#[test]
fn an_emulated_rank_of_another_instruction_set_is_left_alone() {
    if !require(&[Need::Root, Need::Command(CC), Need::Command(QEMU)]) {
        return;
    }
    let dir = target_dir().join(format!("foreign-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let d = |f: &str| dir.join(f).display().to_string();
    let fake = workspace_root().join("xtask/qemu/fake_mpi.c");
    cc(&[
        "-O2",
        "-shared",
        "-fPIC",
        "-Wl,-soname,libmpi.so.40",
        "-o",
        &d("libmpi.so.40"),
        fake.to_str().unwrap(),
    ]);
    std::os::unix::fs::symlink("libmpi.so.40", dir.join("libmpi.so")).unwrap();
    let src = program("foreign/loop.c");
    cc(&[
        "-O2",
        "-o",
        &d("loop"),
        src.to_str().unwrap(),
        &format!("-L{}", dir.display()),
        &format!("-Wl,-rpath,{}", dir.display()),
        "-lmpi",
    ]);
    let rank = Command::new(QEMU)
        .args(["-L", "/usr/aarch64-linux-gnu"])
        .arg(dir.join("loop"))
        .arg("8")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = rank.id();
    // Its libmpi mapped.
    let start = Instant::now();
    while !std::fs::read_to_string(format!("/proc/{pid}/maps"))
        .unwrap_or_default()
        .contains("libmpi.so.40")
    {
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "the emulated rank maps no libmpi"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let refusal = "is aarch64 code, and this machine is x86_64";
    // --pid: one line, exit non-zero.
    let o = run_with_timeout(
        Command::new(observer_bin()).args([
            "attach",
            "--pid",
            &pid.to_string(),
            "--listen",
            "127.0.0.1:0",
        ]),
        Duration::from_secs(20),
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "{err}");
    assert!(err.contains(refusal), "{err}");
    assert_eq!(err.lines().count(), 1, "one line: {err}");
    // --all: said once, no rank of it.
    let mut daemon = Daemon::start(&["--all".into()]);
    let start = Instant::now();
    while !daemon.log().iter().any(|l| l.contains(refusal)) {
        assert!(
            start.elapsed() < Duration::from_secs(15),
            "--all never said why it left pid {pid} alone: {:?}",
            daemon.log()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let (_, s) = daemon.scrape();
    let p = pid.to_string();
    assert!(
        !s.iter().any(|x| x.label("pid") == Some(p.as_str())),
        "pid {pid} has series"
    );
    // Unharmed: every call answered, to its end.
    let out = e2e::wait_with_timeout(rank, Duration::from_secs(30));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let sends: u64 = stdout
        .lines()
        .find_map(|l| l.strip_prefix("app: sends="))
        .and_then(|r| r.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{stdout}"));
    assert!(sends > 100, "{stdout}");
    assert!(stdout.contains(" failed=0"), "{stdout}");
    assert!(
        stdout.contains(&format!("send={sends} finalize=1")),
        "{stdout}"
    );
    let said = daemon.log().iter().filter(|l| l.contains(refusal)).count();
    assert_eq!(said, 1, "{:?}", daemon.log());
    let _ = std::fs::remove_dir_all(&dir);
}
