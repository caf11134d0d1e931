#!/usr/bin/env bash
# slurm_cluster.sh - a real 2-node Slurm cluster on 127.0.0.1 for the tests in tests/slurm/: one
# munged (its own key and socket), one slurmctld, two slurmd (-N n1, -N n2), no slurmdbd, all as the
# user running it, everything under one folder the caller owns.
#
# Usage: slurm_cluster.sh DIR start CTLD_PORT NODE_PORT [CPUS]
#          (n1 listens on NODE_PORT, n2 on NODE_PORT+1; CPUS per node, default 1)
#        slurm_cluster.sh DIR stop          cancel the jobs, then stop the daemons of DIR/run/*.pid
#        slurm_cluster.sh DIR kill-node N   SIGKILL node N's slurmd, its slurmstepd and their tasks
#        slurm_cluster.sh DIR start-node N  start node N's slurmd again
#        slurm_cluster.sh DIR errors        the last error lines of the daemons' logs (post-mortem)
# Client commands need SLURM_CONF=DIR/etc/slurm.conf. Packages (deploy/install-deps.sh TEST_PKGS):
#   munge slurmctld slurmd slurm-client.
set -euo pipefail
export PATH=$PATH:/usr/sbin:/sbin
D=$(realpath -m "$1")
CMD=$2
shift 2
export SLURM_CONF=$D/etc/slurm.conf

# Unix socket paths hold at most 107 bytes, and slurmd makes one per step in its spool folder
# (<spool>/<node>_<job>.<step>, the batch step 4294967291): a job whose socket path does not fit
# never launches ("launch failed requeued held"). Under a long $TMPDIR the spool folders and
# munged's socket live in a short folder of /tmp instead, named in DIR/run/sockets, removed by stop.
SOCKETS=$D
[[ -f $D/run/sockets ]] && SOCKETS=$(<"$D/run/sockets")
SOCK=$SOCKETS/munge/sock

fail() { echo "slurm_cluster: $*" >&2; exit 1; }

# pid_of FILE NAME: the pid in FILE if that process is alive, named NAME and started with DIR
pid_of() {
  local pid
  pid=$(tr -dc 0-9 2>/dev/null <"$1") || return 1
  [[ -n $pid && $(cat /proc/"$pid"/comm 2>/dev/null) == "$2"* ]] || return 1
  tr '\0' ' ' </proc/"$pid"/cmdline | grep -qF -- "$D/" || return 1
  echo "$pid"
}

retry() { # retry TENTHS CMD...: run CMD every 0.1 s until it succeeds, at most TENTHS times
  local n=$1
  shift
  while ((n-- > 0)); do "$@" >/dev/null 2>&1 && return 0; sleep 0.1; done
  return 1
}

write_config() { # CTLD_PORT NODE_PORT CPUS
  cat >"$SLURM_CONF" <<CONF
ClusterName=sftctltest
SlurmctldHost=$(hostname -s)(127.0.0.1)
SlurmctldPort=$1
SlurmUser=$(id -un)
SlurmdUser=$(id -un)
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$SOCK,cred_expire=5
StateSaveLocation=$D/state
SlurmdSpoolDir=$SOCKETS/spool/%n
SlurmctldPidFile=$D/run/slurmctld.pid
SlurmdPidFile=$D/run/slurmd-%n.pid
SlurmctldLogFile=$D/log/slurmctld.log
SlurmdLogFile=$D/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
MailProg=/bin/true
PropagateResourceLimits=NONE
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=1,bf_interval=1
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
SlurmdTimeout=4
SlurmctldTimeout=10
MessageTimeout=5
KillWait=2
InactiveLimit=0
MinJobAge=300
ReturnToService=2
NodeName=n[1-2] NodeHostname=localhost NodeAddr=127.0.0.1 Port=$2-$(($2 + 1)) CPUs=$3 RealMemory=1000 State=UNKNOWN
PartitionName=debug Nodes=n[1-2] Default=YES MaxTime=INFINITE State=UP
CONF
}

both_idle() { [[ $(sinfo -h -N -o '%t' | grep -cxE 'idle|mix|alloc') == 2 ]]; }

start_node() {
  pid_of "$D/run/slurmd-$1.pid" slurmd >/dev/null && return 0
  slurmd -f "$SLURM_CONF" -N "$1" || fail "slurmd $1 did not start: $D/log/slurmd-$1.log"
}

start() { # CTLD_PORT NODE_PORT [CPUS]
  for tool in munged slurmctld slurmd sbatch; do
    command -v $tool >/dev/null || fail "$tool is missing: apt-get install munge slurmctld slurmd slurm-client"
  done
  mkdir -p "$D"/{etc,state,log,run}
  local longest=$D/spool/n1/n1_4294967295.4294967295
  if ((${#longest} > 107)); then
    SOCKETS=$(mktemp -d /tmp/sftctl-slurm.XXXXXX)
    echo "$SOCKETS" >"$D/run/sockets"
    SOCK=$SOCKETS/munge/sock
  fi
  mkdir -p "$SOCKETS"/{munge,spool/n1,spool/n2}
  # munged wants its socket folder searchable by all
  chmod 755 "$D" "$D"/{etc,state,log,run} "$SOCKETS" "$SOCKETS/munge"
  write_config "$1" "$2" "${3:-1}"
  dd if=/dev/urandom of="$SOCKETS/munge/key" bs=1024 count=1 status=none
  chmod 600 "$SOCKETS/munge/key"
  # --force: the test's private TMPDIR (mode 700, tests/util/tmpdir_guard.cpp) is not searchable by
  # all, which munged otherwise refuses for its socket's folders; only this user talks to it.
  munged --force --socket="$SOCK" --key-file="$SOCKETS/munge/key" --pid-file="$D/run/munged.pid" \
    --log-file="$D/log/munged.log" --seed-file="$SOCKETS/munge/seed" || fail "munged did not start"
  retry 100 munge -S "$SOCK" -n || fail "munged does not answer"
  slurmctld -f "$SLURM_CONF" || fail "slurmctld did not start: $D/log/slurmctld.log"
  retry 300 scontrol ping || fail "slurmctld does not answer: $D/log/slurmctld.log"
  start_node n1
  start_node n2
  retry 300 both_idle || { sinfo -N >&2; fail "nodes not idle"; }
}

# pids of slurmstepd processes of this cluster (their environment names our SLURM_CONF), with
# NODE: only that node's (they hold its log file open)
stepds() {
  local c p f
  while read -r c; do
    p=${c%/comm}
    if [[ -n ${1:-} ]]; then
      for f in "$p"/fd/*; do
        if [[ $(readlink "$f" 2>/dev/null) == "$D/log/slurmd-$1.log" ]]; then
          echo "${p#/proc/}"
          break
        fi
      done
    elif tr '\0' '\n' <"$p/environ" 2>/dev/null | grep -qxF "SLURM_CONF=$SLURM_CONF"; then
      echo "${p#/proc/}"
    fi
  done < <(grep -lx slurmstepd /proc/[0-9]*/comm 2>/dev/null)
  true
}

# the given pids and all their descendants
tree() {
  local set=" $* " before=""
  while [[ $set != "$before" ]]; do
    before=$set
    for s in /proc/[0-9]*/stat; do
      read -r pid _ _ ppid _ <"$s" 2>/dev/null || continue
      [[ $set == *" $ppid "* && $set != *" $pid "* ]] && set="$set$pid "
    done
  done
  # shellcheck disable=SC2086 # unquoted: squeezes the spaces
  echo $set
}

# gone PID: no such process, or only its zombie is left
gone() {
  local st
  read -r _ _ st _ 2>/dev/null </proc/"$1"/stat || return 0
  [[ $st == Z ]]
}

stop_pidfile() { # FILE NAME [SIGNAL]
  local pid
  pid=$(pid_of "$1" "$2") || return 0
  kill -"${3:-TERM}" "$pid" 2>/dev/null || true
  retry 150 gone "$pid" || kill -KILL "$pid" 2>/dev/null || true
}

stop() {
  if pid_of "$D/run/slurmctld.pid" slurmctld >/dev/null; then
    scancel --user="$(id -un)" 2>/dev/null || true
    retry 50 test -z "$(squeue -h -o %A 2>/dev/null)" || true
  fi
  stop_pidfile "$D/run/slurmd-n1.pid" slurmd &
  stop_pidfile "$D/run/slurmd-n2.pid" slurmd &
  stop_pidfile "$D/run/slurmctld.pid" slurmctld &
  wait
  # munged keeps nothing worth saving here (its key and seed are this cluster's), and takes 2 s to exit
  stop_pidfile "$D/run/munged.pid" munged KILL
  local left
  left=$(stepds)
  # shellcheck disable=SC2046,SC2086 # pid lists, split on purpose
  [[ -z $left ]] || kill -KILL $(tree $left) 2>/dev/null || true
  if [[ $SOCKETS != "$D" && $SOCKETS == /tmp/sftctl-slurm.* ]]; then
    rm -rf "$SOCKETS" "$D/run/sockets"
  fi
}

case $CMD in
  start) start "$@" ;;
  stop) stop ;;
  start-node) start_node "$1" ;;
  kill-node)
    pid=$(pid_of "$D/run/slurmd-$1.pid" slurmd) || fail "slurmd $1 is not running"
    victims="$pid $(stepds "$1")"
    # shellcheck disable=SC2046,SC2086 # pid lists, split on purpose
    kill -KILL $(tree $victims) 2>/dev/null || true
    ;;
  errors)
    for f in "$D"/log/slurmctld.log "$D"/log/slurmd-n1.log "$D"/log/slurmd-n2.log; do
      [[ -f $f ]] || continue
      echo "== $f"
      grep -iE 'error|fatal' "$f" | grep -vE 'pmix|state file|Trying backup' | tail -n 15 || true
    done
    ;;
  *) fail "unknown command $CMD" ;;
esac
