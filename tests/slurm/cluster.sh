#!/bin/sh
# A local Slurm cluster for the tests: slurmctld and several `slurmd -N nX`
# on this host, everything (config, state, spool, TmpFS, logs, pid files) in
# one directory.
#
#   cluster.sh start DIR   start the cluster in DIR (an empty directory, e.g.
#                          from mktemp -d); exit 0 when every node is idle,
#                          77 (with the reason on stderr) when Slurm cannot
#                          run here, 1 on any other failure (after cleaning up)
#   cluster.sh env DIR     print the variables a client needs: eval it
#   cluster.sh stop DIR    stop exactly what start started (and job steps of
#                          this cluster left behind), then remove DIR
#
# Environment: MT_SLURM_NODES (2..4, default 4) nodes n1..nN; nodes are split
# over two switches in topology.conf (TopologyPlugin=topology/tree), so tasks
# see a meaningful SLURM_TOPOLOGY_ADDR (e.g. "top.s0.n1"). mpi.conf sets
# PMIxCollFence=ring so that every PMIx fence is a barrier (see cmd_start).
#
# munge: a munged already answering on the system socket is used; otherwise
# one is started for this cluster with its own socket in DIR (key: the system
# key /etc/munge/munge.key if there is one, else a new one in DIR) and stopped
# by `stop`. Ports: chosen free at start. Needs root (SlurmUser=root).
set -u

die() { echo "cluster.sh: $*" >&2; exit 1; }
skip() { echo "cluster.sh: cannot start Slurm here: $*" >&2; exit 77; }

# A TCP port no socket uses (listening or connected: a port an outgoing connection
# holds cannot be bound either): random start below the kernel's ephemeral range
# (ip_local_port_range), where the ports of other programs' outgoing connections (MPI
# jobs of tests running beside this one) come from, then upwards.
port_free() {
    hex=$(printf ':%04X' "$1")
    ! awk -v p="$hex" 'substr($2, length($2) - 4) == p { f = 1 } END { exit !f }' \
        /proc/net/tcp /proc/net/tcp6 2>/dev/null
}
ephemeral_low() {
    lo=$(awk '{ print $1 }' /proc/sys/net/ipv4/ip_local_port_range 2>/dev/null)
    case "$lo" in '' | *[!0-9]*) lo=32768 ;; esac
    echo "$lo"
}
next_free_port() {
    p=$1
    while ! port_free "$p" || case " $taken " in *" $p "*) true ;; *) false ;; esac; do
        p=$((p + 1))
    done
    taken="$taken $p"
    echo "$p"
}

# Stops the processes whose pid files are given: TERM to all, up to 5 s for
# them to go, then KILL.
stop_pidfiles() {
    pids=""
    for f in "$@"; do
        [ -s "$f" ] && pids="$pids $(cat "$f")"
    done
    [ -n "$pids" ] || return 0
    kill $pids 2>/dev/null
    i=0
    while [ $i -lt 50 ]; do
        alive=""
        for pid in $pids; do kill -0 "$pid" 2>/dev/null && alive="$alive $pid"; done
        [ -n "$alive" ] || return 0
        sleep 0.1
        i=$((i + 1))
    done
    kill -9 $alive 2>/dev/null
    return 0
}

# slurmstepd processes of this cluster (they carry its SLURM_CONF).
stepds() {
    for e in /proc/[0-9]*/environ; do
        pid=${e#/proc/}; pid=${pid%/environ}
        [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = slurmstepd ] || continue
        tr '\0' '\n' < "$e" 2>/dev/null | grep -qx "SLURM_CONF=$1/slurm.conf" && echo "$pid"
    done
}

cmd_env() {
    echo "SLURM_CONF='$1/slurm.conf'; export SLURM_CONF"
}

cmd_stop() {
    d=$1
    [ -f "$d/slurm.conf" ] || die "stop: $d is not a cluster directory"
    SLURM_CONF=$d/slurm.conf; export SLURM_CONF
    if [ -s "$d/ctld.pid" ] && kill -0 "$(cat "$d/ctld.pid")" 2>/dev/null; then
        jobs=$(timeout 5 squeue -h -o %i 2>/dev/null)
        [ -n "$jobs" ] && timeout 5 scancel --quiet $jobs 2>/dev/null
    fi
    stop_pidfiles "$d"/slurmd-*.pid "$d/ctld.pid"
    for pid in $(stepds "$d"); do kill -9 "$pid" 2>/dev/null; done
    [ -f "$d/munge/started" ] && stop_pidfiles "$d/munge/munged.pid"
    rm -rf "$d"
}

cmd_start() {
    d=$1
    [ "$(id -u)" -eq 0 ] || skip "the local cluster runs its daemons as root (SlurmUser=root)"
    for p in slurmctld slurmd srun sbatch sinfo munge munged; do
        command -v "$p" >/dev/null 2>&1 || [ -x "/usr/sbin/$p" ] || skip "$p is not installed"
    done
    export PATH="$PATH:/usr/sbin"
    mkdir -p "$d" || die "cannot create $d"
    d=$(cd "$d" && pwd)
    nodes=${MT_SLURM_NODES:-4}
    [ "$nodes" -ge 2 ] && [ "$nodes" -le 4 ] || die "MT_SLURM_NODES must be 2..4"
    host=$(hostname -s)

    # munge
    authinfo=""
    if munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
        : # a munged answers on the system socket: use it
    else
        mkdir -p "$d/munge" && chmod 755 "$d/munge"
        if [ -r /etc/munge/munge.key ]; then
            install -m 600 /etc/munge/munge.key "$d/munge/munge.key"
        else
            dd if=/dev/urandom of="$d/munge/munge.key" bs=1024 count=1 2>/dev/null
            chmod 600 "$d/munge/munge.key"
        fi
        munged --force -S "$d/munge/munge.socket" --key-file="$d/munge/munge.key" \
            --log-file="$d/munge/munged.log" --pid-file="$d/munge/munged.pid" \
            --seed-file="$d/munge/munged.seed" 2>"$d/munge/start.err" ||
            { cat "$d/munge/start.err" >&2; rm -rf "$d"; skip "munged does not start"; }
        touch "$d/munge/started"
        authinfo="AuthInfo=socket=$d/munge/munge.socket"
    fi

    # config
    taken=""
    # 10000 up to the ephemeral range, room left for the nodes' ports (base + 10 i)
    span=$(( $(ephemeral_low) - 10000 - 1000 ))
    [ "$span" -ge 1000 ] || span=1000
    base=$(( ($$ * 7919 + $(date +%s)) % span + 10000 ))
    ctld_port=$(next_free_port "$base")
    mkdir -p "$d/state"
    {
        echo "ClusterName=mtlocal"
        echo "SlurmctldHost=$host"
        echo "SlurmUser=root"
        echo "SlurmdUser=root"
        echo "AuthType=auth/munge"
        [ -n "$authinfo" ] && echo "$authinfo"
        echo "StateSaveLocation=$d/state"
        echo "SlurmdSpoolDir=$d/spool-%n"
        echo "SlurmctldPidFile=$d/ctld.pid"
        echo "SlurmdPidFile=$d/slurmd-%n.pid"
        echo "SlurmctldLogFile=$d/ctld.log"
        echo "SlurmdLogFile=$d/slurmd-%n.log"
        echo "SlurmctldPort=$ctld_port"
        echo "ProctrackType=proctrack/linuxproc"
        echo "TaskPlugin=task/none"
        echo "SelectType=select/cons_tres"
        echo "SelectTypeParameters=CR_Core"
        echo "MpiDefault=none"
        echo "ReturnToService=2"
        echo "TopologyPlugin=topology/tree"
        echo "TmpFS=$d/tmpfs-%n"
        echo "KillWait=2"
        echo "MinJobAge=5"
        echo "InactiveLimit=0"
        i=1
        while [ $i -le "$nodes" ]; do
            mkdir -p "$d/spool-n$i" "$d/tmpfs-n$i"
            echo "NodeName=n$i NodeHostname=$host NodeAddr=127.0.0.1 Port=$(next_free_port $((base + 10 * i))) CPUs=2 RealMemory=1000"
            i=$((i + 1))
        done
        echo "PartitionName=debug Nodes=n[1-$nodes] Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:8"
    } > "$d/slurm.conf"
    half=$((nodes / 2))
    {
        echo "SwitchName=s0 Nodes=n[1-$half]"
        echo "SwitchName=s1 Nodes=n[$((half + 1))-$nodes]"
        echo "SwitchName=top Switches=s[0-1]"
    } > "$d/topology.conf"
    # mpi/pmix: every fence goes round the ring. By default (PMIxCollFence
    # unset = mixed) a fence without data takes the tree algorithm, and here
    # (Slurm 22.05, several slurmd on one host) that fence does not wait for
    # the other nodes: the tasks of one node leave it before those of the
    # other arrive. OpenMPI's MPI_Init ends with such a fence as its barrier;
    # a task that leaves MPI_Init early sends to a peer still waiting for the
    # modex inside MPI_Init, whose TCP BTL then calls a receive callback the
    # PML has not registered yet: SIGSEGV at address 0 in MPI_Init, now and
    # then, more often on a loaded machine.
    echo "PMIxCollFence=ring" > "$d/mpi.conf"

    # daemons
    SLURM_CONF=$d/slurm.conf; export SLURM_CONF
    slurmctld -f "$d/slurm.conf" 2>"$d/ctld.err" ||
        { cat "$d/ctld.err" >&2; cmd_stop "$d"; die "slurmctld does not start"; }
    i=1
    while [ $i -le "$nodes" ]; do
        slurmd -f "$d/slurm.conf" -N "n$i" 2>"$d/slurmd-n$i.err" ||
            { cat "$d/slurmd-n$i.err" >&2; cmd_stop "$d"; die "slurmd -N n$i does not start"; }
        i=$((i + 1))
    done
    # every node idle within 60 s (a loaded 2-core machine can be slow)
    i=0
    while :; do
        idle=$(sinfo -h -N -o '%N %T' 2>/dev/null | grep -c ' idle$')
        [ "$idle" -eq "$nodes" ] && break
        i=$((i + 1))
        if [ $i -gt 300 ]; then
            sinfo -N >&2
            tail -n 20 "$d/ctld.log" >&2
            for f in "$d"/slurmd-n*.log; do [ -f "$f" ] && { echo "== $f" >&2; tail -n 5 "$f" >&2; }; done
            cmd_stop "$d"
            die "the nodes did not become idle in 60 s"
        fi
        sleep 0.2
    done
}

[ $# -eq 2 ] || { echo "usage: $0 start|stop|env DIR" >&2; exit 2; }
case $1 in
start) cmd_start "$2" ;;
stop) cmd_stop "$2" ;;
env) cmd_env "$2" ;;
*) echo "usage: $0 start|stop|env DIR" >&2; exit 2 ;;
esac
