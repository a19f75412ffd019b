#!/bin/sh
# Slurm Epilog (spike): writes `mpi-observer report` for the job into its
# working directory, owned by the job's user.
#
# Runs as root on every node of the job after the job's processes there are
# gone; the job's first node writes the report from every node's daemon
# (`--url http://NODE:PORT`). Never fails: a failing Epilog drains the node.
# The file is written as the job's user (setpriv), never by root into a
# directory the user controls; `set -C` refuses to replace an existing file or
# follow a symlink there. Nothing is written when the report fails.
MPIOBS_BIN=${MPIOBS_BIN:-mpi-observer}
MPIOBS_PORT=${MPIOBS_PORT:-9479}
log() { logger -t mpi-observer-epilog "job $SLURM_JOB_ID: $*" 2>/dev/null || true; }

first=$(scontrol show hostnames "$SLURM_NODELIST" | head -n 1)
[ "$first" = "$SLURMD_NODENAME" ] || exit 0
[ -n "$SLURM_JOB_WORK_DIR" ] && [ -n "$SLURM_JOB_UID" ] && [ -n "$SLURM_JOB_GID" ] || {
	log "no SLURM_JOB_WORK_DIR/UID/GID; no report"
	exit 0
}
urls=""
for n in $(scontrol show hostnames "$SLURM_NODELIST"); do
	urls="$urls --url http://$n:$MPIOBS_PORT"
done
tmp=$(mktemp) || exit 0
# shellcheck disable=SC2086 # $urls is a list of options
if timeout 20 "$MPIOBS_BIN" report $urls --job "$SLURM_JOB_ID" >"$tmp" 2>"$tmp.err"; then
	setpriv --reuid="$SLURM_JOB_UID" --regid="$SLURM_JOB_GID" --clear-groups \
		sh -c 'set -C; cat > "$1"' sh "$SLURM_JOB_WORK_DIR/mpi-observer-$SLURM_JOB_ID.txt" <"$tmp" ||
		log "cannot write the report in $SLURM_JOB_WORK_DIR"
else
	log "no report: $(head -c 300 "$tmp.err")"
fi
rm -f "$tmp" "$tmp.err"
exit 0
