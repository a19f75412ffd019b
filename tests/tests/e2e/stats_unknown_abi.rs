//! The `stats` layer meets an MPI library whose ABI it cannot read (a
//! stand-in library, `tests/programs/stats/fakempi.c`, that is none of Open
//! MPI, MPICH, Intel MPI or the MPI-5 standard ABI): it must pass every call
//! through, print one line saying why, and never crash.

use std::{path::PathBuf, process::Command, time::Duration};

use e2e::{Need, program, require, run_with_timeout, scratch, target_dir};

fn cc(args: &[&str], out: &PathBuf, src: &str) {
    let o = Command::new("cc")
        .args(["-O2", "-o"])
        .arg(out)
        .arg(program(src))
        .args(args)
        .output()
        .expect("cc");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
}

#[test]
fn stats_passes_an_unknown_abi_through_with_one_line() {
    if !require(&[Need::Command("cc")]) {
        return;
    }
    let dir = scratch("stats-unknown-abi");
    let lib = dir.join("libfakempi.so");
    cc(&["-shared", "-fPIC"], &lib, "stats/fakempi.c");
    let app = dir.join("fakeapp");
    let libdir = format!("-L{}", dir.display());
    let rpath = format!("-Wl,-rpath,{}", dir.display());
    cc(&[&libdir, "-lfakempi", &rpath], &app, "stats/fakeapp.c");
    let shim = target_dir().join("release/libmpi_observer_shim.so");
    assert!(shim.exists(), "run `cargo xtask build` first");

    let bare = run_with_timeout(&mut Command::new(&app), Duration::from_secs(30));
    assert!(bare.status.success());
    assert_eq!(String::from_utf8_lossy(&bare.stdout), "fake sends=3\n");

    let o = run_with_timeout(
        Command::new(&app)
            .env("LD_PRELOAD", &shim)
            .env("MPI_TOOLS_ENTRY", "stats"),
        Duration::from_secs(30),
    );
    let (out, err) = (
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr),
    );
    assert!(o.status.success(), "{}\n{out}\n{err}", o.status);
    assert_eq!(out, "fake sends=3\n", "every call reaches the library once");
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 1, "one line:\n{err}");
    assert!(
        lines[0].starts_with("mpi-observer-shim: stats: ")
            && lines[0].contains("unrecognised MPI library")
            && lines[0].contains("passes calls through"),
        "{err}"
    );
}
