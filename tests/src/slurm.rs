//! A real Slurm cluster on this machine, from Debian's packages: the
//! controller and three compute nodes, each node a network, UTS and mount
//! namespace of its own (tests/slurm/cluster.sh, which a person can run by
//! hand to reproduce a failure; docs/dev/slurm-spike.md says how it is
//! built and why). Used by `tests/tests/e2e/slurm.rs`.
//!
//! Names are fixed (`/run/mpiobs-slurm`, bridge `mpiobs-br`, namespaces
//! `mpiobs-nodeN`, 10.213.200.0/24, Slurm ports 16817-16818): e2e tests run
//! one at a time, and a cluster a killed run left is swept before a new one
//! goes up.

use std::{
    path::{Path, PathBuf},
    process::{Command, Output, Stdio},
    time::{Duration, Instant},
};

use crate::{run_with_timeout, workspace_root};

/// Where the cluster keeps its configuration, logs and job directories.
pub const STATE: &str = "/run/mpiobs-slurm";
/// The unprivileged user jobs run as.
pub const USER: &str = "mpiobs";
/// A second unprivileged user (cluster.sh makes her too), who submits no
/// job: her processes on a node try what one user can do to another's job.
pub const OTHER_USER: &str = "mpiobs2";
/// Compute nodes.
pub const NODES: usize = 3;
/// The partition every node is in.
pub const PARTITION: &str = "debug";

/// Node `i`'s (1-based) address on the cluster's bridge.
pub fn node_addr(i: usize) -> String {
    format!("10.213.200.{}", 10 + i)
}

/// Node `i`'s name, its hostname and `SLURMD_NODENAME`.
pub fn node_name(i: usize) -> String {
    format!("node{i}")
}

/// tests/slurm/cluster.sh.
pub fn script() -> PathBuf {
    workspace_root().join("tests/slurm/cluster.sh")
}

fn cluster_sh(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut c = Command::new(script());
    c.args(args).stdin(Stdio::null());
    for (k, v) in env {
        c.env(k, v);
    }
    run_with_timeout(&mut c, Duration::from_secs(120))
}

/// The running cluster; brought down (`cluster.sh down`) when dropped, so a
/// failed test leaves no daemon, namespace or link behind.
pub struct SlurmCluster {
    conf: String,
}

impl SlurmCluster {
    /// Sweeps a cluster a killed run left, then brings one up with `env`
    /// (cluster.sh's `MPIOBS_SLURM_*` variables) and waits until every node
    /// is idle.
    pub fn up(env: &[(&str, &str)]) -> SlurmCluster {
        let stale = Path::new(STATE).exists()
            || Command::new("ip")
                .args(["link", "show", "mpiobs-br"])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success());
        if stale {
            eprintln!("slurm: sweeping a stale cluster");
            cluster_sh(&["down"], &[]);
        }
        let c = SlurmCluster {
            conf: format!("{STATE}/etc/slurm.conf"),
        };
        let o = cluster_sh(&["up"], env);
        assert!(
            o.status.success(),
            "cluster.sh up failed:\n{}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
        c
    }

    /// The slurm.conf every client needs (`SLURM_CONF`).
    pub fn conf(&self) -> &str {
        &self.conf
    }

    /// A fresh directory under `$STATE/jobs`, owned by [`USER`]: a job's
    /// working directory (the nodes' /tmp are private, this is shared).
    pub fn user_dir(&self, name: &str) -> PathBuf {
        let d = Path::new(STATE).join("jobs").join(name);
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        let o = Command::new("chown")
            .arg(format!("{USER}:{USER}"))
            .arg(&d)
            .status()
            .unwrap();
        assert!(o.success(), "chown {}", d.display());
        d
    }

    /// [`USER`]'s uid.
    pub fn uid(&self) -> u32 {
        uid_of(USER)
    }

    /// [`OTHER_USER`]'s uid.
    pub fn other_uid(&self) -> u32 {
        uid_of(OTHER_USER)
    }

    /// `prog` (srun, sbatch, squeue...) run as [`USER`] with the cluster's
    /// `SLURM_CONF`, in `dir`.
    pub fn as_user(&self, dir: &Path, prog: &str) -> Command {
        let mut c = Command::new("runuser");
        c.args(["-u", USER, "--", "env"])
            .arg(format!("SLURM_CONF={}", self.conf))
            .arg(prog)
            .current_dir(dir)
            .stdin(Stdio::null());
        c
    }

    /// `CMD` to run in node `i`'s namespaces: append it
    /// (`cluster.sh exec i CMD...`).
    pub fn exec(&self, i: usize) -> Command {
        let mut c = Command::new(script());
        c.args(["exec", &i.to_string()]);
        c
    }

    /// `sbatch --parsable ARGS` as [`USER`] in `dir`; returns the job id
    /// (an array's own id).
    pub fn sbatch(&self, dir: &Path, args: &[&str]) -> String {
        let o = run_with_timeout(
            self.as_user(dir, "sbatch").arg("--parsable").args(args),
            Duration::from_secs(60),
        );
        assert!(
            o.status.success(),
            "sbatch {args:?}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        let out = String::from_utf8_lossy(&o.stdout);
        // `ID` or `ID;CLUSTER`.
        out.trim().split(';').next().unwrap().to_string()
    }

    /// Waits until job `id` (an array's every task) has left `squeue`:
    /// ended, its Epilog done. Polls every 0.1 s: `sbatch --wait` polls at
    /// 2 s and more (docs/dev/slurm-spike.md, §2).
    pub fn wait_gone(&self, id: &str, limit: Duration) {
        let start = Instant::now();
        loop {
            let o = Command::new("squeue")
                .args(["-h", "-j", id, "-o", "%i %T"])
                .env("SLURM_CONF", &self.conf)
                .output()
                .unwrap();
            let out = String::from_utf8_lossy(&o.stdout).trim().to_string();
            if out.is_empty() {
                return;
            }
            assert!(
                start.elapsed() < limit,
                "job {id} still in squeue after {limit:?}: {out}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// `squeue`'s (job id, array task id) of array `id`'s tasks
    /// (`%A %K`), whatever their state.
    pub fn array_tasks(&self, id: &str) -> Vec<(String, String)> {
        let o = Command::new("squeue")
            .args(["-h", "-r", "-t", "all", "-j", id, "-o", "%A %K"])
            .env("SLURM_CONF", &self.conf)
            .output()
            .unwrap();
        String::from_utf8_lossy(&o.stdout)
            .lines()
            .filter_map(|l| {
                let (a, b) = l.trim().split_once(' ')?;
                Some((a.to_string(), b.to_string()))
            })
            .collect()
    }
}

/// `user`'s uid.
fn uid_of(user: &str) -> u32 {
    let o = Command::new("id").args(["-u", user]).output().unwrap();
    String::from_utf8_lossy(&o.stdout)
        .trim()
        .parse()
        .unwrap_or_else(|e| panic!("uid of {user}: {e}"))
}

impl Drop for SlurmCluster {
    fn drop(&mut self) {
        let o = cluster_sh(&["down"], &[]);
        if !o.status.success() {
            eprintln!(
                "cluster.sh down failed:\n{}",
                String::from_utf8_lossy(&o.stderr)
            );
        }
    }
}
