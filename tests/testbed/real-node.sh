# shellcheck shell=bash
# One real node for the testbed (`testbed up --real-node`): a kubelet named real-0 with containerd,
# runc and a CNI bridge, and kube-proxy, beside the KWOK nodes. Sourced by `testbed`, whose
# variables (DIR, BIN, ports, PKI helpers) it uses.
#
# A kubelet changes the host it runs on: sysctls, iptables chains, cgroups, mounts, network
# namespaces, a bridge. `up` writes down what the host looked like before (DIR/real-node/host) and
# `down` puts it back, then checks that nothing of the node is left and fails if something is.
# Only one real node can run on a machine: a lock says which testbed has it.

REAL_NODE=real-0
# Short and fixed: a unix socket path may not exceed 107 bytes, and there is only one real node.
REAL_RUN=/run/mo-real-node
REAL_LOCK=/run/lock/mo-real-node.lock
REAL_BRIDGE=mo-real0
REAL_POD_CIDR=10.244.0.0/24
REAL_CLUSTER_CIDR=10.244.0.0/16
PAUSE_IMAGE=localhost/maintenance-operator-testbed/pause:1
PODAPP_IMAGE=localhost/maintenance-operator-testbed/podapp:1
CNI_BIN_DIR=${MO_TESTBED_CNI_BIN_DIR:-/usr/lib/cni}
# What the kubelet and kube-proxy may set; `down` puts back the values seen before `up`.
REAL_SYSCTLS=(kernel.panic kernel.panic_on_oops vm.overcommit_memory vm.panic_on_oom
	kernel.keys.root_maxkeys kernel.keys.root_maxbytes net.ipv4.ip_forward
	net.ipv4.conf.all.route_localnet net.bridge.bridge-nf-call-iptables
	net.netfilter.nf_conntrack_max net.netfilter.nf_conntrack_tcp_timeout_established
	net.netfilter.nf_conntrack_tcp_timeout_close_wait)
# Directories the node may create; `down` removes those that were not there before.
REAL_PATHS=(/var/log/containers /var/log/pods /var/lib/cni /run/netns "$REAL_RUN")

real_die() { die "real node: $*"; }
# During `up`, after the control plane started: the caller stops what runs and fails.
real_fail() {
	log "error: real node: $*"
	return 1
}

# ---------------------------------------------------------------------------------------------
# build: the kubelet and kube-proxy come with the control plane; the images are built here

# podapp (podapp/) is the sandbox ("pause") program and the drain tests' workload. Its two images
# are OCI archives in BIN, rebuilt when its source changes.
build_real_node_images() {
	local sum staging
	sum=$(cat "$HERE"/podapp/*.go "$HERE/go.mod" | sha256sum | cut -c1-16)
	[[ -f $BIN/podapp.source && $(cat "$BIN/podapp.source") == "$sum" && -f $BIN/pause.oci.tar &&
		-f $BIN/podapp.oci.tar ]] && return 0
	command -v buildah >/dev/null || die "buildah is needed for the real node's images (Debian: buildah)"
	need_go
	staging=$(mktemp -d "$CACHE_ROOT/build.XXXXXX")
	log "building the real node's images (pause, podapp) into $BIN"
	(cd "$HERE" && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$staging/podapp" ./podapp) || {
		rm -rf "$staging"
		die "go build ./podapp failed"
	}
	local name image entry ctr
	for name in pause podapp; do
		image=$PAUSE_IMAGE entry='["/podapp","pause"]'
		[[ $name == podapp ]] && image=$PODAPP_IMAGE entry='["/podapp","serve"]'
		ctr=$(buildah --storage-driver vfs from scratch)
		buildah --storage-driver vfs copy --quiet "$ctr" "$staging/podapp" /podapp >/dev/null
		buildah --storage-driver vfs config --entrypoint "$entry" --user 65532:65532 "$ctr"
		buildah --storage-driver vfs commit --quiet --timestamp 0 "$ctr" "$image" >/dev/null
		buildah --storage-driver vfs rm "$ctr" >/dev/null
		rm -f "$staging/$name.oci.tar"
		buildah --storage-driver vfs push --quiet "$image" "oci-archive:$staging/$name.oci.tar:$image"
		buildah --storage-driver vfs rmi "$image" >/dev/null
		mv -f "$staging/$name.oci.tar" "$BIN/$name.oci.tar"
	done
	echo "$sum" >"$BIN/podapp.source"
	rm -rf "$staging"
}

# ---------------------------------------------------------------------------------------------
# preflight: a machine that cannot run the node says exactly why

node_ip() {
	# The address of the default route's interface: the kubelet refuses a loopback --node-ip.
	ip -4 -o route get 1.1.1.1 2>/dev/null | sed -n 's/.* src \([0-9.]*\).*/\1/p'
}

real_node_preflight() {
	((EUID == 0)) || real_die "needs root (a kubelet mounts, changes cgroups and iptables)"
	local c
	for c in containerd containerd-shim-runc-v2 runc ctr iptables iptables-save iptables-restore ip flock; do
		command -v "$c" >/dev/null || real_die "$c is missing (Debian: containerd runc iptables iproute2)"
	done
	for c in bridge host-local loopback; do
		[[ -x $CNI_BIN_DIR/$c ]] || real_die "the CNI plugin $CNI_BIN_DIR/$c is missing (Debian: containernetworking-plugins)"
	done
	for c in kubelet kube-proxy pause.oci.tar podapp.oci.tar; do
		[[ -e $BIN/$c ]] || real_die "$BIN/$c is missing (run: $SELF build)"
	done
	[[ -d /sys/fs/cgroup/memory || -f /sys/fs/cgroup/cgroup.controllers ]] ||
		real_die "no memory cgroup controller under /sys/fs/cgroup"
	REAL_NODE_IP=$(node_ip)
	[[ -n $REAL_NODE_IP ]] || real_die "no non-loopback IPv4 address with a default route for --node-ip"
	exec {REAL_LOCK_FD}>"$REAL_LOCK"
	flock -n "$REAL_LOCK_FD" || real_die "another testbed holds the real node of this machine ($REAL_LOCK: $(cat "$REAL_LOCK.owner" 2>/dev/null))"
	flock -u "$REAL_LOCK_FD"
	exec {REAL_LOCK_FD}>&-
	# Some VMs refuse to lower oom_score_adj even to root; runc then fails every sandbox with
	# "can't get final child's PID from pipe". containerd can leave it alone instead.
	if sh -c 'echo -999 >/proc/self/oom_score_adj' 2>/dev/null; then
		REAL_RESTRICT_OOM=false
	else
		REAL_RESTRICT_OOM=true
		log "real node: this host refuses to lower oom_score_adj; containerd will not try"
	fi
}

# ---------------------------------------------------------------------------------------------
# the host before, and after

# What the node may change, one file per kind, in DIR/real-node/host-<when>.
snapshot_host() {
	local out=$DIR/real-node/host-$1 s
	mkdir -p "$out"
	for s in "${REAL_SYSCTLS[@]}"; do
		printf '%s=%s\n' "$s" "$(sysctl -n "$s" 2>/dev/null || echo absent)"
	done >"$out/sysctls"
	# The rules and user chains, without counters; built-in chains are in every table.
	iptables-save 2>/dev/null | grep -v '^#' >"$out/iptables.raw"
	awk '/^\*/ { t = $1 } /^:/ && $1 !~ /^:(INPUT|OUTPUT|FORWARD|PREROUTING|POSTROUTING)$/ { print t, $1 }
		/^-A/ { print t, $0 }' "$out/iptables.raw" >"$out/iptables"
	awk '{ print $5 }' /proc/self/mountinfo | sort >"$out/mounts"
	ip -o link show | awk -F': ' '{ print $2 }' | sed 's/@.*//' | sort >"$out/links"
	find /sys/fs/cgroup -maxdepth 3 -type d -name 'kubepods*' 2>/dev/null | sort >"$out/cgroups"
	ls -1 /var/run/netns 2>/dev/null | sort >"$out/netns" || true
	for s in "${REAL_PATHS[@]}"; do
		[[ -e $s ]] && echo "$s"
	done >"$out/paths"
	# containerd, its shims, the kubelet and kube-proxy name the node's files in their arguments.
	ps -eo args= | awk -v run="$REAL_RUN" -v dir="$DIR/real-node" \
		'(index($0, run) || index($0, dir)) && !/awk/ { print }' | sort >"$out/processes"
}

# Lines that differ between the host before `up` and now: what the node left behind.
host_leftovers() {
	snapshot_host now
	local before=$DIR/real-node/host-before now=$DIR/real-node/host-now kind
	for kind in sysctls iptables mounts links cgroups netns paths processes; do
		diff "$before/$kind" "$now/$kind" | sed -n "s/^> /$kind: /p"
	done
}

# ---------------------------------------------------------------------------------------------
# up

write_real_node_config() {
	local rn=$DIR/real-node
	mkdir -p "$rn/cni" "$rn/containerd" "$rn/kubelet" "$rn/pod-logs" "$REAL_RUN"
	cat >"$rn/containerd.toml" <<EOF
version = 2
root = "$rn/containerd"
state = "$REAL_RUN/state"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.zfs",
  "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]
[grpc]
  address = "$REAL_RUN/containerd.sock"
[plugins."io.containerd.internal.v1.opt"]
  path = "$rn/containerd/opt"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$PAUSE_IMAGE"
  restrict_oom_score_adj = $REAL_RESTRICT_OOM
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "native"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "$CNI_BIN_DIR"
    conf_dir = "$rn/cni"
EOF
	# No masquerading: pods reach the API server on the node's own address, and the host (the API
	# server calling a webhook, Prometheus scraping) reaches pods on the bridge.
	cat >"$rn/cni/10-mo-real-node.conflist" <<EOF
{"cniVersion": "1.0.0", "name": "mo-real-node", "plugins": [{"type": "bridge", "bridge": "$REAL_BRIDGE",
 "isGateway": true, "ipMasq": false, "hairpinMode": true, "ipam": {"type": "host-local",
 "ranges": [[{"subnet": "$REAL_POD_CIDR"}]], "routes": [{"dst": "0.0.0.0/0"}], "dataDir": "$rn/ipam"}}]}
EOF
	cat >"$rn/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: $REAL_NODE_IP
port: $KUBELET_PORT
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: $KUBELET_HEALTHZ_PORT
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $DIR/pki/ca.crt}
authorization: {mode: Webhook}
containerRuntimeEndpoint: unix://$REAL_RUN/containerd.sock
cgroupDriver: cgroupfs
failCgroupV1: false
failSwapOn: false
podLogsDir: $rn/pod-logs
clusterDomain: cluster.local
serializeImagePulls: false
# The testbed's images are imported, never pulled: nothing may collect them.
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard: {memory.available: 100Mi, nodefs.available: 1%, imagefs.available: 1%, nodefs.inodesFree: 1%}
tlsCertFile: $DIR/pki/kubelet-serving.crt
tlsPrivateKeyFile: $DIR/pki/kubelet-serving.key
EOF
	cat >"$rn/kube-proxy.yaml" <<EOF
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: iptables
clusterCIDR: $REAL_CLUSTER_CIDR
hostnameOverride: $REAL_NODE
bindAddress: 127.0.0.1
healthzBindAddress: 127.0.0.1:$KUBE_PROXY_HEALTHZ_PORT
metricsBindAddress: 127.0.0.1:$KUBE_PROXY_METRICS_PORT
clientConnection: {kubeconfig: $DIR/pki/kube-proxy.kubeconfig}
# Node ports on the node's address only, so kube-proxy leaves route_localnet alone; zero leaves
# the host's conntrack settings as they are.
nodePortAddresses: ["$REAL_NODE_IP/32"]
iptables: {localhostNodePorts: false}
conntrack: {maxPerCore: 0, min: 0, tcpEstablishedTimeout: 0s, tcpCloseWaitTimeout: 0s}
EOF
}

# Certificates the node needs from the testbed CA: the kubelet's client (the Node authorizer knows
# it by its name) and serving certificates, kube-proxy's client, and the API server's client for
# kubelets.
make_real_node_pki() {
	local client='basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\nextendedKeyUsage=clientAuth\n'
	sign kubelet "/O=system:nodes/CN=system:node:$REAL_NODE" "$client"
	sign kubelet-serving "/CN=$REAL_NODE" \
		"basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\nsubjectAltName=DNS:$REAL_NODE,IP:$REAL_NODE_IP\n"
	sign kube-proxy "/CN=system:kube-proxy" "$client"
	write_kubeconfig "$DIR/pki/kubelet.kubeconfig" kubelet
	write_kubeconfig "$DIR/pki/kube-proxy.kubeconfig" kube-proxy
	chmod 600 "$DIR/pki"/*.key
}

ctr_k8s() { ctr --address "$REAL_RUN/containerd.sock" --namespace k8s.io "$@"; }

real_node_ready() {
	kubectl --kubeconfig "$DIR/kubeconfig" get node "$REAL_NODE" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null | grep -qx True
}

# Starts containerd, kube-proxy and the kubelet (the control plane already runs) and waits until
# real-0 is Ready.
start_real_node() {
	rm -rf "$DIR/real-node"
	mkdir -p "$DIR/real-node"
	snapshot_host before
	echo "$REAL_NODE_IP" >"$DIR/real-node/ip"
	pick_ports 4
	KUBELET_PORT=${PORTS[0]} KUBELET_HEALTHZ_PORT=${PORTS[1]}
	KUBE_PROXY_HEALTHZ_PORT=${PORTS[2]} KUBE_PROXY_METRICS_PORT=${PORTS[3]}
	make_real_node_pki
	write_real_node_config
	echo "$DIR" >"$REAL_LOCK.owner"
	# The lock is held as long as containerd runs: flock is its parent and keeps the descriptor.
	launch containerd flock -n -E 75 "$REAL_LOCK" containerd --config "$DIR/real-node/containerd.toml"
	wait_until "containerd" ctr_k8s version ||
		real_fail "containerd did not start (log: $DIR/logs/containerd.log)" || return 1
	local image
	for image in pause podapp; do
		ctr_k8s images import --snapshotter native --no-unpack=false "$BIN/$image.oci.tar" >/dev/null ||
			real_fail "importing $BIN/$image.oci.tar into containerd failed" || return 1
	done
	launch kube-proxy "$BIN/kube-proxy" --config "$DIR/real-node/kube-proxy.yaml" --v=1
	launch kubelet "$BIN/kubelet" \
		--config "$DIR/real-node/kubelet.yaml" \
		--kubeconfig "$DIR/pki/kubelet.kubeconfig" \
		--root-dir "$DIR/real-node/kubelet" \
		--cert-dir "$DIR/real-node/kubelet/pki" \
		--hostname-override "$REAL_NODE" \
		--node-ip "$REAL_NODE_IP" \
		--node-labels "type=real,testbed.maintenance.nvidia.com/prefix=real" \
		--v=1
	wait_until "node $REAL_NODE Ready" real_node_ready ||
		real_fail "$REAL_NODE did not become Ready (logs: $DIR/logs/kubelet.log, containerd.log)" || return 1
}

# ---------------------------------------------------------------------------------------------
# down

# Pods first, through the kubelet, so each sandbox is torn down with its network; then the
# processes; then whatever the host still shows.
stop_real_node() {
	[[ -f $DIR/real-node/host-before/sysctls ]] || return 0
	local quiet=$1
	if component_running kubelet && [[ -f $DIR/ports ]]; then
		local kc=(kubectl --kubeconfig "$DIR/kubeconfig" --request-timeout=5s)
		"${kc[@]}" cordon "$REAL_NODE" >/dev/null 2>&1 || true
		"${kc[@]}" delete pods --all-namespaces --field-selector "spec.nodeName=$REAL_NODE" \
			--grace-period=1 --wait=false >/dev/null 2>&1 || true
		local deadline=$(($(now_ms) + 30000))
		# A stopped sandbox keeps its container until the kubelet's collection; no task means
		# every container ended and every sandbox's network is torn down.
		while (($(now_ms) < deadline)) && [[ -n $(ctr_k8s tasks list -q 2>/dev/null) ]]; do
			sleep 0.2
		done
	fi
	stop_phase "$quiet" kubelet kube-proxy
	local id
	for id in $(ctr_k8s tasks list -q 2>/dev/null); do
		ctr_k8s tasks kill --signal SIGKILL "$id" >/dev/null 2>&1 || true
		ctr_k8s tasks delete --force "$id" >/dev/null 2>&1 || true
	done
	stop_phase "$quiet" containerd
	# Shims outlive containerd by design; these are ours by the socket they were started for.
	pkill -KILL -f "containerd-shim-runc-v2 .*-address $REAL_RUN/containerd.sock" 2>/dev/null || true
	restore_host
	local left
	left=$(host_leftovers)
	[[ -z $left ]] || {
		log "real node: the host still shows what the node left:"
		printf '  %s\n' "$left" >&2
		return 1
	}
	rm -f "$REAL_LOCK.owner"
	[[ -n $quiet ]] || log "real node stopped; the host is as it was"
}

restore_host() {
	local before=$DIR/real-node/host-before entry path
	# Processes left in the node's cgroups (containers whose shim was killed), then the cgroups,
	# deepest first.
	local dirs
	dirs=$(find /sys/fs/cgroup -mindepth 2 -type d -path '*/kubepods*' 2>/dev/null | sort -r)
	for path in $dirs; do
		[[ -f $path/cgroup.procs ]] && xargs -r kill -KILL <"$path/cgroup.procs" 2>/dev/null
	done
	for path in $dirs; do
		grep -qxF "$path" "$before/cgroups" || rmdir "$path" 2>/dev/null || true
	done
	# Mounts made since (volumes, network namespaces, containerd's), innermost first.
	awk '{ print $5 }' /proc/self/mountinfo | sort -r | while read -r path; do
		grep -qxF "$path" "$before/mounts" || umount -l "$path" 2>/dev/null || true
	done
	for entry in $(ls -1 /var/run/netns 2>/dev/null); do
		grep -qxF "$entry" "$before/netns" || ip netns delete "$entry" 2>/dev/null || true
	done
	ip -o link show | awk -F': ' '{ print $2 }' | sed 's/@.*//' | while read -r entry; do
		grep -qxF "$entry" "$before/links" || ip link delete "$entry" 2>/dev/null || true
	done
	restore_iptables "$before/iptables"
	while IFS='=' read -r entry path; do
		[[ $path == absent ]] && continue
		[[ $(sysctl -n "$entry" 2>/dev/null) == "$path" ]] || sysctl -qw "$entry=$path" || true
	done <"$before/sysctls"
	for path in "${REAL_PATHS[@]}"; do
		grep -qxF "$path" "$before/paths" || rm -rf "$path"
	done
}

# Tables that were there before get their rules back as they were; tables the node made are
# emptied (built-in chains cannot be removed, so they stay, empty and accepting).
restore_iptables() {
	local raw=$1.raw t
	[[ -s $raw ]] && { iptables-restore <"$raw" || log "real node: iptables-restore of $raw failed"; }
	for t in $(iptables-save 2>/dev/null | sed -n 's/^\*//p'); do
		grep -qx "\*$t" "$raw" && continue
		iptables -t "$t" -F && iptables -t "$t" -X || log "real node: cannot empty iptables table $t"
	done
}
