#!/usr/bin/env bash
# Instructions per MPI call on the shim's hot path, as callgrind counts
# them, for `cargo xtask bench insns` (xtask/src/bench_insns.rs), which runs
# it on this machine and in an arm64 guest alike: it needs only bash, the
# MPI compiler wrappers and valgrind.
#
# usage: insns.sh SHIM WORKDIR openmpi|mpich...
#
# For each MPI: insns.c and the pass-through tool (passthrough.c) built
# with its mpicc; then each call (rank, sendrecv) in each configuration
# (bare: no shim; empty: the shim with an empty list; pass1: one
# pass-through tool; stats: the stats layer) run as a singleton under
# callgrind, counting only timed_loop's INSNS_CALLS calls. One line each:
#   insns mpi=M function=F mode=C calls=N ir=I
set -euo pipefail
shim=$1 work=$2
shift 2
here=$(cd "$(dirname "$0")" && pwd)
calls=${INSNS_CALLS:-20000}
mkdir -p "$work"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# Shared memory only, as the other benches.
export OMPI_MCA_btl=self,vader OMPI_MCA_btl_vader_single_copy_mechanism=none
for mpi in "$@"; do
    cc=mpicc.$mpi
    "$cc" -O2 -g -o "$work/insns-$mpi" "$here/insns.c"
    "$cc" -O2 -shared -fPIC -o "$work/passthrough-$mpi.so" "$here/passthrough.c"
    for fn in rank sendrecv; do
        for mode in bare empty pass1 stats; do
            preload=() list=()
            case $mode in
            bare) ;;
            empty) preload=("LD_PRELOAD=$shim") list=("MPI_TOOLS_ENTRY=") ;;
            pass1) preload=("LD_PRELOAD=$shim") list=("MPI_TOOLS_ENTRY=$work/passthrough-$mpi.so") ;;
            stats) preload=("LD_PRELOAD=$shim") list=("MPI_TOOLS_ENTRY=stats") ;;
            esac
            out="$work/callgrind.$mpi.$fn.$mode"
            rm -f "$out"
            env "${preload[@]}" "${list[@]}" valgrind --quiet --tool=callgrind \
                --toggle-collect=timed_loop --callgrind-out-file="$out" \
                "$work/insns-$mpi" "$fn" "$calls" >"$out.stdout" 2>"$out.stderr" || {
                echo "insns: $mpi $fn $mode failed:" >&2
                cat "$out.stderr" >&2
                exit 1
            }
            # sed, not awk: the arm64 guest's root has no awk alternative.
            ir=$(sed -n 's/^totals: \([0-9]*\).*/\1/p' "$out")
            echo "insns mpi=$mpi function=$fn mode=$mode calls=$calls ir=${ir:-none}"
        done
    done
done
