#!/usr/bin/env bash
# A real single-node Kubernetes cluster on this host, for trying the chart (docs/install.md, "Try it
# on a real single-node cluster"): etcd, kube-apiserver (admission webhooks on), kube-controller-
# manager, kube-scheduler and kubelet from K8S_BIN (Kubernetes v1.36 binaries, e.g. the official
# release's), containerd + runc + CNI (bridge, host-local, loopback) from Debian's packages.
#
#   scripts/cluster/cluster.sh up      # start it (root; seconds); after a failure, run down
#   scripts/cluster/cluster.sh down    # stop it: no process, mount, interface or host dir is left
#   scripts/cluster/cluster.sh env     # `export KUBECONFIG=...` for your shell
#   scripts/cluster/cluster.sh restart-kubelet   # as an upgrade or a crash would
#   scripts/cluster/cluster.sh containerd-config # the containerd config up writes (CDI resolved)
#
# Options (environment):
#   CONTAINERD_BIN=DIR   containerd, containerd-shim-runc-v2 and ctr from DIR instead of PATH, e.g.
#                        Debian 13's containerd 1.7 unpacked beside Debian 12's 1.6 by
#                        scripts/cluster/containerd-cdi.sh (DIR=/opt/containerd-1.7/usr/bin)
#   CDI=auto|on|off      containerd's CDI support (enable_cdi, specs in /etc/cdi and /var/run/cdi),
#                        which the DRA mode's kubelet plugin needs; auto (the default) turns it on
#                        for containerd 1.7 or newer (1.6 has none)
#   KUBELET_ROOT_DIR=DIR kubelet's --root-dir (default: under CLUSTER_DIR). DRA drivers register in
#                        <root>/plugins_registry and serve under <root>/plugins, paths the chart
#                        mounts as /var/lib/kubelet/...: use /var/lib/kubelet for the DRA mode
#
# Everything lives under CLUSTER_DIR (default /var/tmp/kube-vgpu-cluster) except what kubelet and
# containerd insist on placing elsewhere (/var/lib/kubelet/device-plugins, /run/containerd/s, the
# pods' network namespaces in /run/netns, cgroups): `down` removes those too.
#
# Network (all on this host): an interface $NODE_IF (an empty bridge, as a dummy would be) holds
# the node IP ($NODE_IP; kube-apiserver listens there and reaches kubelet there for `kubectl logs`),
# pods get addresses from a bridge
# $BRIDGE ($POD_CIDR), and one iptables DNAT rule stands in for kube-proxy for the `kubernetes`
# Service ($API_SERVICE_IP:443 -> $NODE_IP:6443), the only ClusterIP pods use (kube-apiserver calls
# webhooks on the endpoints' pod IPs: --enable-aggregator-routing).
set -euo pipefail

CLUSTER_DIR=${CLUSTER_DIR:-/var/tmp/kube-vgpu-cluster}
K8S_BIN=${K8S_BIN:-}
CONTAINERD_BIN=${CONTAINERD_BIN:-}
CDI=${CDI:-auto}
KUBELET_ROOT_DIR=${KUBELET_ROOT_DIR:-}
NODE_NAME=${NODE_NAME:-kvgpu-node}
NODE_IF=kvgpu-node0
NODE_IP=10.208.0.1
BRIDGE=kvgpu-br0
POD_CIDR=10.209.0.0/24
SERVICE_CIDR=10.207.0.0/24
API_SERVICE_IP=10.207.0.1
API_PORT=6443
ETCD_PORT=12379
NAT_CHAIN=KVGPU-SERVICES
READY_TIMEOUT_S=${READY_TIMEOUT_S:-180}

die() { echo "cluster.sh: $*" >&2; exit 1; }
log() { echo "cluster.sh: $*" >&2; }

preflight() {
  [ "$(id -u)" = 0 ] || die "needs root (containerd, kubelet, network)"
  [ -n "$K8S_BIN" ] || die "set K8S_BIN to a directory of Kubernetes v1.36 binaries (kube-apiserver, kube-controller-manager, kube-scheduler, kubelet, kubectl)"
  local b
  for b in kube-apiserver kube-controller-manager kube-scheduler kubelet kubectl; do
    [ -x "$K8S_BIN/$b" ] || die "$K8S_BIN/$b is missing"
  done
  for b in etcd containerd containerd-shim-runc-v2 runc ctr openssl iptables ip; do
    command -v "$b" >/dev/null || die "$b not found (apt-get install etcd-server containerd runc containernetworking-plugins iptables openssl iproute2)"
  done
  [ -x /usr/lib/cni/bridge ] || die "/usr/lib/cni/bridge missing (apt-get install containernetworking-plugins)"
  resolve_cdi
  KUBELET_ROOT_DIR=${KUBELET_ROOT_DIR:-$CLUSTER_DIR/kubelet}
  case "$KUBELET_ROOT_DIR" in
    /var/lib/kubelet | "$CLUSTER_DIR"/*) ;; # the first is handled as kubelet's device-plugin dir is
    /*) [ ! -e "$KUBELET_ROOT_DIR" ] || die "KUBELET_ROOT_DIR=$KUBELET_ROOT_DIR exists: down removes it, so it must be new" ;;
    *) die "KUBELET_ROOT_DIR=$KUBELET_ROOT_DIR: not an absolute path" ;;
  esac
}

resolve_cdi() { # CDI=auto becomes on or off by the containerd found
  case "$CDI" in
    on) containerd_at_least 1 7 || die "CDI=on needs containerd 1.7 or newer; $(command -v containerd) is $(containerd_version) (set CONTAINERD_BIN: scripts/cluster/containerd-cdi.sh)" ;;
    off) ;;
    auto) if containerd_at_least 1 7; then CDI=on; else CDI=off; fi ;;
    *) die "CDI=$CDI: expected auto, on or off" ;;
  esac
}

use_containerd_bin() { # CONTAINERD_BIN first on PATH: containerd finds its shim there too
  if [ -n "$CONTAINERD_BIN" ]; then
    [ -x "$CONTAINERD_BIN/containerd" ] || die "CONTAINERD_BIN=$CONTAINERD_BIN has no containerd"
    PATH=$CONTAINERD_BIN:$PATH
    export PATH
  fi
}

containerd_version() { containerd --version | awk '{print $3}'; }

containerd_at_least() { # major minor: false too when the version does not read as one
  local v major minor
  v=$(containerd_version 2>/dev/null || true)
  v=${v#v} # upstream's builds print v2.0.0, Debian's 1.7.24~ds1
  major=${v%%.*}
  minor=${v#*.}
  minor=${minor%%[!0-9]*}
  case "$major$minor" in '' | *[!0-9]*) return 1 ;; esac
  [ "$major" -gt "$1" ] || { [ "$major" -eq "$1" ] && [ "$minor" -ge "$2" ]; }
}

# --- certificates -------------------------------------------------------------------------------
cert() { # name subject [altnames]: a key and a certificate signed by the cluster CA
  local name=$1 subj=$2 alt=${3:-} pki=$CLUSTER_DIR/pki
  openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout "$pki/$name.key" -subj "$subj" -out "$pki/$name.csr" 2>/dev/null
  local ext=$pki/$name.ext
  {
    echo "basicConstraints=CA:FALSE"
    echo "keyUsage=critical,digitalSignature"
    if [ -n "$alt" ]; then
      echo "extendedKeyUsage=serverAuth,clientAuth"
      echo "subjectAltName=$alt"
    else
      echo "extendedKeyUsage=clientAuth"
    fi
  } >"$ext"
  openssl x509 -req -in "$pki/$name.csr" -CA "$pki/ca.crt" -CAkey "$pki/ca.key" -CAcreateserial \
    -days 30 -extfile "$ext" -out "$pki/$name.crt" 2>/dev/null
  rm -f "$pki/$name.csr" "$ext"
}

kubeconfig() { # file user: a kubeconfig with that user's client certificate
  local file=$1 user=$2 pki=$CLUSTER_DIR/pki
  cat >"$file" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: kvgpu
  cluster:
    server: https://$NODE_IP:$API_PORT
    certificate-authority: $pki/ca.crt
users:
- name: $user
  user:
    client-certificate: $pki/$user.crt
    client-key: $pki/$user.key
contexts:
- name: kvgpu
  context: {cluster: kvgpu, user: $user}
current-context: kvgpu
EOF
}

make_pki() {
  local pki=$CLUSTER_DIR/pki
  mkdir -p "$pki"
  openssl req -x509 -new -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout "$pki/ca.key" -subj "/CN=kube-vgpu-cluster-ca" \
    -days 30 -out "$pki/ca.crt" 2>/dev/null
  cert apiserver "/CN=kube-apiserver" \
    "IP:$NODE_IP,IP:$API_SERVICE_IP,IP:127.0.0.1,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local"
  cert admin "/O=system:masters/CN=kube-vgpu-admin"
  cert controller-manager "/CN=system:kube-controller-manager"
  cert scheduler "/CN=system:kube-scheduler"
  cert kubelet "/O=system:nodes/CN=system:node:$NODE_NAME"
  cert kubelet-serving "/CN=$NODE_NAME" "IP:$NODE_IP,DNS:$NODE_NAME"
  cert apiserver-kubelet-client "/O=system:masters/CN=kube-apiserver-kubelet-client"
  openssl ecparam -name prime256v1 -genkey -noout -out "$pki/sa.key" 2>/dev/null
  openssl ec -in "$pki/sa.key" -pubout -out "$pki/sa.pub" 2>/dev/null
  kubeconfig "$CLUSTER_DIR/kubeconfig" admin
  kubeconfig "$CLUSTER_DIR/controller-manager.kubeconfig" controller-manager
  kubeconfig "$CLUSTER_DIR/scheduler.kubeconfig" scheduler
  kubeconfig "$CLUSTER_DIR/kubelet.kubeconfig" kubelet
}

# --- processes ----------------------------------------------------------------------------------
start() { # name argv...: a daemon in its own session, logging to logs/<name>.log, pid in run/<name>.pid
  local name=$1
  shift
  setsid "$@" </dev/null >>"$CLUSTER_DIR/logs/$name.log" 2>&1 &
  echo $! >"$CLUSTER_DIR/run/$name.pid"
}

wait_for() { # what command...: poll until the command succeeds (READY_TIMEOUT_S)
  local what=$1 deadline=$((SECONDS + READY_TIMEOUT_S))
  shift
  until "$@" >/dev/null 2>&1; do
    [ $SECONDS -lt $deadline ] || die "$what not ready after ${READY_TIMEOUT_S}s (logs in $CLUSTER_DIR/logs)"
    sleep 0.5
  done
}

kctl() { "$K8S_BIN/kubectl" --kubeconfig "$CLUSTER_DIR/kubeconfig" --cache-dir "$CLUSTER_DIR/kubectl-cache" "$@"; }

network_up() {
  touch_marker network
  ip link add "$NODE_IF" type bridge # an empty bridge: a local address (no dummy module here)
  ip addr add "$NODE_IP/32" dev "$NODE_IF"
  ip link set "$NODE_IF" up
  iptables -t nat -N "$NAT_CHAIN"
  iptables -t nat -A "$NAT_CHAIN" -d "$API_SERVICE_IP/32" -p tcp --dport 443 -j DNAT --to-destination "$NODE_IP:$API_PORT"
  iptables -t nat -I PREROUTING -j "$NAT_CHAIN"
  iptables -t nat -I OUTPUT -j "$NAT_CHAIN"
  mkdir -p "$CLUSTER_DIR/cni/net.d" "$CLUSTER_DIR/cni/ipam"
  cat >"$CLUSTER_DIR/cni/net.d/10-kvgpu.conflist" <<EOF
{
  "cniVersion": "0.4.0",
  "name": "kvgpu",
  "plugins": [
    {"type": "bridge", "bridge": "$BRIDGE", "isGateway": true, "ipMasq": false, "hairpinMode": true,
     "ipam": {"type": "host-local", "dataDir": "$CLUSTER_DIR/cni/ipam",
              "ranges": [[{"subnet": "$POD_CIDR"}]], "routes": [{"dst": "0.0.0.0/0"}]}},
    {"type": "loopback"}
  ]
}
EOF
}

containerd_config() { # the config containerd runs with, on stdout
  local c=$CLUSTER_DIR/containerd cdi=""
  if [ "$CDI" = on ]; then # kubelet's DRA path names CDI devices; containerd resolves them from these
    cdi='enable_cdi = true
  cdi_spec_dirs = ["/etc/cdi", "/var/run/cdi"]'
  fi
  cat <<EOF
version = 2
root = "$c/root"
state = "$c/state"
[grpc]
  address = "$c/containerd.sock"
[plugins."io.containerd.internal.v1.opt"]
  path = "$c/opt" # not /opt/containerd, which down would leave behind
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "localhost/kube-vgpu-pause:3.10"
  # without it every pod sandbox fails in an unprivileged-user-namespace-less container:
  # "can't get final child's PID from pipe: EOF"
  restrict_oom_score_adj = true
  $cdi
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$CLUSTER_DIR/cni/net.d"
EOF
}

containerd_up() {
  local c=$CLUSTER_DIR/containerd
  mkdir -p "$c"
  containerd_config >"$c/config.toml"
  start containerd containerd --config "$c/config.toml"
  wait_for containerd ctr --address "$c/containerd.sock" version
}

apiserver_up() {
  local pki=$CLUSTER_DIR/pki
  start kube-apiserver "$K8S_BIN/kube-apiserver" \
    --etcd-servers "http://127.0.0.1:$ETCD_PORT" \
    --bind-address "$NODE_IP" --advertise-address "$NODE_IP" --secure-port "$API_PORT" \
    --tls-cert-file "$pki/apiserver.crt" --tls-private-key-file "$pki/apiserver.key" \
    --client-ca-file "$pki/ca.crt" \
    --kubelet-client-certificate "$pki/apiserver-kubelet-client.crt" \
    --kubelet-client-key "$pki/apiserver-kubelet-client.key" \
    --service-cluster-ip-range "$SERVICE_CIDR" \
    --service-account-issuer https://kubernetes.default.svc \
    --service-account-key-file "$pki/sa.pub" --service-account-signing-key-file "$pki/sa.key" \
    --authorization-mode Node,RBAC --allow-privileged=true \
    --enable-admission-plugins NodeRestriction \
    --enable-aggregator-routing=true --kubelet-preferred-address-types InternalIP
  wait_for kube-apiserver kctl get --raw /readyz
}

control_plane_up() {
  mkdir -p "$CLUSTER_DIR/etcd"
  start etcd etcd --name kvgpu --data-dir "$CLUSTER_DIR/etcd" \
    --listen-client-urls "http://127.0.0.1:$ETCD_PORT" --advertise-client-urls "http://127.0.0.1:$ETCD_PORT" \
    --listen-peer-urls "http://127.0.0.1:$((ETCD_PORT + 1))" \
    --initial-advertise-peer-urls "http://127.0.0.1:$((ETCD_PORT + 1))" \
    --initial-cluster "kvgpu=http://127.0.0.1:$((ETCD_PORT + 1))"
  apiserver_up
  local pki=$CLUSTER_DIR/pki
  start kube-controller-manager "$K8S_BIN/kube-controller-manager" \
    --kubeconfig "$CLUSTER_DIR/controller-manager.kubeconfig" \
    --authentication-kubeconfig "$CLUSTER_DIR/controller-manager.kubeconfig" \
    --authorization-kubeconfig "$CLUSTER_DIR/controller-manager.kubeconfig" \
    --service-account-private-key-file "$pki/sa.key" --root-ca-file "$pki/ca.crt" \
    --use-service-account-credentials=true --leader-elect=false \
    --bind-address 127.0.0.1 --secure-port 0
  start kube-scheduler "$K8S_BIN/kube-scheduler" \
    --kubeconfig "$CLUSTER_DIR/scheduler.kubeconfig" \
    --authentication-kubeconfig "$CLUSTER_DIR/scheduler.kubeconfig" \
    --authorization-kubeconfig "$CLUSTER_DIR/scheduler.kubeconfig" \
    --leader-elect=false --bind-address 127.0.0.1 --secure-port 0
}

kubelet_up() {
  local k=$KUBELET_ROOT_DIR pki=$CLUSTER_DIR/pki
  mkdir -p "$k" "$CLUSTER_DIR/pod-logs"
  cat >"$CLUSTER_DIR/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
# cgroup v1 is deprecated in 1.35+: kubelet refuses it unless told otherwise
failCgroupV1: false
cgroupDriver: cgroupfs
containerRuntimeEndpoint: unix://$CLUSTER_DIR/containerd/containerd.sock
address: $NODE_IP
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 0
tlsCertFile: $pki/kubelet-serving.crt
tlsPrivateKeyFile: $pki/kubelet-serving.key
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: false}
  x509: {clientCAFile: $pki/ca.crt}
authorization: {mode: AlwaysAllow}
podLogsDir: $CLUSTER_DIR/pod-logs
failSwapOn: false
resolvConf: /etc/resolv.conf
# a shared build machine: never evict pods for its disk or memory
evictionHard: {memory.available: "1Mi", nodefs.available: "1%", imagefs.available: "1%", nodefs.inodesFree: "1%"}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
serializeImagePulls: false
EOF
  start kubelet "$K8S_BIN/kubelet" --config "$CLUSTER_DIR/kubelet.yaml" \
    --kubeconfig "$CLUSTER_DIR/kubelet.kubeconfig" --root-dir "$k" \
    --hostname-override "$NODE_NAME" --node-ip "$NODE_IP" --node-labels gpu=on
}

cmd_up() {
  use_containerd_bin
  preflight
  [ ! -e "$CLUSTER_DIR/run" ] || die "$CLUSTER_DIR/run exists: a cluster is up (or was not taken down): run '$0 down'"
  ! ip link show "$NODE_IF" >/dev/null 2>&1 || die "$NODE_IF exists: another cluster is up on this host (CLUSTER_DIR=... $0 down)"
  local t0=$SECONDS
  [ -e /var/lib/kubelet ] || touch_marker var-lib-kubelet
  mkdir -p "$CLUSTER_DIR/logs" "$CLUSTER_DIR/run"
  for d in /run/containerd /run/netns /var/lib/cni /tmp/vgpulock /etc/cdi /run/cdi; do
    [ -e "$d" ] || touch_marker "$(echo "$d" | tr / -)"
  done
  [ -e "$KUBELET_ROOT_DIR" ] || touch_marker kubelet-root
  if [ "$CDI" = on ]; then mkdir -p /etc/cdi /run/cdi; fi
  # what down and restart-kubelet need to know of this cluster
  printf '%s\n' "$CONTAINERD_BIN" >"$CLUSTER_DIR/run/containerd-bin"
  printf '%s\n' "$KUBELET_ROOT_DIR" >"$CLUSTER_DIR/run/kubelet-root"
  make_pki
  network_up
  containerd_up
  control_plane_up
  kubelet_up
  wait_for "node $NODE_NAME" kctl wait --for=condition=Ready "node/$NODE_NAME" --timeout=2s
  echo "$K8S_BIN" >"$CLUSTER_DIR/k8s-bin"
  log "up in $((SECONDS - t0))s with containerd $(containerd_version) (CDI $CDI): export KUBECONFIG=$CLUSTER_DIR/kubeconfig"
}

touch_marker() { mkdir -p "$CLUSTER_DIR/created"; touch "$CLUSTER_DIR/created/$1"; }

stop_pid() { # [-t grace_s] names...: SIGTERM to each at once, SIGKILL to those left after grace_s (15)
  local grace=15 signal=TERM name f pids=()
  if [ "$1" = -t ]; then grace=$2; shift 2; fi
  [ "$grace" != 0 ] || signal=KILL # -t 0: SIGKILL at once, then wait (at most 5 s) for them to go
  [ "$grace" != 0 ] || grace=5
  for name in "$@"; do
    f=$CLUSTER_DIR/run/$name.pid
    [ -f "$f" ] || continue
    pids+=("$(cat "$f")")
    rm -f "$f"
  done
  [ ${#pids[@]} -gt 0 ] || return 0
  kill -s "$signal" "${pids[@]}" 2>/dev/null || true
  local deadline=$((SECONDS + grace)) pid
  for pid in "${pids[@]}"; do
    while alive "$pid" && [ $SECONDS -lt $deadline ]; do sleep 0.05; done
    kill -9 "$pid" 2>/dev/null || true
  done
}

alive() { # pid: running, not a zombie. The daemons are orphans, reaped by PID 1 when it gets to
  # it (every 2 s in some sandboxes): a zombie holds no file, mount or port, so it counts as gone
  local state
  state=$(sed 's/.*) //' "/proc/$1/stat" 2>/dev/null) || return 1
  state=${state%% *}
  [ -n "$state" ] && [ "$state" != Z ]
}

shim_pids() { # the containerd shims our containerd started (they outlive it)
  local p
  for p in /proc/[0-9]*; do
    if { tr '\0' ' ' <"$p/cmdline"; } 2>/dev/null | grep -q -- "-address $CLUSTER_DIR/containerd/containerd.sock"; then
      basename "$p"
    fi
  done
}

remove_cgroups() { # kubelet's pod cgroups (kubepods), leaves first
  local ctl
  for ctl in /sys/fs/cgroup/*/; do
    [ -d "$ctl/kubepods" ] || continue
    find "$ctl/kubepods" -depth -type d -exec rmdir {} \; 2>/dev/null || true
  done
}

lap() { # name: the seconds since the previous lap, added to LAPS (down's log line)
  local now=${EPOCHREALTIME/[.,]/}
  LAPS+=" $1 $(((now - LAP_AT) / 1000))ms"
  LAP_AT=$now
}

cmd_down() {
  [ "$(id -u)" = 0 ] || die "needs root"
  [ -d "$CLUSTER_DIR" ] || { log "no cluster at $CLUSTER_DIR"; return 0; }
  local t0=$SECONDS
  LAPS="" LAP_AT=${EPOCHREALTIME/[.,]/}
  load_options
  # everything is thrown away: no daemon needs a graceful stop (kubelet's takes 1.5-2 s, and
  # kube-apiserver's or containerd 1.7's outlasts any short grace), so each is killed at once
  stop_pid -t 0 kubelet
  lap kubelet
  local sock=$CLUSTER_DIR/containerd/containerd.sock
  if [ -S "$sock" ]; then # every container and sandbox: their processes, mounts and netns go with them
    local id
    for id in $(ctr --address "$sock" -n k8s.io tasks ls -q 2>/dev/null); do
      ctr --address "$sock" -n k8s.io tasks kill -s SIGKILL "$id" >/dev/null 2>&1 || true
    done
    for id in $(ctr --address "$sock" -n k8s.io tasks ls -q 2>/dev/null); do
      ctr --address "$sock" -n k8s.io tasks delete -f "$id" >/dev/null 2>&1 || true
    done
  fi
  lap tasks
  stop_pid -t 0 kube-scheduler kube-controller-manager containerd kube-apiserver etcd
  lap daemons
  local pid
  for pid in $(shim_pids); do kill -9 "$pid" 2>/dev/null || true; done
  lap shims
  # mounts under the cluster dir, kubelet's and the pods' network namespaces, deepest first
  local m
  for m in $(awk '{print $5}' /proc/self/mountinfo | grep -E "^($CLUSTER_DIR|/run/netns/cni-|/var/lib/kubelet|$KUBELET_ROOT_DIR)" | sort -r); do
    umount -l "$m" 2>/dev/null || true
  done
  rm -f /run/netns/cni-* 2>/dev/null || true
  lap mounts
  remove_cgroups
  lap cgroups
  if [ -e "$CLUSTER_DIR/created/network" ]; then # only what this cluster made
    ip link del "$BRIDGE" 2>/dev/null || true
    ip link del "$NODE_IF" 2>/dev/null || true
    iptables -t nat -D PREROUTING -j "$NAT_CHAIN" 2>/dev/null || true
    iptables -t nat -D OUTPUT -j "$NAT_CHAIN" 2>/dev/null || true
    iptables -t nat -F "$NAT_CHAIN" 2>/dev/null || true
    iptables -t nat -X "$NAT_CHAIN" 2>/dev/null || true
  fi
  lap network
  local marker path
  for marker in var-lib-kubelet kubelet-root -run-containerd -run-netns -var-lib-cni -tmp-vgpulock -etc-cdi -run-cdi; do
    [ -e "$CLUSTER_DIR/created/$marker" ] || continue
    case "$marker" in
      var-lib-kubelet) path=/var/lib/kubelet ;;
      kubelet-root) path=$KUBELET_ROOT_DIR ;;
      *) path=$(echo "$marker" | tr - /) ;;
    esac
    rm -rf "$path"
  done
  lap host-dirs
  rm -rf "$CLUSTER_DIR/containerd" # the images' snapshots: most of the bytes
  lap containerd-dir
  rm -rf "$CLUSTER_DIR"
  lap cluster-dir
  log "down in $((SECONDS - t0))s:$LAPS"
}

load_options() { # the options the cluster was brought up with
  CONTAINERD_BIN=$(cat "$CLUSTER_DIR/run/containerd-bin" 2>/dev/null || true)
  KUBELET_ROOT_DIR=$(cat "$CLUSTER_DIR/run/kubelet-root" 2>/dev/null || echo "$CLUSTER_DIR/kubelet")
  use_containerd_bin
}

cmd_restart_kubelet() { # kubelet stopped and started again, as an upgrade or a crash would
  K8S_BIN=$(cat "$CLUSTER_DIR/k8s-bin")
  load_options
  stop_pid kubelet
  kubelet_up
}

case "${1:-}" in
  up) cmd_up ;;
  restart-kubelet) cmd_restart_kubelet ;;
  down) cmd_down ;;
  env) echo "export KUBECONFIG=$CLUSTER_DIR/kubeconfig" ;;
  containerd-config) use_containerd_bin && resolve_cdi && containerd_config ;;
  *) die "usage: $0 up|down|env|restart-kubelet|containerd-config" ;;
esac
