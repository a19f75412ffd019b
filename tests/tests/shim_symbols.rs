//! The shim presents exactly the MPI library's function set (issue 8): a
//! procedure the library lacks looks absent to weak references and to
//! `dlsym`, as without the shim, on every MPI stack we support. The probe
//! program (`tests/programs/shim/weak.c`) prints one line per name; it runs
//! bare, under a plain `LD_PRELOAD` of what `mpi-observer shim-path`
//! prints, and under `mpi-observer run --tools stats`, and the lines must
//! be identical.

use std::{process::Command, time::Duration};

use e2e::{Mpi, Need, compile, observer_bin, program, require, run_with_timeout, scratch};

fn probes(mpi: Mpi, wrap: &[&str], exe: &std::path::Path) -> Vec<String> {
    let mut c = mpi.launcher(1);
    c.args(wrap).arg(exe);
    let o = run_with_timeout(&mut c, Duration::from_secs(120));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success() && out.lines().any(|l| l == "done"),
        "{} {wrap:?} failed ({}):\n{out}\n{}",
        mpi.name(),
        o.status,
        String::from_utf8_lossy(&o.stderr)
    );
    out.lines()
        .filter(|l| l.starts_with("PROBE "))
        .map(str::to_string)
        .collect()
}

fn same_function_set(mpi: Mpi) {
    if !require(&[Need::Mpi(mpi)]) {
        return;
    }
    let dir = scratch(&format!("shim-symbols-{}", mpi.name()));
    let exe = dir.join("weak");
    compile(mpi, &program("shim/weak.c"), &exe, &["-ldl"]);
    let shim_path = Command::new(observer_bin())
        .arg("shim-path")
        .output()
        .expect("mpi-observer shim-path");
    let shim_path = String::from_utf8(shim_path.stdout).unwrap();
    let preload = format!("LD_PRELOAD={}", shim_path.trim());
    let observer = observer_bin();
    let observer = observer.to_str().unwrap();

    let bare = probes(mpi, &[], &exe);
    assert_eq!(bare.len(), 11, "{bare:?}");
    // The probe must be able to fail: some name is absent in every library
    // (a C program loads no Fortran bindings), and MPI_Send never is.
    assert!(
        bare.iter().any(|l| l.contains("weak=null dlsym=absent")),
        "{bare:?}"
    );
    assert!(
        bare.iter()
            .any(|l| l == "PROBE MPI_Send weak=present dlsym=present"),
        "{bare:?}"
    );
    let preloaded = probes(mpi, &["env", &preload], &exe);
    assert_eq!(preloaded, bare, "plain LD_PRELOAD of the shim");
    let run = probes(mpi, &[observer, "run", "--tools", "stats", "--"], &exe);
    assert_eq!(run, bare, "mpi-observer run --tools stats");
}

#[test]
fn same_function_set_open_mpi() {
    same_function_set(Mpi::OpenMpi);
}

#[test]
fn same_function_set_mpich() {
    same_function_set(Mpi::Mpich);
}
