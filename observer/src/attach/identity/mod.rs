//! Who a rank is, and what of that a process cannot forge.
//!
//! Rank, world size and job id come from `/proc/PID/environ`, which the
//! process wrote itself: any user can claim any job's id and rank. So every
//! identity carries what the kernel says instead, the process's real uid,
//! and a job is (job id, uid): two users never share a label set. Where the
//! process sits in a Slurm job's cgroup, the cgroup's job id is the truth and
//! replaces the environment's ([`JobidSource`]). Every value that reaches a
//! label is cut to [`LABEL_CAP`] bytes, and the environment is read up to
//! [`ENVIRON_CAP`] bytes, so a hostile environment costs bounded memory and a
//! bounded exposition.

pub mod layout;
pub mod scheduler;

use std::{
    borrow::Cow,
    sync::atomic::{AtomicU64, Ordering},
};

use crate::os::procfs::{self, ProcError};

/// The most bytes of a label value taken from a user (job id, rank, size,
/// library version, call-site name). Longer values are cut on a UTF-8
/// character boundary and counted.
pub const LABEL_CAP: usize = 128;

/// The most bytes of `/proc/PID/environ` read. Identity variables beyond it
/// are not seen; such environments are counted.
pub const ENVIRON_CAP: usize = 1 << 20;

/// The most bytes of the small `/proc/PID/*` files read here (`status`,
/// `cgroup`, a proxy's `cmdline`).
const SMALL_CAP: usize = 64 * 1024;

/// Where a rank's job id came from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum JobidSource {
    /// The Slurm job cgroup the process runs in: set by root, verified.
    Cgroup,
    /// A job variable of the process's environment: claimed, not verified.
    Environment,
    /// Derived from the launcher (Hydra's control port or the launcher's
    /// pid): no job variable at all.
    #[default]
    Launcher,
}

impl JobidSource {
    /// The `jobid_source` label value.
    pub fn as_str(self) -> &'static str {
        match self {
            JobidSource::Cgroup => "cgroup",
            JobidSource::Environment => "environment",
            JobidSource::Launcher => "launcher",
        }
    }
}

/// The user-given label values a rank can have cut to [`LABEL_CAP`]: the
/// `label` values of `mpi_observer_label_truncations_total`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Label {
    /// The job id.
    Jobid,
    /// The rank.
    Rank,
    /// The world size.
    Size,
    /// The MPI library's version string.
    Version,
    /// A call site's name.
    Callsite,
    /// Any of the scheduler's facts ([`scheduler::Facts`]).
    Scheduler,
}

impl Label {
    /// Every label, in the order of [`Label::as_str`].
    pub const ALL: [Label; 6] = [
        Label::Jobid,
        Label::Rank,
        Label::Size,
        Label::Version,
        Label::Callsite,
        Label::Scheduler,
    ];

    /// The label's name.
    pub fn as_str(self) -> &'static str {
        match self {
            Label::Jobid => "jobid",
            Label::Rank => "rank",
            Label::Size => "size",
            Label::Version => "version",
            Label::Callsite => "callsite",
            Label::Scheduler => "scheduler",
        }
    }
}

/// Call-site names cut so far. Names are made deep inside the call-site
/// cache, once per (file, offset), far from the self-metrics; the
/// self-metrics catch up with this count at each scrape.
static CALLSITE_TRUNCATIONS: AtomicU64 = AtomicU64::new(0);

/// Call-site names cut to [`LABEL_CAP`] so far.
pub fn callsite_truncations() -> u64 {
    CALLSITE_TRUNCATIONS.load(Ordering::Relaxed)
}

/// `v` cut to at most `max` bytes, on a UTF-8 character boundary.
pub fn cut(v: &str, max: usize) -> &str {
    if v.len() <= max {
        return v;
    }
    let mut end = max;
    while !v.is_char_boundary(end) {
        end -= 1;
    }
    &v[..end]
}

/// A call-site name cut to [`LABEL_CAP`], the cut counted.
pub fn cap_callsite(name: &str) -> Cow<'_, str> {
    if name.len() <= LABEL_CAP {
        return Cow::Borrowed(name);
    }
    CALLSITE_TRUNCATIONS.fetch_add(1, Ordering::Relaxed);
    Cow::Owned(cut(name, LABEL_CAP).to_string())
}

/// Who a rank is.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Identity {
    /// Rank in `MPI_COMM_WORLD`, or "unknown"; at most [`LABEL_CAP`] bytes.
    pub rank: String,
    /// Size of `MPI_COMM_WORLD`, or "unknown"; at most [`LABEL_CAP`] bytes.
    pub size: String,
    /// The job: the Slurm job of the process's cgroup, else a batch system
    /// job variable, else the launcher's namespace, else the launcher's pid;
    /// at most [`LABEL_CAP`] bytes.
    pub jobid: String,
    /// Where `jobid` came from.
    pub jobid_source: JobidSource,
    /// The process's real uid, from `/proc/PID/status`: the one part of the
    /// identity the process cannot choose.
    pub uid: u32,
    /// The values that were cut to [`LABEL_CAP`].
    pub truncated: Vec<Label>,
    /// The environment was longer than [`ENVIRON_CAP`] and read in part.
    pub environ_cut: bool,
    /// Where the job's ranks run, when the launcher said so in a way that
    /// fits this rank ([`crate::attach::identity::layout`]).
    pub layout: Option<std::sync::Arc<crate::attach::identity::layout::Layout>>,
    /// What the scheduler that named the job says of it; `None` when no
    /// scheduler did (a launcher's job).
    pub scheduler: Option<std::sync::Arc<scheduler::Facts>>,
    /// The environment names another Slurm job than the cgroup does: its
    /// claimed facts were not taken.
    pub scheduler_disowned: bool,
}

impl Identity {
    /// An identity from claimed values, each cut to [`LABEL_CAP`] (and the
    /// cut recorded in `truncated`).
    pub fn new(jobid: &str, rank: &str, size: &str, uid: u32, source: JobidSource) -> Identity {
        let mut truncated = Vec::new();
        let mut capped = |label, v: &str| {
            let c = cut(v, LABEL_CAP);
            if c.len() < v.len() {
                truncated.push(label);
            }
            c.to_string()
        };
        Identity {
            jobid: capped(Label::Jobid, jobid),
            rank: capped(Label::Rank, rank),
            size: capped(Label::Size, size),
            jobid_source: source,
            uid,
            truncated,
            environ_cut: false,
            layout: None,
            scheduler: None,
            scheduler_disowned: false,
        }
    }
}

/// Environment variables giving the rank, in order of precedence.
pub const RANK_VARS: &[&str] = &[
    "OMPI_COMM_WORLD_RANK",
    "PMIX_RANK",
    "PMI_RANK",
    "SLURM_PROCID",
];
/// Environment variables giving the world size, in order of precedence.
pub const SIZE_VARS: &[&str] = &["OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS"];
/// Environment variables giving the job id, in order of precedence: the
/// batch schedulers', then the launcher's namespace. Flux comes first: it
/// runs as a job of Slurm or PBS (`srun flux start`), and its jobs' tasks
/// inherit the allocation's `SLURM_JOB_ID`, which names the allocation,
/// not the job that started them.
pub const JOB_VARS: &[&str] = &["FLUX_JOB_ID", "SLURM_JOB_ID", "PBS_JOBID", "PMIX_NAMESPACE"];

/// Reads who `pid` is: its real uid, its Slurm job cgroup if any, and rank,
/// size and job id from `/proc/PID/environ` (the environment the process
/// was started with; see [`RANK_VARS`], [`SIZE_VARS`], [`JOB_VARS`]), and
/// the scheduler's facts of the job ([`scheduler`]).
/// Without a job cgroup or variable, Hydra's control port names the job
/// (`hydra-PORT`), else the launcher does (`launcher-PID`: the outermost
/// launcher among its ancestors, else its parent).
pub fn identity(pid: u32) -> Result<Identity, ProcError> {
    let (status, _) = procfs::read_capped(pid, "status", SMALL_CAP)?;
    let uid =
        real_uid(&String::from_utf8_lossy(&status)).ok_or(ProcError::NoSuchProcess { pid })?;
    let (env, environ_cut) = procfs::read_capped(pid, "environ", ENVIRON_CAP)?;
    let cgroup_job = procfs::read_capped(pid, "cgroup", SMALL_CAP)
        .ok()
        .and_then(|(c, _)| slurm_job_of_cgroup(&String::from_utf8_lossy(&c)));
    let get = |names: &[&str]| -> Option<Cow<'_, str>> {
        names
            .iter()
            .find_map(|n| env_var(&env, n.as_bytes()).map(String::from_utf8_lossy))
    };
    let job_var = JOB_VARS
        .iter()
        .find_map(|n| env_var(&env, n.as_bytes()).map(|v| (*n, String::from_utf8_lossy(v))));
    let (jobid, source) = match (&cgroup_job, &job_var) {
        (Some(j), _) => (j.clone(), JobidSource::Cgroup),
        (None, Some((_, j))) => (j.to_string(), JobidSource::Environment),
        (None, None) => (
            hydra_job(pid).unwrap_or_else(|| format!("launcher-{}", launcher_pid(pid))),
            JobidSource::Launcher,
        ),
    };
    let rank = get(RANK_VARS).unwrap_or(Cow::Borrowed("unknown"));
    let size = get(SIZE_VARS).unwrap_or(Cow::Borrowed("unknown"));
    let layout = match (rank.parse::<u32>(), size.parse::<u32>()) {
        (Ok(r), Ok(s)) => crate::attach::identity::layout::Layout::from_env(
            |name| env_var(&env, name.as_bytes()).and_then(|v| std::str::from_utf8(v).ok()),
            r,
            s,
            crate::attach::identity::layout::this_node(),
        ),
        _ => None,
    };
    let mut id = Identity::new(&jobid, &rank, &size, uid, source);
    id.environ_cut = environ_cut;
    id.layout = layout.map(std::sync::Arc::new);
    let slurm_env_job = env_var(&env, b"SLURM_JOB_ID").map(String::from_utf8_lossy);
    let (facts, disowned) = job_facts(
        cgroup_job.as_deref(),
        job_var.as_ref().map(|(n, _)| *n),
        slurm_env_job.as_deref(),
        |n| env_var(&env, n.as_bytes()),
    );
    if let Some((f, cut)) = facts {
        if cut {
            id.truncated.push(Label::Scheduler);
        }
        id.scheduler = Some(std::sync::Arc::new(f));
    }
    id.scheduler_disowned = disowned;
    Ok(id)
}

/// The scheduler's facts of a rank's job (and whether a value was cut), and
/// whether the environment's were refused: with a Slurm job cgroup
/// (`cgroup_job`), Slurm's, taken from the environment only when its
/// `SLURM_JOB_ID` (`slurm_env_job`) names that job; else those of the
/// scheduler whose job variable (`job_var`, the first of [`JOB_VARS`]
/// present) named the job; none for a launcher's job.
pub fn job_facts<'e>(
    cgroup_job: Option<&str>,
    job_var: Option<&str>,
    slurm_env_job: Option<&str>,
    get: impl Fn(&str) -> Option<&'e [u8]>,
) -> (Option<(scheduler::Facts, bool)>, bool) {
    use scheduler::{Facts, Scheduler};
    match cgroup_job {
        Some(j) if slurm_env_job == Some(j) => (Some(Facts::read(Scheduler::Slurm, get)), false),
        Some(_) => (
            Some((Facts::bare(Scheduler::Slurm), false)),
            slurm_env_job.is_some(),
        ),
        None => (
            job_var
                .and_then(Scheduler::of_job_var)
                .map(|s| Facts::read(s, get)),
            false,
        ),
    }
}

/// The value of `name` in a NUL-separated environment block: its first
/// non-empty definition.
fn env_var<'a>(env: &'a [u8], name: &[u8]) -> Option<&'a [u8]> {
    env.split(|b| *b == 0).find_map(|kv| {
        kv.strip_prefix(name)
            .and_then(|rest| rest.strip_prefix(b"="))
            .filter(|v| !v.is_empty())
    })
}

/// The real uid in the text of `/proc/PID/status` (`Uid:` real, effective,
/// saved, filesystem).
pub fn real_uid(status: &str) -> Option<u32> {
    status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// The Slurm job whose cgroup a process is in, from the text of
/// `/proc/PID/cgroup`, read in the initial cgroup namespace.
///
/// Only places a user cannot create count, since a delegated subtree (a
/// systemd user session) lets a user name cgroups anything:
/// - cgroup v2 (`0::PATH`): `/system.slice/[NODE_]slurmstepd.scope/job_ID/...`;
/// - cgroup v1 (`N:CONTROLLERS:PATH`): `/slurm[_NODE]/uid_UID/job_ID/...`.
///
/// `ID` is the numeric job id Slurm's `SLURM_JOB_ID` carries.
pub fn slurm_job_of_cgroup(text: &str) -> Option<String> {
    text.lines().find_map(|line| {
        let mut fields = line.splitn(3, ':');
        let (_, _, path) = (fields.next()?, fields.next()?, fields.next()?);
        let parts: Vec<&str> = path.split('/').skip(1).collect();
        let job = match parts[..] {
            ["system.slice", scope, job, ..] if scope.ends_with("slurmstepd.scope") => job,
            [top, uid, job, ..]
                if (top == "slurm" || top.starts_with("slurm_")) && uid.starts_with("uid_") =>
            {
                job
            }
            _ => return None,
        };
        let id = job.strip_prefix("job_")?;
        (!id.is_empty() && id.len() <= 20 && id.bytes().all(|b| b.is_ascii_digit()))
            .then(|| id.to_string())
    })
}

fn parent(pid: u32) -> Option<u32> {
    procfs::stat(pid).ok().map(|s| s.ppid)
}

/// MPICH's Hydra without a batch system: every node's proxy carries the
/// launcher's `--control-port HOST:PORT`, the same on all nodes of one job,
/// whereas pids differ from node to node.
fn hydra_job(pid: u32) -> Option<String> {
    let proxy = parent(pid).filter(|p| procfs::comm(*p).starts_with("hydra_pmi_prox"))?;
    let (cmdline, _) = procfs::read_capped(proxy, "cmdline", SMALL_CAP).ok()?;
    let mut args = cmdline.split(|b| *b == 0);
    args.find(|a| *a == b"--control-port")?;
    let port = String::from_utf8_lossy(args.next()?).into_owned();
    (!port.is_empty()).then(|| format!("hydra-{port}"))
}

/// The outermost ancestor, up to 16 generations up, whose command is a
/// launcher (mpirun, mpiexec, orted, hydra_pmi_proxy, srun...), else the
/// parent.
fn launcher_pid(pid: u32) -> u32 {
    const LAUNCHERS: &[&str] = &[
        "mpirun",
        "mpiexec",
        "orterun",
        "prterun",
        "srun",
        "hydra_pmi_proxy",
        "orted",
        "prted",
    ];
    let first = parent(pid).unwrap_or(0);
    let mut cur = first;
    // Prefer the outermost launcher: ranks of one job under one mpirun share it
    // even when a per-node daemon (orted, hydra proxy) sits between.
    let mut best = None;
    for _ in 0..16 {
        if cur <= 1 {
            break;
        }
        let c = procfs::comm(cur);
        if LAUNCHERS.iter().any(|l| c.starts_with(l)) {
            best = Some(cur);
        }
        match parent(cur) {
            Some(p) => cur = p,
            None => break,
        }
    }
    best.unwrap_or(first)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cuts_on_character_boundaries() {
        assert_eq!(cut("abc", 3), "abc");
        assert_eq!(cut("abcd", 3), "abc");
        // 'é' is two bytes: a cut inside it backs off before it.
        assert_eq!(cut("aé", 2), "a");
        let long = "é".repeat(100);
        let c = cut(&long, LABEL_CAP);
        assert_eq!(c.len(), LABEL_CAP);
        let odd = format!("x{long}");
        assert_eq!(cut(&odd, LABEL_CAP).len(), LABEL_CAP - 1);
    }

    #[test]
    fn long_claims_are_cut_and_recorded() {
        let huge = "9".repeat(131 * 1024);
        let id = Identity::new(&huge, "0", "2", 1000, JobidSource::Environment);
        assert_eq!(id.jobid.len(), LABEL_CAP);
        assert_eq!(id.truncated, vec![Label::Jobid]);
        let ok = Identity::new("42", "0", "2", 0, JobidSource::Environment);
        assert!(ok.truncated.is_empty());
    }

    #[test]
    fn callsite_names_are_capped_and_counted() {
        let before = callsite_truncations();
        assert_eq!(cap_callsite("main"), "main");
        let long = "f".repeat(1000);
        assert_eq!(cap_callsite(&long).len(), LABEL_CAP);
        assert!(callsite_truncations() > before);
    }

    #[test]
    fn real_uid_is_the_first_uid() {
        let s = "Name:\tx\nUmask:\t0022\nUid:\t1001\t0\t0\t0\nGid:\t5\t5\t5\t5\n";
        assert_eq!(real_uid(s), Some(1001));
        assert_eq!(real_uid("Name:\tx\n"), None);
        let own = std::fs::read_to_string("/proc/self/status").unwrap();
        // SAFETY: getuid has no preconditions.
        assert_eq!(real_uid(&own), Some(unsafe { libc::getuid() }));
    }

    #[test]
    fn slurm_cgroups_v2_and_v1() {
        let v2 = "0::/system.slice/slurmstepd.scope/job_4242/step_0/user/task_0\n";
        assert_eq!(slurm_job_of_cgroup(v2).as_deref(), Some("4242"));
        let v2_node = "0::/system.slice/node1_slurmstepd.scope/job_7/step_batch/user/task_0\n";
        assert_eq!(slurm_job_of_cgroup(v2_node).as_deref(), Some("7"));
        let v1 = "12:pids:/user.slice\n4:cpuset:/slurm/uid_1000/job_99/step_0/task_1\n";
        assert_eq!(slurm_job_of_cgroup(v1).as_deref(), Some("99"));
        let v1_node = "5:memory:/slurm_node3/uid_0/job_12/step_extern\n";
        assert_eq!(slurm_job_of_cgroup(v1_node).as_deref(), Some("12"));
        // Places a user can create in a delegated subtree do not count.
        for forged in [
            "0::/user.slice/user-1000.slice/user@1000.service/app.slice/job_4242/step_0\n",
            "0::/user.slice/user-1000.slice/user@1000.service/slurmstepd.scope/job_4242/step_0\n",
            "0::/system.slice/other.scope/job_4242/step_0\n",
            "0::/system.slice/slurmstepd.scope/job_x1/step_0\n",
            "0::/system.slice/slurmstepd.scope/job_/step_0\n",
            "0::/\n",
            "garbage",
            "",
        ] {
            assert_eq!(slurm_job_of_cgroup(forged), None, "{forged}");
        }
    }

    #[test]
    fn environment_lookup_takes_the_first_non_empty_exact_name() {
        let env = b"SLURM_JOB_IDX=1\0SLURM_JOB_ID=\0SLURM_JOB_ID=42\0SLURM_JOB_ID=43\0EMPTY=\0";
        assert_eq!(env_var(env, b"SLURM_JOB_ID"), Some(&b"42"[..]));
        assert_eq!(env_var(env, b"EMPTY"), None);
        assert_eq!(env_var(env, b"NONE"), None);
    }

    #[test]
    fn facts_come_from_the_scheduler_that_named_the_job() {
        use scheduler::Scheduler;
        let env: &[u8] = b"SLURM_JOB_ID=42\0SLURM_STEP_ID=1\0SLURM_JOB_ACCOUNT=phys\0PBS_QUEUE=q\0";
        let get = |n: &str| env_var(env, n.as_bytes());
        // The environment's job variable.
        let (f, disowned) = job_facts(None, Some("SLURM_JOB_ID"), Some("42"), get);
        let (f, cut) = f.unwrap();
        assert!(!disowned && !cut);
        assert_eq!((f.scheduler, f.step.as_str()), (Scheduler::Slurm, "1"));
        assert_eq!((f.account.as_str(), f.partition.as_str()), ("phys", ""));
        // PBS named the job: Slurm's variables are not its facts.
        let (f, _) = job_facts(None, Some("PBS_JOBID"), Some("42"), get);
        let (f, _) = f.unwrap();
        assert_eq!((f.scheduler, f.account.as_str()), (Scheduler::Pbs, ""));
        assert_eq!(f.partition, "q");
        // A launcher's job has no scheduler.
        assert_eq!(
            job_facts(None, Some("PMIX_NAMESPACE"), None, get),
            (None, false)
        );
        assert_eq!(job_facts(None, None, None, get), (None, false));
        // The cgroup's job: the environment's facts only if it names the
        // same job; another job's are refused, and said.
        let (f, disowned) = job_facts(Some("42"), Some("SLURM_JOB_ID"), Some("42"), get);
        assert_eq!(f.unwrap().0.step, "1");
        assert!(!disowned);
        let (f, disowned) = job_facts(Some("7"), Some("SLURM_JOB_ID"), Some("42"), get);
        assert_eq!(f.unwrap().0, scheduler::Facts::bare(Scheduler::Slurm));
        assert!(disowned);
        let (f, disowned) = job_facts(Some("7"), None, None, get);
        assert_eq!(f.unwrap().0, scheduler::Facts::bare(Scheduler::Slurm));
        assert!(!disowned);
    }

    #[test]
    fn flux_names_its_job_before_the_allocation() {
        let env: &[u8] = b"SLURM_JOB_ID=42\0FLUX_JOB_ID=f3mKbW\0PMIX_NAMESPACE=ns\0";
        let first = JOB_VARS
            .iter()
            .find_map(|n| env_var(env, n.as_bytes()).map(|v| (*n, v)));
        assert_eq!(first, Some(("FLUX_JOB_ID", &b"f3mKbW"[..])));
    }

    #[test]
    fn own_identity_has_own_uid() {
        let id = identity(std::process::id()).unwrap();
        // SAFETY: getuid has no preconditions.
        assert_eq!(id.uid, unsafe { libc::getuid() });
        assert!(id.jobid.len() <= LABEL_CAP);
        assert!(!id.environ_cut);
    }
}
