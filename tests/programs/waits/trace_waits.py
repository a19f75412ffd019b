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
  sampled receive;
- Late Receiver on MPI_COMM_WORLD, the same messages paired the same way
  and sampled alike: for a message sent in a blocking MPI_Send or
  MPI_Ssend (Scalasca's blocking sends: not Bsend, Rsend, Sendrecv or a
  nonblocking send), entered at E_S and left at L_S, whose receive was
  posted at P (the enter of the MPI_Recv, MPI_Sendrecv(_replace) or
  MPI_Mrecv that received it, or of the call that posted the nonblocking
  receive a Wait or Test completed: the call in which its MpiIrecvRequest
  event, with the same request, was written), the sender waited
  `P - E_S` if `E_S < P < L_S`; the culprit is the receiver. Every
  sampled message sent in a blocking send is an instance, waited or not.
  A nonblocking send (its MpiIsend event) completed in a call W of the
  Wait family (the call its MpiIsendComplete event, with the same
  request, was written in), entered at E_W and left at L_W, waited
  `P - E_W` if `E_W < P < L_W`: MPI_Wait and MPI_Waitany are an instance
  each; an MPI_Waitall or MPI_Waitsome that completed sampled sends is
  one, whose wait is the maximum over them, or none if that call waited
  for a late sender (Scalasca's rule). Completions in the Test family
  count nothing.

Prints one JSON object, every figure in nanoseconds:

    {"patterns": {"wait_barrier": {"waited_ns": n, "instances": n}, ...},
     "ranks": {"0": {"waited_ns": {"wait_barrier": n, ...},
                     "late_ns": {"wait_barrier": n, ...}}, ...},
     "collectives": instances on MPI_COMM_WORLD,
     "mismatched": instances whose members disagree on the operation, or
                   ranks whose number of instances differs,
     "unmatched": receives with no send in the archive,
     "unposted": sampled messages sent in a blocking send whose receive's
                 post, or whose send's leave, the archive does not have}
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
# The calls that post the receive they complete: the post of a receive
# completed in them is their enter.
POSTING_CALLS = {"MPI_Recv", "MPI_Sendrecv", "MPI_Sendrecv_replace", "MPI_Mrecv"}
# Scalasca's blocking sends, the only ones a Late Receiver can wait in.
BLOCKING_SENDS = {"MPI_Send", "MPI_Ssend"}
# The calls a nonblocking send's Late Receiver can wait in: alone, or the
# latest receiver of several.
COMPLETING_ONE = {"MPI_Wait", "MPI_Waitany"}
COMPLETING_MANY = {"MPI_Waitall", "MPI_Waitsome"}
PATTERNS = [
    "wait_barrier", "wait_nxn", "late_broadcast", "early_reduce", "late_sender",
    "late_receiver",
]


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
        # Late Receiver: per envelope, in order, each send's blocking call
        # as [enter, leave] (None for any other send; the leave is filled
        # in at the call's Leave), and each receive's post (None if not
        # known).
        blocking = defaultdict(list)    # (s, r, tag) -> [[E_S, L_S] or None]
        posts = defaultdict(list)       # (s, r, tag) -> [P or None]
        open_sends = defaultdict(list)  # location -> [[E_S, L_S]] in the call
        irecv_posts = {}                # (location, request) -> P
        # Nonblocking sends: each is {"call": the call that completed it},
        # kept in `blocking` as well, and live until its MpiIsendComplete.
        isends = {}                     # (location, request) -> that dict
        open_done = defaultdict(list)   # location -> [those dicts] in the call
        done_calls = {}                 # call id -> (rank, name, enter, leave)

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
                if not stack:
                    for send in open_sends.pop(lid, []):
                        send[1] = event.time
                    if open_done[lid]:
                        call = (lid, enter)
                        done_calls[call] = (me, name, enter, event.time)
                        for send in open_done.pop(lid):
                            send["call"] = call
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
                    send = None
                    if kind == "MpiSend" and stack[0][0] in BLOCKING_SENDS:
                        send = [stack[0][1], None]
                        open_sends[lid].append(send)
                    elif kind == "MpiIsend":
                        send = {"call": None}
                        isends[(lid, event.request_id)] = send
                    blocking[key].append(send)
            elif kind == "MpiIsendComplete":
                send = isends.pop((lid, event.request_id), None)
                if send is not None and stack:
                    open_done[lid].append(send)
            elif kind == "MpiIrecvRequest":
                # A nonblocking receive posted (MPI_Irecv, MPI_Imrecv, the
                # MPI_Start of a persistent one): its request is live until
                # the MpiIrecv that completes it, on this location.
                if stack:
                    irecv_posts[(lid, event.request_id)] = stack[0][1]
            elif kind in ("MpiRecv", "MpiIrecv"):
                post = None
                if kind == "MpiIrecv":
                    post = irecv_posts.pop((lid, event.request_id), None)
                elif stack and stack[0][0] in POSTING_CALLS:
                    post = stack[0][1]
                if event.communicator.name == "MPI_COMM_WORLD" and stack:
                    key = (world(event.communicator, event.sender), me, event.msg_tag)
                    open_recvs[lid].append(key)
                    posts[key].append(post)

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
    late_sender_of = {}          # call id -> its Late Sender, unsampled
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
        late_sender_of[call] = ns
        ns *= period
        waited[rank]["late_sender"] += ns
        late[sender]["late_sender"] += ns
        patterns["late_sender"]["waited_ns"] += ns

    # Late Receiver: the k-th blocking send of each envelope against the
    # post of its k-th receive.
    unposted = 0
    many = defaultdict(list)  # call id -> [(receiver, wait)], unsampled

    def charge_lr(sender, receiver, ns):
        waited[sender]["late_receiver"] += ns
        late[receiver]["late_receiver"] += ns
        patterns["late_receiver"]["waited_ns"] += ns

    for key, sent in blocking.items():
        posted = posts.get(key, [])
        for k, send in enumerate(sent):
            if send is None or k % period != 0 or k >= len(posted):
                continue
            p = posted[k]
            if isinstance(send, dict):
                # Completed in a later call, if in one of the Wait family.
                if send["call"] is None:
                    continue
                _, name, e_w, l_w = done_calls[send["call"]]
                if name not in COMPLETING_ONE and name not in COMPLETING_MANY:
                    continue
                if p is None:
                    unposted += 1
                    continue
                ns = p - e_w if e_w < p < l_w else 0
                if name in COMPLETING_MANY:
                    many[send["call"]].append((key[1], ns))
                    continue
                patterns["late_receiver"]["instances"] += 1
                charge_lr(key[0], key[1], ns * period)
                continue
            patterns["late_receiver"]["instances"] += 1
            (e_s, l_s) = send
            if l_s is None or p is None:
                unposted += 1
                continue
            ns = (p - e_s if e_s < p < l_s else 0) * period
            charge_lr(key[0], key[1], ns)
    # A call completing several sends waited for its latest receiver,
    # unless it waited for a late sender.
    for call, waits in many.items():
        patterns["late_receiver"]["instances"] += 1
        if late_sender_of.get(call, 0) > 0:
            continue
        receiver, ns = max(waits, key=lambda x: (x[1], -x[0]))
        charge_lr(done_calls[call][0], receiver, ns * period)

    out = {
        "patterns": patterns,
        "ranks": {
            str(r): {"waited_ns": dict(waited[r]), "late_ns": dict(late[r])}
            for r in range(nranks)
        },
        "collectives": n,
        "mismatched": mismatched,
        "unmatched": unmatched,
        "unposted": unposted,
    }
    json.dump(out, sys.stdout, sort_keys=True)
    sys.stdout.write("\n")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit("usage: trace_waits.py DIR/traces.otf2 P2P_PERIOD")
    main(sys.argv[1], int(sys.argv[2]))
