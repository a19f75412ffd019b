//! Building QMPI tools with `mpi-observer qmpi-flags` on every MPI of the
//! matrix (issue 25): a tool written for MPICH's `mpi.h` compiles unchanged
//! with `-Wall -Werror` against `mpi_observer_qmpi.h`, as a shared library
//! and compiled into a program; its build marker names the MPI it was built
//! for; and a program linked with it runs WITHOUT the shim: the stub
//! library (or MPICH's own stubs) refuses registration, and the job is
//! unharmed.

use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
    time::Duration,
};

use e2e::{Mpi, Need, qmpi_flags, require, run_with_timeout, scratch, target_dir};

/// A QMPI tool as written for MPICH: `#include <mpi.h>` only. Declaring its
/// function with `QMPI_Send_t` makes the compiler check the header's typedef
/// against the definition.
const TOOL_C: &str = r#"#include <mpi.h>
#include <stddef.h>

static int sends;

static QMPI_Send_t count_send;

static int count_send(QMPI_Context context, int tool_id, const void *buf, int count,
                      MPI_Datatype datatype, int dest, int tag, MPI_Comm comm)
{
    void (*next_fn)(void) = NULL;
    int next_id = 0;
    int *storage = NULL;
    QMPI_Get_tool_storage(context, tool_id, (void **)&storage);
    if (storage)
        (*storage)++;
    QMPI_Get_function(tool_id, MPI_SEND_T, &next_fn, &next_id);
    return ((QMPI_Send_t *)next_fn)(context, next_id, buf, count, datatype, dest, tag, comm);
}

static void init(int tool_id)
{
    QMPI_Register_tool_storage(tool_id, &sends);
    QMPI_Register_function(tool_id, MPI_SEND_T, (void (*)(void))count_send);
}

int tool_register(void)
{
    return QMPI_Register_tool_name("qhdr_counter", init);
}
"#;

/// The program: registers through the tool and directly, prints the
/// results and the build marker, and runs a real MPI job.
const MAIN_C: &str = r#"#include <mpi.h>
#include <stdio.h>

int tool_register(void);

static void direct_init(int tool_id)
{
    (void)tool_id;
}

int main(int argc, char **argv)
{
    int rank, size, sum = 0, one = 1;
    int by_tool = tool_register();
    int direct = QMPI_Register_tool_name("qhdr_direct", direct_init);
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    MPI_Allreduce(&one, &sum, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    printf("rank=%d built_for=%s by_tool=%d direct=%d sum=%d\n", rank,
           mpi_observer_qmpi_built_for, by_tool, direct, sum);
    MPI_Finalize();
    return 0;
}
"#;

/// What `mpi_observer_qmpi_built_for` says under each MPI's `mpicc`.
fn built_for(mpi: Mpi) -> &'static str {
    match mpi {
        Mpi::OpenMpi | Mpi::OpenMpi5 => "Open MPI",
        Mpi::Mpich => "MPICH 4.0.2",
        Mpi::Mpich5 => "MPICH 5.0.2",
        Mpi::Mpich5Abi => "MPI ABI",
    }
}

/// `mpicc -Wall -Werror $(mpi-observer qmpi-flags) ARGS`, which must build
/// without a single diagnostic.
fn mpicc(mpi: Mpi, dir: &Path, flags: &[String], args: &[&str]) {
    let cc = mpi.mpicc();
    let o = Command::new(&cc)
        .current_dir(dir)
        .args(["-O2", "-Wall", "-Werror"])
        .args(flags)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("running {cc}: {e}"));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{cc} {args:?} failed:\n{err}");
    assert!(err.trim().is_empty(), "{cc} {args:?} warned:\n{err}");
}

/// The string the dynamic symbol `mpi_observer_qmpi_built_for` of `lib`
/// holds, as the shim reads it from a tool that registers.
fn marker_of(lib: &Path) -> String {
    use object::{Object as _, ObjectSection as _, ObjectSymbol as _};
    let data = fs::read(lib).unwrap();
    let file = object::File::parse(&*data).unwrap();
    let sym = file
        .dynamic_symbols()
        .find(|s| s.name() == Ok("mpi_observer_qmpi_built_for") && !s.is_undefined())
        .unwrap_or_else(|| panic!("{} exports no mpi_observer_qmpi_built_for", lib.display()));
    let section = file
        .section_by_index(sym.section_index().expect("in a section"))
        .unwrap();
    let bytes = section
        .data_range(sym.address(), sym.size())
        .unwrap()
        .expect("the marker's bytes");
    String::from_utf8(bytes.split(|b| *b == 0).next().unwrap().to_vec()).unwrap()
}

/// Runs `app` as a one-rank job, without the shim; its output line.
fn run_bare(mpi: Mpi, app: &Path) -> String {
    let mut c = mpi.launcher(1);
    c.arg(app)
        .env_remove("LD_PRELOAD")
        .env_remove("MPI_TOOLS_ENTRY");
    let o = run_with_timeout(&mut c, Duration::from_secs(60));
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(
        o.status.success(),
        "{} exited {}:\n{out}\n{}",
        app.display(),
        o.status,
        String::from_utf8_lossy(&o.stderr)
    );
    out.lines()
        .find(|l| l.starts_with("rank="))
        .unwrap_or_else(|| panic!("no result line:\n{out}"))
        .to_string()
}

fn builds_and_runs_without_the_shim(mpi: Mpi) {
    if !require(&[Need::Mpi(mpi)]) {
        return;
    }
    let stubs = target_dir().join("release/libmpi_observer_qmpi.so");
    assert!(
        stubs.is_file(),
        "{} is missing: run `cargo xtask build` first",
        stubs.display()
    );
    let flags = qmpi_flags();
    let dir: PathBuf = scratch(&format!("qmpi-header-{}", mpi.name()));
    fs::write(dir.join("tool.c"), TOOL_C).unwrap();
    fs::write(dir.join("main.c"), MAIN_C).unwrap();

    // The documented use: a tool as a shared library.
    mpicc(
        mpi,
        &dir,
        &flags,
        &["tool.c", "-shared", "-fPIC", "-o", "libtool.so"],
    );
    assert_eq!(marker_of(&dir.join("libtool.so")), built_for(mpi));
    // A program linked with it, and one with the tool compiled in (two files
    // including the header: the weak marker must not clash).
    let rpath = format!("-Wl,-rpath,{}", dir.display());
    mpicc(
        mpi,
        &dir,
        &flags,
        &["main.c", "-L.", "-ltool", &rpath, "-o", "app"],
    );
    mpicc(mpi, &dir, &flags, &["main.c", "tool.c", "-o", "app_in"]);

    // Without the shim nothing implements QMPI: registration fails (52 is
    // libmpi_observer_qmpi.so's answer; MPICH's own stubs may answer first
    // there) and the job runs as without a tool.
    for app in ["app", "app_in"] {
        let line = run_bare(mpi, &dir.join(app));
        let field = |k: &str| {
            line.split_whitespace()
                .find_map(|w| w.strip_prefix(k))
                .unwrap_or_else(|| panic!("no {k} in {line}"))
                .to_string()
        };
        assert!(
            line.contains(&format!("built_for={} by_tool=", built_for(mpi))),
            "{app}: {line}"
        );
        assert_eq!(field("sum="), "1", "{app}: the job ran: {line}");
        for k in ["by_tool=", "direct="] {
            let rc: i32 = field(k).parse().unwrap();
            if matches!(mpi, Mpi::Mpich | Mpi::Mpich5) {
                assert_ne!(rc, 0, "{app}: {k} registration must fail: {line}");
            } else {
                assert_eq!(rc, 52, "{app}: {k} the stub library answers: {line}");
            }
        }
    }
}

e2e::per_mpi!(qmpi_tool_builds => builds_and_runs_without_the_shim:
    openmpi, mpich, openmpi5, mpich5, mpich5_abi);
