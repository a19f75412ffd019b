//! Every first-instruction class, measured: a test program with one tiny
//! function per class (`bench_sites`, per instruction set), timed with and
//! without an entry uprobe on each; then every probe site of both
//! libraries checked against the measured class of its first instruction.

use std::{
    fmt::Write as _,
    fs,
    path::Path,
    process::{Command, Stdio},
    thread,
};

use anyhow::{Context as _, Result, bail};

use super::{Paths, REPS, SETTLE, library_file, sites};
use crate::{
    bench_common::{Mpi, first_line, lines, median, reap, wait_line},
    bench_sites::{self, SET},
    setup::run_cmd,
};

const INSN_BATCHES: u32 = 9;
const INSN_CALLS: u32 = 1000;

/// One run of the instruction-class program, with or without an entry
/// uprobe (bpftrace) on every `f_*`. Returns CPU ns/call per function.
fn run(bin: &Path, dir: &Path, probed: bool) -> Result<Vec<(String, f64)>> {
    let go = dir.join("go-insns");
    let _ = fs::remove_file(&go);
    let mut prog = Command::new(bin)
        .arg(&go)
        .args([INSN_BATCHES.to_string(), INSN_CALLS.to_string()])
        .stdout(Stdio::piped())
        .spawn()?;
    let out = lines(prog.stdout.take().context("stdout")?);
    let (ready, _) = wait_line(&out, "ready pid=", "insns")?;
    let pid = ready.trim_start_matches("ready pid=").trim().to_string();
    let mut tool = None;
    if probed {
        let script = format!(
            "BEGIN {{ printf(\"attached\\n\"); }} uprobe:{}:f_* {{ @[probe] = count(); }}",
            bin.display()
        );
        let mut b = Command::new("bpftrace")
            .args(["-p", &pid, "-e", &script])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()?;
        let o = lines(b.stdout.take().context("stdout")?);
        wait_line(&o, "attached", "bpftrace")?;
        tool = Some((b, o));
    }
    thread::sleep(SETTLE);
    fs::write(&go, "")?;
    let (_, results) = wait_line(&out, "done", "insns")?;
    reap(&mut prog, "insns")?;
    let _ = fs::remove_file(&go);
    if let Some((mut b, o)) = tool {
        reap(&mut b, "bpftrace")?;
        let counted: Vec<u64> = o
            .try_iter()
            .filter(|l| l.starts_with("@[uprobe:"))
            .filter_map(|l| l.rsplit(' ').next()?.parse().ok())
            .collect();
        let expected = u64::from(INSN_BATCHES * INSN_CALLS);
        if counted.len() != SET.classes.len() || counted.iter().any(|n| *n < expected) {
            bail!(
                "bpftrace counts {counted:?}, expected {} x >= {expected}",
                SET.classes.len()
            );
        }
    }
    results
        .iter()
        .filter_map(|l| {
            let (k, v) = l.split_once('=')?;
            Some((k.to_string(), v.parse().ok()?))
        })
        .map(Ok)
        .collect()
}

pub(super) fn section(
    root: &Path,
    libs: &[(Mpi, &Paths)],
    report: &mut String,
    disagreements: &mut Vec<String>,
) -> Result<()> {
    let dir = root.join("target/bench-observer");
    let bin = dir.join("insns");
    run_cmd(
        Command::new("cc")
            .args(["-O2", "-o"])
            .arg(&bin)
            .arg(root.join(SET.program)),
    )?;
    let mut none: Vec<(String, f64)> = Vec::new();
    let mut probed: Vec<(String, f64)> = Vec::new();
    for rep in 0..REPS {
        for k in 0..2 {
            if (k + rep) % 2 == 0 {
                none.extend(run(&bin, &dir, false)?);
            } else {
                probed.extend(run(&bin, &dir, true)?);
            }
        }
    }
    let med = |v: &[(String, f64)], f: &str| {
        median(
            &v.iter()
                .filter(|(k, _)| k == f)
                .map(|(_, x)| *x)
                .collect::<Vec<_>>(),
        )
    };
    let added: Vec<f64> = SET
        .classes
        .iter()
        .map(|c| med(&probed, c.func) - med(&none, c.func))
        .collect();
    // The first class is one every kernel emulates (`SET.reference`);
    // everything much dearer than it is being single-stepped.
    let reference = added[0];
    let stepped: Vec<bool> = added.iter().map(|a| *a > 3.0 * reference).collect();
    writeln!(
        report,
        "### Every first-instruction class, measured\n\n\
         Real MPI functions cover only some classes cheaply. `{}` has one tiny \
         function per class found at PMPI entries (and a few the classifier names); the bench \
         puts an entry uprobe on each (`bpftrace -p P -e 'uprobe:BIN:f_* {{ @[probe] = count(); }}'`) \
         and compares the thread's CPU ns/call with the unprobed program, {REPS} runs each, \
         alternating. A class counts as single-stepped when its added cost is over three times \
         that of `{}`.\n\n\
         | class | example | added CPU ns/call | kernel |\n|---|---|---:|---|",
        SET.program, SET.reference,
    )?;
    for ((c, a), s) in SET.classes.iter().zip(&added).zip(&stepped) {
        writeln!(
            report,
            "| {} | `{}` | {a:.0} | {} |",
            c.class,
            c.example,
            if *s { "single-stepped" } else { "emulated" }
        )?;
    }
    writeln!(
        report,
        "\nEvery probe site of both libraries checked against the measured class of its first \
         instruction:\n\n\
         | library | sites | in a measured class | classifier agrees | classifier wrong | not covered |\n\
         |---|---:|---:|---:|---:|---:|"
    )?;
    let mut wrong_lines = Vec::new();
    for (mpi, p) in libs {
        let all = sites(&p.observer, &library_file(*mpi))?;
        let (mut covered, mut agree, mut wrong, mut uncovered) = (0, 0, 0, 0);
        for (name, site, default) in &all {
            // The instruction the probe actually sits on.
            let all_bytes = bench_sites::hex_bytes(&site.bytes);
            let bytes = all_bytes.get(site.skipped as usize..).unwrap_or(&[]);
            let Some(i) = SET.class_of(bytes) else {
                uncovered += 1;
                continue;
            };
            covered += 1;
            let measured = if stepped[i] {
                "single-stepped"
            } else {
                "emulated"
            };
            if site.class == measured {
                agree += 1;
            } else {
                wrong += 1;
                wrong_lines.push(format!(
                    "| {} | {name}{} | `{}` | {} | {measured} |",
                    mpi.name(),
                    if *default { " (default)" } else { "" },
                    site.bytes,
                    site.class
                ));
                disagreements.push(format!("{} {name} ({})", mpi.name(), SET.classes[i].class));
            }
        }
        writeln!(
            report,
            "| {} | {} | {covered} | {agree} | {wrong} | {uncovered} |",
            mpi.name(),
            all.len()
        )?;
    }
    if !wrong_lines.is_empty() {
        writeln!(
            report,
            "\nSites the classifier gets wrong:\n\n\
             | library | function | first bytes | classifier | measured |\n|---|---|---|---|---|\n{}",
            wrong_lines.join("\n")
        )?;
    }
    let classes = |want: bool| {
        SET.classes
            .iter()
            .zip(&stepped)
            .filter(|(_, s)| **s == want)
            .map(|(c, _)| c.class)
            .collect::<Vec<_>>()
            .join(", ")
    };
    writeln!(
        report,
        "\nOn this kernel ({}), emulated: {}; single-stepped: {}.\n",
        first_line("uname", &["-r"]),
        classes(false),
        classes(true)
    )?;
    Ok(())
}
