//! What this kernel can do for the probes, found by trying it (never by
//! its version: distributions backport BPF features, and stable kernels
//! take fixes unevenly), and the attach mechanism chosen from that.
//!
//! - `uprobe_multi` links, and whether their PID filter covers every thread
//!   of a process (it matched one thread from 6.6 until upstream's fix in
//!   6.10, 46ba0e49b642; stable kernels took it unevenly);
//! - classic uprobes: BPF links on perf events and their attach cookies
//!   (5.15), or only `PERF_EVENT_IOC_SET_BPF`;
//! - BPF ring buffers (5.8): exec events and `record`;
//! - `bpf_get_ns_current_pid_tgid` (5.7): a daemon in a pid namespace;
//! - kernel BTF, reported only: the programs need none.
//!
//! [`choose`] picks `uprobe_multi` where it covers every thread, else
//! classic uprobes, else nothing (no usable eBPF); the environment variable
//! [`FORCE`] overrides it, so tests run every mechanism on one kernel.

mod insn;
pub(crate) mod probe;

pub use probe::mpi_observer_feature_probe;

use thiserror::Error;

use crate::attach::links::{
    Mechanism,
    multi::UprobeMulti,
    perf::{PerfUprobes, Pmu},
};

/// Hidden override of the mechanism (tests): `uprobe_multi`, `perf_link`,
/// `perf_ioctl` or `none` (as if the kernel had no usable eBPF).
pub const FORCE: &str = "MPI_OBSERVER_ATTACH_MECHANISM";

/// What the running kernel was found to do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Features {
    /// The uprobe PMU, if the kernel has one.
    pub pmu: Option<Pmu>,
    /// uprobe_multi links and their PID filter.
    pub multi: probe::Multi,
    /// Classic uprobes: whether they fire, by link, with cookies.
    pub classic: probe::Classic,
    /// BPF ring buffers.
    pub ringbuf: bool,
    /// `bpf_get_ns_current_pid_tgid`.
    pub ns_pid: bool,
    /// `/sys/kernel/btf/vmlinux`.
    pub btf: bool,
}

/// Why no mechanism can be used.
#[derive(Debug, Error)]
pub enum NoMechanism {
    /// Nothing fires a program on a uprobe.
    #[error(
        "this kernel runs no BPF program on a uprobe (no uprobe PMU, no uprobe_multi link, and a program on a uprobe perf event never fired)"
    )]
    Unusable,
    /// [`FORCE`] names a mechanism the kernel lacks.
    #[error("{FORCE}={name}: this kernel has no {name}")]
    Forced {
        /// The mechanism named.
        name: String,
    },
    /// [`FORCE`] is `none`.
    #[error("{FORCE}=none")]
    ForcedNone,
    /// [`FORCE`] names no mechanism.
    #[error("{FORCE}={name} is not a mechanism: use uprobe_multi, perf_link, perf_ioctl or none")]
    Unknown {
        /// What it said.
        name: String,
    },
    /// No ring buffers: the object's maps cannot be made.
    #[error(
        "this kernel has no BPF ring buffers (BPF_MAP_TYPE_RINGBUF), which the programs' maps need"
    )]
    NoRingbuf,
}

/// The mechanism chosen, and why, in words for the start-up line.
pub struct Choice {
    /// The mechanism.
    pub mechanism: Box<dyn Mechanism>,
    /// Why it and not another.
    pub why: String,
}

impl Features {
    /// Probes the running kernel (about a few hundred milliseconds: each
    /// perf event closed waits for a grace period).
    pub fn probe() -> Features {
        let pmu = Pmu::read();
        Features {
            pmu,
            multi: probe::uprobe_multi(),
            classic: pmu.map(probe::classic).unwrap_or_default(),
            ringbuf: probe::ringbuf(),
            ns_pid: probe::ns_pid(),
            btf: std::path::Path::new("/sys/kernel/btf/vmlinux").exists(),
        }
    }

    /// Each feature as a label value for `mpi_observer_kernel_info`:
    /// (label, value) with values `yes`/`no` (`uprobe_multi` also
    /// `main_thread_only`).
    pub fn labels(&self) -> [(&'static str, &'static str); 6] {
        let yn = |b: bool| if b { "yes" } else { "no" };
        [
            (
                "uprobe_multi",
                match self.multi {
                    probe::Multi::Missing => "no",
                    probe::Multi::MainThreadOnly => "main_thread_only",
                    probe::Multi::EveryThread => "yes",
                },
            ),
            ("perf_link", yn(self.classic.links)),
            ("attach_cookie", yn(self.classic.cookies)),
            ("ringbuf", yn(self.ringbuf)),
            ("ns_pid", yn(self.ns_pid)),
            ("btf", yn(self.btf)),
        ]
    }

    /// The features as `name=value` words, for lines.
    pub fn summary(&self) -> String {
        self.labels()
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(" ")
    }

    fn classic_mechanism(&self) -> Option<PerfUprobes> {
        let pmu = self.pmu?;
        self.classic.works.then_some(PerfUprobes {
            pmu,
            links: self.classic.links,
            cookies: self.classic.cookies,
        })
    }

    /// Picks the mechanism: `uprobe_multi` where its PID filter covers
    /// every thread, else classic uprobes; `force` (the value of [`FORCE`])
    /// overrides.
    pub fn choose(&self, force: Option<&str>) -> Result<Choice, NoMechanism> {
        if !self.ringbuf {
            return Err(NoMechanism::NoRingbuf);
        }
        let classic_why = |m: &PerfUprobes| {
            if m.links {
                if m.cookies {
                    "classic uprobes, one BPF link per site with its cookie"
                } else {
                    "classic uprobes, one BPF link per site, functions told by address (no attach cookies)"
                }
            } else {
                "classic uprobes attached by ioctl, functions told by address (no BPF links on perf events, so no handover at a planned restart)"
            }
        };
        match force {
            None => {}
            Some("uprobe_multi") if self.multi != probe::Multi::Missing => {
                return Ok(Choice {
                    mechanism: Box::new(UprobeMulti),
                    why: format!("uprobe_multi links, as {FORCE} asks"),
                });
            }
            Some(name @ ("perf_link" | "perf_ioctl")) => {
                let links = name == "perf_link";
                return match self.classic_mechanism() {
                    Some(mut m) if m.links || !links => {
                        m.links = links;
                        m.cookies &= links;
                        let why = format!("{}, as {FORCE} asks", classic_why(&m));
                        Ok(Choice {
                            mechanism: Box::new(m),
                            why,
                        })
                    }
                    _ => Err(NoMechanism::Forced { name: name.into() }),
                };
            }
            Some("uprobe_multi") => {
                return Err(NoMechanism::Forced {
                    name: "uprobe_multi".into(),
                });
            }
            Some("none") => return Err(NoMechanism::ForcedNone),
            Some(other) => {
                return Err(NoMechanism::Unknown { name: other.into() });
            }
        }
        if self.multi == probe::Multi::EveryThread {
            return Ok(Choice {
                mechanism: Box::new(UprobeMulti),
                why: "uprobe_multi links, one per program and rank".into(),
            });
        }
        let Some(m) = self.classic_mechanism() else {
            return Err(NoMechanism::Unusable);
        };
        let because = match self.multi {
            probe::Multi::MainThreadOnly => {
                "this kernel's uprobe_multi links filter one thread of a process, not all of them"
            }
            _ => "this kernel has no uprobe_multi links",
        };
        let why = format!("{} ({because})", classic_why(&m));
        Ok(Choice {
            mechanism: Box::new(m),
            why,
        })
    }
}

/// Probes the kernel and chooses, with [`FORCE`] from the environment
/// (unset or empty: the kernel's own choice).
pub fn detect() -> (Features, Result<Choice, NoMechanism>) {
    let features = Features::probe();
    let force = std::env::var(FORCE).ok().filter(|v| !v.is_empty());
    let choice = features.choose(force.as_deref());
    (features, choice)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn features(multi: probe::Multi, links: bool, cookies: bool) -> Features {
        Features {
            pmu: Some(Pmu { ty: 7, ret_bit: 0 }),
            multi,
            classic: probe::Classic {
                works: true,
                links,
                cookies,
            },
            ringbuf: true,
            ns_pid: true,
            btf: true,
        }
    }

    #[test]
    fn uprobe_multi_is_chosen_only_where_it_covers_every_thread() {
        let f = features(probe::Multi::EveryThread, true, true);
        assert_eq!(f.choose(None).unwrap().mechanism.name(), "uprobe_multi");
        let f = features(probe::Multi::MainThreadOnly, true, true);
        let c = f.choose(None).unwrap();
        assert_eq!(c.mechanism.name(), "perf_link");
        assert!(c.why.contains("one thread"), "{}", c.why);
        let f = features(probe::Multi::Missing, false, false);
        let c = f.choose(None).unwrap();
        assert_eq!(c.mechanism.name(), "perf_ioctl");
        assert!(!c.mechanism.cookies());
        assert!(!c.mechanism.pinnable());
    }

    #[test]
    fn the_override_forces_any_mechanism_the_kernel_has() {
        let f = features(probe::Multi::EveryThread, true, true);
        for m in ["uprobe_multi", "perf_link", "perf_ioctl"] {
            assert_eq!(f.choose(Some(m)).unwrap().mechanism.name(), m);
        }
        let ioctl = f.choose(Some("perf_ioctl")).unwrap().mechanism;
        assert!(!ioctl.cookies(), "forced ioctl tells functions by address");
        assert!(matches!(
            f.choose(Some("none")),
            Err(NoMechanism::ForcedNone)
        ));
        assert!(matches!(
            f.choose(Some("kprobe")),
            Err(NoMechanism::Unknown { .. })
        ));
        let old = features(probe::Multi::Missing, false, false);
        assert!(matches!(
            old.choose(Some("perf_link")),
            Err(NoMechanism::Forced { .. })
        ));
        assert!(matches!(
            old.choose(Some("uprobe_multi")),
            Err(NoMechanism::Forced { .. })
        ));
    }

    #[test]
    fn nothing_usable_is_an_error() {
        let mut f = features(probe::Multi::Missing, false, false);
        f.classic.works = false;
        assert!(matches!(f.choose(None), Err(NoMechanism::Unusable)));
        let mut f = features(probe::Multi::EveryThread, true, true);
        f.ringbuf = false;
        assert!(matches!(f.choose(None), Err(NoMechanism::NoRingbuf)));
    }

    /// On the machine running the tests, as root: the probes find what the
    /// kernel really does (CI's kernel has every feature).
    #[test]
    fn the_probes_run_on_this_kernel() {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            assert!(std::env::var_os("CI").is_none(), "needs root under CI");
            return;
        }
        let f = Features::probe();
        assert!(f.pmu.is_some(), "{f:?}");
        assert!(f.classic.works, "{f:?}");
        assert!(f.ringbuf, "{f:?}");
        assert!(f.choose(None).is_ok(), "{}", f.summary());
    }
}
