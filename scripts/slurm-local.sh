#!/bin/sh
# A single-node Slurm on this machine, for the simulator's `sweep --slurm` test
# (simulations/tests/slurm.rs): munged, slurmctld and slurmd on 127.0.0.1, their state, logs
# and configuration under DIR.
#
#   scripts/slurm-local.sh start DIR   # prints the slurm.conf to export as SLURM_CONF
#   scripts/slurm-local.sh stop DIR
#
# Needs root (the daemons) and Debian's slurmctld, slurmd, slurm-client and munge (.ci/run
# installs them). Nothing listens beyond 127.0.0.1 but Slurm's own ports (6817, 6818).
set -eu
cmd=${1:?start or stop}
dir=$(realpath -m "${2:?DIR}")
conf="$dir/slurm.conf"

stop() {
  for d in slurmd slurmctld; do
    if [ -f "$dir/$d.pid" ]; then
      kill "$(cat "$dir/$d.pid")" 2>/dev/null || true
      rm -f "$dir/$d.pid"
    fi
  done
}

case "$cmd" in
stop)
  stop
  exit 0
  ;;
start) ;;
*)
  echo "usage: $0 start|stop DIR" >&2
  exit 2
  ;;
esac

stop
mkdir -p "$dir/state" "$dir/spool"
host=$(hostname -s)
cat > "$conf" <<CONF
ClusterName=gridlease
SlurmctldHost=$host(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ReturnToService=2
MpiDefault=none
NodeName=$host NodeAddr=127.0.0.1 CPUs=$(nproc) State=UNKNOWN
PartitionName=gl Nodes=$host Default=YES MaxTime=INFINITE State=UP
CONF

# munged: the Debian package made its key; started unless one already answers.
if ! munge -n >/dev/null 2>&1; then
  mkdir -p /run/munge
  chown munge:munge /run/munge
  runuser -u munge -- /usr/sbin/munged
fi
slurmctld -f "$conf"
slurmd -f "$conf"

# Ready when the node is idle (at most 30 s).
i=0
until [ "$(SLURM_CONF=$conf sinfo -h -o %t 2>/dev/null)" = "idle" ]; do
  i=$((i + 1))
  if [ "$i" -gt 60 ]; then
    echo "slurm-local: the node did not become idle in 30 s; logs in $dir" >&2
    tail -n 20 "$dir/slurmctld.log" "$dir/slurmd.log" >&2 || true
    exit 1
  fi
  sleep 0.5
done
echo "$conf"
