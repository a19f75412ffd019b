#!/usr/bin/python3
"""Scalasca's wait states computed from an OTF2 archive that `mpi-observer
record` wrote, to hold the daemon's live figures to (tests/tests/e2e/waits.rs).

    /usr/bin/python3 trace_waits.py DIR/traces.otf2 P2P_PERIOD

It reads the archive with Debian's python3-otf2, which shares nothing with
the daemon, and applies the formulas of docs/waits.md (Scalasca's
`MPI.pattern`) to the events, for the patterns the daemon computes:

- collectives on MPI_COMM_WORLD, matched by their order on each rank (the
  n-th blocking collective of one rank is the n-th of every rank, which the
  slice `record` cuts at points every rank recorded keeps true): Wait at
  Barrier and Wait at NxN, `min(E_max, L_i) - E_i` for every member, the
  culprit the last to enter; Late Broadcast, `min(E_root, L_i) - E_i` for
  every member but the root, the culprit the root; Early Reduce, the root
  only, `min(E_max, L_root) - E_root` with E_max the latest other enter, the
  culprit that latest one;
- Late Sender on MPI_COMM_WORLD: the k-th message from s to r with tag t is
  the k-th send and the k-th receive of that envelope (MPI's non-overtaking
  rule); for the blocking call R that completed the receive,
  `min(E_S, L_R) - E_R`, E_S the enter of the call that posted the send; a
  call completing several receives waits for its latest sender only. As
  the shim samples messages, only those whose k is a multiple of
  P2P_PERIOD count, times P2P_PERIOD; a call counts if it completed a
  sampled receive.

Prints one JSON object, every figure in nanoseconds:

    {"patterns": {"wait_barrier": {"waited_ns": n, "instances": n}, ...},
     "ranks": {"0": {"waited_ns": {"wait_barrier": n, ...},
                     "late_ns": {"wait_barrier": n, ...}}, ...},
     "collectives": instances on MPI_COMM_WORLD,
     "mismatched": instances whose members disagree on the operation, or
                   ranks whose number of instances differs,
     "unmatched": receives with no send in the archive}
"""

import json
import sys
from collections import defaultdict

import otf2

PATTERN_OF_OP = {
    "BARRIER": "wait_barrier",
    "ALLREDUCE": "wait_nxn",
    "ALLGATHER": "wait_nxn",
    "ALLGATHERV": "wait_nxn",
    "ALLTOALL": "wait_nxn",
    "ALLTOALLV": "wait_nxn",
    "REDUCE_SCATTER": "wait_nxn",
    "REDUCE_SCATTER_BLOCK": "wait_nxn",
    "BCAST": "late_broadcast",
    "SCATTER": "late_broadcast",
    "SCATTERV": "late_broadcast",
    "REDUCE": "early_reduce",
    "GATHER": "early_reduce",
    "GATHERV": "early_reduce",
}
# The blocking calls that complete a receive and so can wait for it.
WAITING_CALLS = {
    "MPI_Recv", "MPI_Sendrecv", "MPI_Sendrecv_replace", "MPI_Mrecv",
    "MPI_Wait", "MPI_Waitany", "MPI_Waitall", "MPI_Waitsome",
}
PATTERNS = ["wait_barrier", "wait_nxn", "late_broadcast", "early_reduce", "late_sender"]


def name_of(enum_value):
    return str(enum_value).split(".")[-1]


def main(anchor, period):
    with otf2.reader.open(anchor) as trace:
        defs = trace.definitions
        masters = [
            g for g in defs.groups
            if name_of(g.group_type) == "COMM_LOCATIONS"
        ][0].members
        world_of_location = {id(loc): i for i, loc in enumerate(masters)}
        world_of_group = {id(loc.group): i for i, loc in enumerate(masters)}
        nranks = len(masters)

        def world(comm, peer):
            return world_of_location[id(comm.group.members[peer])]

        stacks = defaultdict(list)      # location -> [(region name, enter)]
        open_coll = {}                  # location -> (op, root, enter)
        open_recvs = defaultdict(list)  # location -> [(sender, tag)] in the call
        colls = defaultdict(list)       # rank -> [(op, root, enter, leave)]
        sends = defaultdict(list)       # (s, r, tag) -> [enter of the posting call]
        recvs = defaultdict(list)       # (s, r, tag) -> [call id]
        calls = {}                      # call id -> (rank, name, enter, leave)

        for location, event in trace.events:
            lid = id(location)
            me = world_of_group[id(location.group)]
            kind = type(event).__name__
            stack = stacks[lid]
            if kind == "Enter":
                stack.append((event.region.name, event.time))
            elif kind == "Leave":
                if not stack:
                    continue
                name, enter = stack.pop()
                if lid in open_coll:
                    op, root, e = open_coll.pop(lid)
                    colls[me].append((op, root, e, event.time))
                if open_recvs[lid]:
                    call = (lid, enter)
                    calls[call] = (me, name, enter, event.time)
                    for key in open_recvs.pop(lid):
                        recvs[key].append(call)
            elif kind == "MpiCollectiveEnd":
                if event.communicator.name != "MPI_COMM_WORLD" or not stack:
                    continue
                root = None
                if event.root != 2**32 - 1:
                    root = world(event.communicator, event.root)
                open_coll[lid] = (name_of(event.collective_op), root, stack[-1][1])
            elif kind in ("MpiSend", "MpiIsend"):
                if event.communicator.name == "MPI_COMM_WORLD" and stack:
                    key = (me, world(event.communicator, event.receiver), event.msg_tag)
                    sends[key].append(stack[0][1])
            elif kind in ("MpiRecv", "MpiIrecv"):
                if event.communicator.name == "MPI_COMM_WORLD" and stack:
                    key = (world(event.communicator, event.sender), me, event.msg_tag)
                    open_recvs[lid].append(key)

    waited = defaultdict(lambda: defaultdict(int))
    late = defaultdict(lambda: defaultdict(int))
    patterns = {p: {"waited_ns": 0, "instances": 0} for p in PATTERNS}

    def wait(enter, until, leave):
        return max(0, min(until, leave) - enter)

    counts = {len(colls[r]) for r in range(nranks)}
    mismatched = 0 if len(counts) == 1 else 1
    n = min(counts) if counts else 0
    for i in range(n):
        parts = [colls[r][i] for r in range(nranks)]
        if len({p[0] for p in parts}) != 1:
            mismatched += 1
            continue
        op, root = parts[0][0], parts[0][1]
        pattern = PATTERN_OF_OP.get(op)
        if pattern is None:
            continue
        patterns[pattern]["instances"] += 1
        if pattern in ("wait_barrier", "wait_nxn"):
            latest = max(range(nranks), key=lambda r: parts[r][2])
            charged = [(r, wait(parts[r][2], parts[latest][2], parts[r][3])) for r in range(nranks)]
            culprit = latest
        elif pattern == "late_broadcast":
            charged = [
                (r, wait(parts[r][2], parts[root][2], parts[r][3]))
                for r in range(nranks) if r != root
            ]
            culprit = root
        else:
            others = [r for r in range(nranks) if r != root]
            culprit = max(others, key=lambda r: parts[r][2])
            charged = [(root, wait(parts[root][2], parts[culprit][2], parts[root][3]))]
        for r, ns in charged:
            waited[r][pattern] += ns
            late[culprit][pattern] += ns
            patterns[pattern]["waited_ns"] += ns

    # Late Sender: pair the k-th send and receive of each envelope.
    unmatched = 0
    by_call = defaultdict(list)  # call id -> [(sender, send enter)]
    for key, completions in recvs.items():
        posted = sends.get(key, [])
        for k, call in enumerate(completions):
            if k >= len(posted):
                unmatched += 1
                continue
            if k % period == 0:
                by_call[call].append((key[0], posted[k]))
    for call, senders in by_call.items():
        rank, name, enter, leave = calls[call]
        if name not in WAITING_CALLS:
            continue
        patterns["late_sender"]["instances"] += 1
        sender, ns = max(((s, wait(enter, e_s, leave)) for s, e_s in senders), key=lambda x: x[1])
        ns *= period
        waited[rank]["late_sender"] += ns
        late[sender]["late_sender"] += ns
        patterns["late_sender"]["waited_ns"] += ns

    out = {
        "patterns": patterns,
        "ranks": {
            str(r): {"waited_ns": dict(waited[r]), "late_ns": dict(late[r])}
            for r in range(nranks)
        },
        "collectives": n,
        "mismatched": mismatched,
        "unmatched": unmatched,
    }
    json.dump(out, sys.stdout, sort_keys=True)
    sys.stdout.write("\n")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit("usage: trace_waits.py DIR/traces.otf2 P2P_PERIOD")
    main(sys.argv[1], int(sys.argv[2]))
