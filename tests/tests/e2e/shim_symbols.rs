//! The shim presents exactly the MPI library's function set (issue 8): a
//! procedure the library lacks looks absent to weak references and to
//! `dlsym`, as without the shim, on every MPI stack we support. The probe
//! program (`tests/programs/shim/weak.c`) prints one line per name; it runs
//! bare, under a plain `LD_PRELOAD` of what `mpi-observer shim-path`
//! prints, and under `mpi-observer run --tools stats`, and the lines must
//! be identical. The same probes also run from a shared library the program
//! links with `-z now` (relocated before the shim, so its weak references
//! are bound before the shim hides anything), also with `LD_BIND_NOW=1`.

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

    // The probes in a library loaded at start-up.
    let lib = dir.join("libweakprobe.so");
    compile(
        mpi,
        &program("shim/weak.c"),
        &lib,
        &["-shared", "-fPIC", "-DAS_LIBRARY", "-ldl", "-Wl,-z,now"],
    );
    let main = dir.join("weakmain");
    let rpath = format!("-Wl,-rpath,{}", dir.display());
    let libdir = format!("-L{}", dir.display());
    compile(
        mpi,
        &program("shim/weakmain.c"),
        &main,
        &[&libdir, "-lweakprobe", &rpath],
    );
    let lib_bare = probes(mpi, &[], &main);
    assert_eq!(lib_bare, bare, "the library's probes bare");
    let lib_preloaded = probes(mpi, &["env", &preload], &main);
    assert_eq!(lib_preloaded, bare, "the library's probes under the shim");
    let bind_now = probes(mpi, &["env", "LD_BIND_NOW=1", &preload], &main);
    assert_eq!(bind_now, bare, "the library's probes, LD_BIND_NOW=1");
}

e2e::per_mpi!(same_function_set => same_function_set: openmpi, mpich, openmpi5, mpich5, mpich5_abi);

/// A program without MPI loads, as Python loads a module (`RTLD_NOW`), a
/// plugin that links the MPI library: the library arrives inside that
/// `dlopen`, whose eager bindings cannot see the shim's names yet. The
/// plugin's calls must still be layered: `v` prints the stack at the first
/// call that reaches the shim.
fn plugin_calls_are_layered(mpi: Mpi) {
    if !require(&[Need::Mpi(mpi), Need::Command("cc")]) {
        return;
    }
    let dir = scratch(&format!("shim-plugin-{}", mpi.name()));
    let plugin = dir.join("libplugin.so");
    compile(
        mpi,
        &program("shim/plugin.c"),
        &plugin,
        &["-shared", "-fPIC", "-Wl,-z,now"],
    );
    let main = dir.join("dlmain");
    let o = Command::new("cc")
        .args(["-O2", "-o"])
        .arg(&main)
        .arg(program("shim/dlmain.c"))
        .arg("-ldl")
        .output()
        .expect("cc");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let shim_path = Command::new(observer_bin())
        .arg("shim-path")
        .output()
        .expect("mpi-observer shim-path");
    let preload = format!(
        "LD_PRELOAD={}",
        String::from_utf8(shim_path.stdout).unwrap().trim()
    );
    let mut c = mpi.launcher(1);
    c.args(["env", &preload, "MPI_TOOLS_ENTRY=v"])
        .arg(&main)
        .arg(&plugin);
    let o = run_with_timeout(&mut c, Duration::from_secs(120));
    let (out, err) = (
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr),
    );
    assert!(
        o.status.success() && out.contains("done 0 of 1"),
        "{}: {}\n{out}\n{err}",
        mpi.name(),
        o.status
    );
    assert!(
        err.contains("layers (top first"),
        "{}: the plugin's MPI calls bypassed the shim:\n{err}",
        mpi.name()
    );
}

e2e::per_mpi!(plugin_calls_are_layered => plugin_calls_are_layered: openmpi, mpich, openmpi5, mpich5, mpich5_abi);
