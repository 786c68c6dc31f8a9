#!/usr/bin/env bash
# A private SLURM on this machine, to try the sbatch scripts for real (the test suite's
# real-SLURM tests use it): munged, slurmctld and two slurmd (nodes cfl1 and cfl2, both this
# machine: a heterogeneous job needs its components on different nodes) started by hand, with
# their config, keys, sockets, state and logs in one folder, on free ports, so that nothing of
# a system SLURM (if any) is used or touched.
#   slurm/local_cluster.sh start DIR   installs slurm-wlm + munge with apt where sbatch is missing
#                                      (root with apt-get only), starts the daemons, waits until
#                                      both nodes are idle; then: export SLURM_CONF=DIR/slurm.conf
#   slurm/local_cluster.sh stop DIR    cancels the cluster's jobs, stops its daemons
#   CFL_SLURM_NODES="NAME:NETNS:ADDR ..." (with CFL_SLURM_HEAD=ADDR, the controller's address
#   as the nodes reach it): one slurmd per node inside network namespace NETNS (made
#   beforehand, e.g. by the test suite's emulated nodes) with its own host name NAME, so that
#   a job's ranks on different nodes talk over a network; default: cfl1 and cfl2 on 127.0.0.1.
# Exit 3 with one line when this machine cannot host it (not root, no apt, install failed).
#   CFL_SLURM_CPUS (default 192), CFL_SLURM_GPUS (default 48): what each node declares:
#   declared, not real (SlurmdParameters=config_overrides, no binding). The default fits the
#   multi-node script's 1 + 40 tasks and 40 GPUs for `sbatch --test-only`; the GPUs are
#   stood in for by plain files: SLURM hands them out and sets CUDA_VISIBLE_DEVICES, and CUDA
#   sees none of them.
#   Requeued jobs wait AuthInfo's cred_expire before they start again (SLURM's default 120 s);
#   here it is 10 s (CFL_SLURM_CRED_EXPIRE) so that a requeue cycle stays short. The backfill
#   scheduler (the only one that starts heterogeneous jobs) and the main one run every 2 s
#   (defaults 30 s and 60 s: a requeued job waited a minute for the main one after its 10 s);
#   finished jobs stay in `scontrol show job` for an hour (MinJobAge, default 300 s);
#   cancelled steps get SIGKILL 5 s after SIGTERM (KillWait, default 30 s). Job ids start from
#   the clock (FirstJobId), as on a long-lived cluster: MPICH names its shared-memory segment
#   after the step, and a segment a killed step left in /dev/shm would stall a new step of the
#   same id in MPI_Init.
set -euo pipefail

cannot() { echo "local SLURM: $*" >&2; exit 3; }

install_slurm() {  # slurm-wlm (slurmctld, slurmd, sbatch, srun with pmi2/pmix) and munge
    command -v sbatch > /dev/null && command -v slurmd > /dev/null && command -v munged > /dev/null && return
    command -v apt-get > /dev/null || cannot "sbatch is missing and there is no apt-get to install slurm-wlm"
    export DEBIAN_FRONTEND=noninteractive
    { apt-get update -qq && apt-get install -y -qq slurm-wlm munge libpmix-dev; } > "$1/apt.log" 2>&1 \
        || cannot "apt-get install slurm-wlm munge libpmix-dev failed (see $1/apt.log)"
}

free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

NODES=${CFL_SLURM_NODES:-cfl1:-:127.0.0.1 cfl2:-:127.0.0.1}
HEAD=${CFL_SLURM_HEAD:-127.0.0.1}
node_names() { for node in $NODES; do printf '%s\n' "${node%%:*}"; done; }

write_config() {  # one NodeName per entry of NODES, each slurmd on its own port
    local dir=$1 cpus=${CFL_SLURM_CPUS:-192} gpus=${CFL_SLURM_GPUS:-48} node name addr names
    mkdir -p "$dir/ctld" "$dir/munge" "$dir/gpu"
    cat > "$dir/slurm.conf" <<EOF
ClusterName=cfllocal
FirstJobId=$(( $(date +%s) % 50000000 + 1000 ))
SlurmctldHost=$(hostname -s)($HEAD)
SlurmctldPort=$(free_port)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$dir/munge/munge.socket,cred_expire=${CFL_SLURM_CRED_EXPIRE:-10}
StateSaveLocation=$dir/ctld
SlurmdSpoolDir=$dir/spool-%n
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd-%n.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
SchedulerParameters=bf_interval=2,sched_interval=2
KillWait=5
MinJobAge=3600
MpiDefault=none
ReturnToService=2
GresTypes=gpu
EOF
    for node in $NODES; do
        name=${node%%:*} addr=${node##*:}
        echo "NodeName=$name NodeAddr=$addr Port=$(free_port) CPUs=$cpus RealMemory=2000000 Gres=gpu:$gpus State=UNKNOWN" \
            >> "$dir/slurm.conf"
    done
    names=$(node_names | paste -sd,)
    echo "PartitionName=local Nodes=$names Default=YES MaxTime=INFINITE State=UP" >> "$dir/slurm.conf"
    # slurmd drops GPUs without device files: plain files stand in for them
    for i in $(seq 0 $((gpus - 1))); do : > "$dir/gpu/gpu$i"; done
    echo "NodeName=$names Name=gpu File=$dir/gpu/gpu[0-$((gpus - 1))]" > "$dir/gres.conf"
}

start() {
    local dir=$1
    [ "$(id -u)" = 0 ] || cannot "slurmd must run as root (and installing slurm-wlm needs root)"
    mkdir -p "$dir"
    dir=$(cd "$dir" && pwd)
    install_slurm "$dir"
    write_config "$dir"
    # munged refuses a key others can read, and runs as root only with --force
    dd if=/dev/urandom of="$dir/munge/munge.key" bs=1024 count=1 status=none
    chmod 700 "$dir/munge" && chmod 600 "$dir/munge/munge.key"
    munged --force --socket="$dir/munge/munge.socket" --key-file="$dir/munge/munge.key" \
        --pid-file="$dir/munged.pid" --log-file="$dir/munged.log" --seed-file="$dir/munge/seed"
    export SLURM_CONF=$dir/slurm.conf
    slurmctld -f "$SLURM_CONF"
    local node name netns count=0
    for node in $NODES; do
        name=${node%%:*} netns=${node#*:} netns=${netns%%:*}
        if [ "$netns" = - ]; then
            slurmd -f "$SLURM_CONF" -N "$name"
        else  # the node's own network, host name and hosts file (`ip netns exec` would also hide
            # /sys/fs/cgroup, which slurmd needs); slurmd daemonizes inside them
            nsenter --net="/run/netns/$netns" unshare --uts --mount bash -c '
                hostname "$0" && { [ ! -f "$2" ] || mount --bind "$2" /etc/hosts; } && exec slurmd -f "$1" -N "$0"' \
                "$name" "$SLURM_CONF" "/etc/netns/$netns/hosts"
        fi
        count=$((count + 1))
    done
    for _ in $(seq 100); do  # the nodes register within a few seconds
        if [ "$(sinfo -h -N -o %T 2> /dev/null | grep -cx idle)" = "$count" ]; then
            echo "export SLURM_CONF=$SLURM_CONF"
            return
        fi
        sleep 0.2
    done
    tail -n 5 "$dir"/slurmctld.log "$dir"/slurmd-*.log >&2 || true
    stop "$dir"
    cannot "the nodes did not become idle within 20 s (logs in $dir)"
}

stop_daemon() {  # stop_daemon PIDFILE: SIGTERM, then wait up to 10 s for it to exit
    [ -f "$1" ] || return 0
    local pid
    pid=$(cat "$1")
    kill "$pid" 2> /dev/null || return 0
    for _ in $(seq 100); do kill -0 "$pid" 2> /dev/null || return 0; sleep 0.1; done
    kill -KILL "$pid" 2> /dev/null || true
}

stop() {
    local dir=$1
    export SLURM_CONF=$dir/slurm.conf
    if [ -f "$dir/slurmctld.pid" ] && kill -0 "$(cat "$dir/slurmctld.pid")" 2> /dev/null; then
        scancel --quiet --full --user="$(id -un)" 2> /dev/null || true
        for _ in $(seq 300); do  # the jobs' steps end (SIGKILL KillWait=5 s after SIGTERM) before the daemons do
            [ -z "$(squeue -h -o %i 2> /dev/null)" ] && break
            sleep 0.2
        done
    fi
    for name in $(node_names); do stop_daemon "$dir/slurmd-$name.pid"; done
    stop_daemon "$dir/slurmctld.pid"
    stop_daemon "$dir/munged.pid"
}

case "${1:-}" in
    start|stop) [ $# = 2 ] || { echo "usage: $0 start|stop DIR" >&2; exit 2; }; "$1" "$2" ;;
    *) echo "usage: $0 start|stop DIR" >&2; exit 2 ;;
esac
