#!/usr/bin/python3
"""Reads an OTF2 archive with Debian's python3-otf2, a reader that shares
nothing with mpi-observer's writer but the C library, and prints what it
found as one JSON object.

    /usr/bin/python3 read_otf2.py DIR/NAME.otf2

Ranks are world ranks, found as OTF2 defines them: the location group of a
location is a rank's, and its index in the COMM_LOCATIONS group (paradigm
MPI) is its world rank; a peer "rank in comm" is turned into a world rank
through the communicator's COMM_GROUP. The output:

    {
      "clock": {"timer_resolution": int, "global_offset": int,
                "trace_length": int, "realtime_timestamp": int or null},
      "ranks": {"0": {"name": "MPI Rank 0", "node": "host", "pid": int or null,
                      "threads": {"Master thread": events, ...},
                      "events": events of all its threads}, ...},
      "events": every event record read,
      "kinds": {"Enter": n, "MpiSend": n, ...},
      "sends": {"0->1": n, ...},      MpiSend + MpiIsend, by world ranks
                                      ("?" for a peer no communicator
                                      definition resolves)
      "recvs": {"0->1": n, ...},      MpiRecv + MpiIrecv, sender->receiver
      "send_bytes": {"0->1": bytes}, "recv_bytes": {"0->1": bytes},
      "requests": {"isend": n, "isend_complete": n, "irecv_request": n,
                   "irecv": n, "cancelled": n, "test": n,
                   "unmatched": n},   completions with no start, plus starts
                                      never completed or cancelled
      "collectives": {"ALLREDUCE": n, ...},   MpiCollectiveEnd, all ranks
      "rank_collectives": {"0": {"BARRIER": n, ...}, ...},   per world rank
      "region_files": ["MPI"],        the source files of the defined regions
      "collective_begin": n,
      "regions": {"MPI_Send": enters, ...},
      "enter_leave_balanced": bool,   every Leave closes the innermost
                                      Enter, and nothing is left open
      "unbalanced": [first problems, as text],
      "monotonic": bool,              timestamps never decrease per thread
      "in_clock_range": bool,         offset <= t <= offset + length
      "declared_events_match": bool,  Location.number_of_events == read
      "dropped": {"0": n, ...},       last dropped_events metric per rank
      "comms": {"MPI_COMM_WORLD": [world ranks], ...}
    }
"""

import json
import sys
from collections import Counter, defaultdict

import otf2
from otf2.enums import GroupType, Paradigm

UNDEFINED_U64 = 2**64 - 1


def name_of(enum_value):
    return str(enum_value).split(".")[-1]


def main(anchor):
    out = {}
    with otf2.reader.open(anchor) as trace:
        defs = trace.definitions
        clock = defs.clock_properties
        offset, length = clock.global_offset, clock.trace_length
        out["clock"] = {
            "timer_resolution": clock.timer_resolution,
            "global_offset": offset,
            "trace_length": length,
            "realtime_timestamp": None
            if clock.realtime_timestamp == UNDEFINED_U64
            else clock.realtime_timestamp,
        }

        comm_locations = [
            g
            for g in defs.groups
            if g.group_type == GroupType.COMM_LOCATIONS and g.paradigm == Paradigm.MPI
        ]
        if len(comm_locations) > 1 or (not comm_locations and len(defs.location_groups) > 0):
            raise SystemExit("expected one MPI COMM_LOCATIONS group, found %d" % len(comm_locations))
        masters = comm_locations[0].members if comm_locations else []
        world_of_location = {id(loc): i for i, loc in enumerate(masters)}
        world_of_group = {id(loc.group): i for i, loc in enumerate(masters)}

        ranks = {}
        for group in defs.location_groups:
            rank = world_of_group.get(id(group))
            if rank is None:
                raise SystemExit("location group %r has no master in COMM_LOCATIONS" % group.name)
            try:
                pid = group["MPI_OBSERVER::PID"]
            except KeyError:
                pid = None
            parent = group.system_tree_parent
            ranks[rank] = {
                "name": group.name,
                "node": parent.name if parent.class_name == "node" else None,
                "pid": pid,
                "threads": {},
                "events": 0,
            }

        out["comms"] = {}
        for comm in defs.comms:
            out["comms"][comm.name] = [world_of_location[id(loc)] for loc in comm.group.members]

        def world(comm, peer):
            """A peer's world rank, or "?" if its communicator cannot say."""
            members = comm.group.members
            if peer >= len(members) or id(members[peer]) not in world_of_location:
                return "?"
            return world_of_location[id(members[peer])]

        kinds = Counter()
        sends, recvs = Counter(), Counter()
        send_bytes, recv_bytes = Counter(), Counter()
        requests = Counter()
        collectives = Counter()
        rank_collectives = defaultdict(Counter)
        regions = Counter()
        dropped = {}
        stacks = defaultdict(list)
        pending = defaultdict(dict)  # location -> request id -> kind
        last_time = {}
        per_location = Counter()
        unbalanced = []
        monotonic = True
        in_range = True
        total = 0

        for location, event in trace.events:
            total += 1
            lid = id(location)
            per_location[lid] += 1
            kind = type(event).__name__
            kinds[kind] += 1
            me = world_of_group[id(location.group)]
            where = "%s/%s" % (location.group.name, location.name)
            if lid in last_time and event.time < last_time[lid]:
                monotonic = False
            last_time[lid] = event.time
            if not offset <= event.time <= offset + length:
                in_range = False

            if kind == "Enter":
                stacks[lid].append(event.region)
                regions[event.region.name] += 1
            elif kind == "Leave":
                stack = stacks[lid]
                if not stack or stack[-1] is not event.region:
                    unbalanced.append("%s: Leave %s at %d" % (where, event.region.name, event.time))
                else:
                    stack.pop()
            elif kind in ("MpiSend", "MpiIsend"):
                key = "%s->%s" % (me, world(event.communicator, event.receiver))
                sends[key] += 1
                send_bytes[key] += event.msg_length
                if kind == "MpiIsend":
                    requests["isend"] += 1
                    pending[lid][event.request_id] = "isend"
            elif kind in ("MpiRecv", "MpiIrecv"):
                key = "%s->%s" % (world(event.communicator, event.sender), me)
                recvs[key] += 1
                recv_bytes[key] += event.msg_length
                if kind == "MpiIrecv":
                    requests["irecv"] += 1
                    if pending[lid].pop(event.request_id, None) != "irecv_request":
                        requests["unmatched"] += 1
            elif kind == "MpiIsendComplete":
                requests["isend_complete"] += 1
                if pending[lid].pop(event.request_id, None) != "isend":
                    requests["unmatched"] += 1
            elif kind == "MpiIrecvRequest":
                requests["irecv_request"] += 1
                pending[lid][event.request_id] = "irecv_request"
            elif kind == "MpiRequestCancelled":
                requests["cancelled"] += 1
                if pending[lid].pop(event.request_id, None) is None:
                    requests["unmatched"] += 1
            elif kind == "MpiRequestTest":
                requests["test"] += 1
            elif kind == "MpiCollectiveBegin":
                out["collective_begin"] = out.get("collective_begin", 0) + 1
            elif kind == "MpiCollectiveEnd":
                collectives[name_of(event.collective_op)] += 1
                rank_collectives[str(me)][name_of(event.collective_op)] += 1
            elif kind == "Metric":
                for member, value in zip(event.metric.members, event.values):
                    if member.name == "dropped_events":
                        dropped[str(me)] = value

        for location in defs.locations:
            lid = id(location)
            if stacks[lid]:
                unbalanced.append(
                    "%s/%s: %d regions left open"
                    % (location.group.name, location.name, len(stacks[lid]))
                )
            requests["unmatched"] += len(pending[lid])
            rank = ranks[world_of_group[id(location.group)]]
            rank["threads"][location.name] = per_location[lid]
            rank["events"] += per_location[lid]

        out["declared_events_match"] = all(
            location.number_of_events == per_location[id(location)] for location in defs.locations
        )
        out["ranks"] = {str(r): v for r, v in sorted(ranks.items())}
        out["events"] = total
        out["kinds"] = dict(kinds)
        out["sends"] = dict(sends)
        out["recvs"] = dict(recvs)
        out["send_bytes"] = dict(send_bytes)
        out["recv_bytes"] = dict(recv_bytes)
        out["requests"] = {
            k: requests[k]
            for k in ("isend", "isend_complete", "irecv_request", "irecv", "cancelled", "test", "unmatched")
        }
        out["collectives"] = dict(collectives)
        out["rank_collectives"] = {r: dict(c) for r, c in sorted(rank_collectives.items())}
        out["region_files"] = sorted({str(r.source_file) for r in defs.regions})
        out.setdefault("collective_begin", 0)
        out["regions"] = dict(regions)
        out["enter_leave_balanced"] = not unbalanced
        out["unbalanced"] = unbalanced[:10]
        out["monotonic"] = monotonic
        out["in_clock_range"] = in_range
        out["dropped"] = dropped
    json.dump(out, sys.stdout, sort_keys=True)
    sys.stdout.write("\n")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit("usage: read_otf2.py DIR/NAME.otf2")
    main(sys.argv[1])
