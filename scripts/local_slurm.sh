#!/usr/bin/env bash
# A real single-host SLURM for gpupack's tests and CI: munge, MariaDB + slurmdbd (so sacct works), slurmctld and
# three slurmd nodes, one per partition p100 / v100 / a100, each with 2 typed fake GPUs (character devices).
#
#   scripts/local_slurm.sh start    install Debian's packages if missing, write the config, start every daemon
#   scripts/local_slurm.sh stop     stop the daemons (state is kept under $GPUPACK_SLURM_DIR)
#   scripts/local_slurm.sh status   sinfo, or exit 1 when slurmctld does not answer
#   scripts/local_slurm.sh env      print `export SLURM_CONF=...` for your shell: eval "$(scripts/local_slurm.sh env)"
#   scripts/local_slurm.sh limits [MAX_ARRAY_SIZE [MAX_SUBMIT_JOBS]]
#                                   a site's limits, lowered for a test: MaxArraySize (slurm.conf, scontrol reconfigure)
#                                   and this user's MaxSubmitJobs (sacctmgr); with no number, SLURM's defaults again
#
# Needs root (it installs packages and runs the daemons as root). Everything lives in $GPUPACK_SLURM_DIR.
set -euo pipefail

BASE=${GPUPACK_SLURM_DIR:-/tmp/gpupack-slurm}
CLUSTER=gpupack
ETC=$BASE/etc
export SLURM_CONF=$ETC/slurm.conf
HOST=$(hostname -s)
NODES=("n1:p100:17001" "n2:v100:17002" "n3:a100:17003")
CPUS_PER_NODE=${GPUPACK_SLURM_CPUS:-8}
MEM_PER_NODE_MB=${GPUPACK_SLURM_MEM_MB:-16000}

log() { echo "local_slurm: $*" >&2; }

install_packages() {
  local missing=()
  for bin in slurmctld slurmd sbatch munged slurmdbd mariadbd; do
    command -v "$bin" >/dev/null 2>&1 || missing+=("$bin")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  log "installing Debian's slurm-wlm, munge and MariaDB (missing: ${missing[*]})"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends slurmctld slurmd slurm-client munge slurmdbd mariadb-server \
    >/dev/null
}

start_munge() {
  if [ ! -s /etc/munge/munge.key ]; then
    mkdir -p /etc/munge
    dd if=/dev/urandom bs=1 count=1024 of=/etc/munge/munge.key status=none
  fi
  mkdir -p /run/munge /var/log/munge /var/lib/munge
  chown -R munge:munge /etc/munge /run/munge /var/log/munge /var/lib/munge
  chmod 0400 /etc/munge/munge.key
  chmod 0755 /run/munge  # slurmctld, slurmdbd and sacct connect to /run/munge/munge.socket.2
  if ! munge -n >/dev/null 2>&1; then
    runuser -u munge -- /usr/sbin/munged
    for _ in $(seq 50); do munge -n >/dev/null 2>&1 && break; sleep 0.1; done
  fi
  munge -n | unmunge >/dev/null
}

start_mariadb() {
  if ! mysqladmin ping >/dev/null 2>&1; then
    mkdir -p /run/mysqld && chown mysql:mysql /run/mysqld
    [ -d /var/lib/mysql/mysql ] || mariadb-install-db --user=mysql --datadir=/var/lib/mysql >/dev/null
    (setsid mariadbd --user=mysql --datadir=/var/lib/mysql --socket=/run/mysqld/mysqld.sock \
      --bind-address=127.0.0.1 >"$BASE/log/mariadb.log" 2>&1 &)
    for _ in $(seq 100); do mysqladmin ping >/dev/null 2>&1 && break; sleep 0.2; done
  fi
  mysql -e "CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED BY 'gpupack';
            GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost'; FLUSH PRIVILEGES;"
}

write_config() {
  mkdir -p "$ETC" "$BASE/state" "$BASE/log" "$BASE/run"
  cat >"$ETC/slurmdbd.conf" <<CONF
AuthType=auth/munge
DbdHost=localhost
SlurmUser=root
StorageType=accounting_storage/mysql
StorageHost=localhost
StorageUser=slurm
StoragePass=gpupack
StorageLoc=slurm_acct_db
PidFile=$BASE/run/slurmdbd.pid
LogFile=$BASE/log/slurmdbd.log
CONF
  chmod 600 "$ETC/slurmdbd.conf"
  {
    cat <<CONF
ClusterName=$CLUSTER
SlurmctldHost=$HOST(127.0.0.1)
SlurmUser=root
AuthType=auth/munge
AuthInfo=cred_expire=10
StateSaveLocation=$BASE/state
SlurmdSpoolDir=$BASE/spool/%n
SlurmctldPidFile=$BASE/run/slurmctld.pid
SlurmdPidFile=$BASE/run/slurmd-%n.pid
SlurmctldLogFile=$BASE/log/slurmctld.log
SlurmdLogFile=$BASE/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
GresTypes=gpu
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
AccountingStorageTRES=gres/gpu
JobAcctGatherType=jobacct_gather/none
MailProg=/bin/true
SlurmdParameters=config_overrides
ReturnToService=2
MinJobAge=300
KillWait=5
# a requeued job starts once its hold (cred_expire) ends, not at the next 30/60 s scheduling pass
SchedulerParameters=batch_sched_delay=0,sched_min_interval=100000,sched_interval=2,bf_interval=2
CONF
    for node in "${NODES[@]}"; do
      IFS=: read -r name gpu port <<<"$node"
      echo "NodeName=$name NodeHostname=$HOST NodeAddr=127.0.0.1 Port=$port CPUs=$CPUS_PER_NODE RealMemory=$MEM_PER_NODE_MB Gres=gpu:$gpu:2 State=UNKNOWN"
    done
    for node in "${NODES[@]}"; do
      IFS=: read -r name gpu port <<<"$node"
      echo "PartitionName=$gpu Nodes=$name MaxTime=INFINITE State=UP$([ "$gpu" = p100 ] && echo ' Default=YES')"
    done
  } >"$ETC/slurm.conf"
  : >"$ETC/gres.conf"
  for node in "${NODES[@]}"; do
    IFS=: read -r name gpu port <<<"$node"
    mkdir -p "$BASE/dev/$name" "$BASE/spool/$name"
    for i in 0 1; do
      # gres.conf needs a File= per GPU; a character device passes slurmd's check where a plain file does not.
      [ -c "$BASE/dev/$name/nvidia$i" ] || mknod "$BASE/dev/$name/nvidia$i" c 1 3
    done
    echo "NodeName=$name Name=gpu Type=$gpu File=$BASE/dev/$name/nvidia[0-1]" >>"$ETC/gres.conf"
  done
}

running() { pgrep -f "$1" >/dev/null 2>&1; }

start() {
  install_packages
  mkdir -p "$BASE/log"
  write_config
  start_munge
  start_mariadb
  if ! pgrep -x slurmdbd >/dev/null; then
    slurmdbd
    for _ in $(seq 100); do sacctmgr -n list cluster >/dev/null 2>&1 && break; sleep 0.2; done
  fi
  # The cluster must exist in the database before slurmctld starts (after, slurmctld waits on a DB lock).
  sacctmgr -n -P list cluster format=cluster | grep -qx "$CLUSTER" || sacctmgr -i add cluster "$CLUSTER" >/dev/null
  pgrep -x slurmctld >/dev/null || slurmctld
  for node in "${NODES[@]}"; do
    IFS=: read -r name gpu port <<<"$node"
    running "slurmd -N $name" || slurmd -N "$name"
  done
  wait_nodes
  log "up: export SLURM_CONF=$SLURM_CONF"
}

wait_nodes() {
  for _ in $(seq 150); do
    sinfo -h -o "%t" 2>/dev/null | grep -qE "idle|mix|alloc" && [ "$(sinfo -h -o '%t' | grep -cvE 'idle|mix|alloc')" = 0 ] && break
    sinfo -h -N -o "%N %t" 2>/dev/null | awk '$2 ~ /drain|down/ {print $1}' | while read -r n; do
      scontrol update nodename="$n" state=resume 2>/dev/null || true
    done
    sleep 0.2
  done
  if ! sinfo -h -o "%P %t %G" >&2 || sinfo -h -o "%t" | grep -qvE "idle|mix|alloc"; then
    log "the cluster did not come up; logs: $BASE/log"
    exit 1
  fi
}

stop() {
  pkill -f "slurmd -N" 2>/dev/null || true
  pkill -x slurmctld 2>/dev/null || true
  pkill -x slurmdbd 2>/dev/null || true
  # wait until they are gone: a slurmctld still saving its state would make a quick `start` skip it
  for _ in $(seq 100); do
    pgrep -x slurmctld >/dev/null || pgrep -x slurmdbd >/dev/null || pgrep -f "slurmd -N" >/dev/null || break
    sleep 0.2
  done
  log "stopped slurmd, slurmctld and slurmdbd (munge and MariaDB keep running)"
}

limits() {
  local array_size=${1:-} submit=${2:--1}
  sed -i '/^MaxArraySize=/d; /^AccountingStorageEnforce=/d' "$ETC/slurm.conf"
  [ -n "$array_size" ] && echo "MaxArraySize=$array_size" >> "$ETC/slurm.conf"
  # a submit limit that SLURM enforces, as a site's is (sbatch refuses past it)
  [ "$submit" != "-1" ] && echo "AccountingStorageEnforce=limits" >> "$ETC/slurm.conf"
  # slurmctld reads MaxArraySize when it starts (scontrol reconfigure shows the new value and keeps the old limit):
  # restart it; its state (jobs, nodes) is kept in StateSaveLocation, the slurmd keep running
  pkill -x slurmctld 2>/dev/null || true
  for _ in $(seq 100); do pgrep -x slurmctld >/dev/null || break; sleep 0.2; done
  slurmctld
  wait_nodes 2>/dev/null
  sacctmgr -i modify user where name="$(id -un)" set MaxSubmitJobs="$submit" >/dev/null
  log "MaxArraySize=${array_size:-1001 (default)}, MaxSubmitJobs of $(id -un)=${submit/#-1/none}"
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  status) sinfo -h -o "%P %t %G" ;;
  env) echo "export SLURM_CONF=$SLURM_CONF" ;;
  limits) shift; limits "$@" ;;
  *) echo "usage: $0 start|stop|status|env|limits [MAX_ARRAY_SIZE [MAX_SUBMIT_JOBS]]" >&2; exit 2 ;;
esac
