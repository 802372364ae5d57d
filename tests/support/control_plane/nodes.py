"""Real nodes beside the kwok nodes: a kubelet and a containerd per node, runc, the CNI bridge, and
kube-proxy, all built by `make peers`, running the image `make image` built.

The network: every real node, pod and Service address lives in one network namespace the run makes
(`NetNs`, `ip netns add`), which has no interface but its own loopback (holding the node addresses
too) and the nodes' CNI bridges; nothing there routes off the machine. The kubelets,
containerds and kube-proxy run in it (`nsenter --net` only: they share the machine's mount namespace,
so the kubelet's volume mounts are the ones containerd bind-mounts into containers). The control
plane stays on the machine's loopback. Two relays, run by the test process, join the two sides:

- the cluster reaches the apiserver at `APISERVER_IP` (the `kubernetes` Service's endpoint, the
  apiserver's `--advertise-address`): a socket listening there inside the namespace, each connection
  carried to the apiserver on loopback;
- the apiserver reaches the cluster (webhooks by `clientConfig.service`, the kubelets for logs, exec
  and port-forward) through its egress selector: its `cluster` traffic is an HTTP CONNECT on a Unix
  socket, as it would send to a konnectivity proxy, and the relay opens that connection from inside
  the namespace, where kube-proxy turns a ClusterIP into a Ready endpoint as on any node.

So the Service CIDR of a control plane with real nodes is not loopback (docs/admission-chain.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import hashlib
import io
import ipaddress
import json
import os
import shutil
import signal
import socket
import subprocess
import tarfile
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tests.support import peers
from tests.support.control_plane.background import BackgroundLoop
from tests.support.control_plane.pki import ClientCert, Pki, client_cert
from tests.support.control_plane.processes import LOOPBACK, Process

_CLONE_NEWNET = 0x40000000
# All addresses of the namespace: nodes and the apiserver's relay in .0, pod CIDRs in .<n>.
NETWORK = ipaddress.IPv4Network("10.200.0.0/16")
APISERVER_IP = "10.200.0.1"
# Where the namespace reaches servers of the test run on the machine's loopback (the Run:ai
# stand-ins, Kueue's and KAI's webhooks): a relay listens here, one port per server.
MACHINE_SIDE_IP = "10.200.0.2"
SERVICE_CIDR = ipaddress.IPv4Network("10.201.0.0/24")
REAL_NODE_LABEL = "scheduling-webhook.test/real-node"
# Only what tolerates it runs there: the tests' other pods name images that exist nowhere.
REAL_NODE_TAINT = {"key": REAL_NODE_LABEL, "value": "true", "effect": "NoSchedule"}
PAUSE_IMAGE = "localhost/pause:test"
RUNC = "/usr/sbin/runc"


@dataclass(frozen=True)
class RealNode:
    name: str
    index: int  # 1, 2, ...: its address and pod CIDR
    zone: str
    region: str = "eu-1"

    @property
    def ip(self) -> str:
        return str(NETWORK.network_address + 10 + self.index)

    @property
    def pod_cidr(self) -> ipaddress.IPv4Network:
        return ipaddress.IPv4Network(f"10.200.{self.index}.0/24")

    def labels(self) -> dict[str, str]:
        return {
            "topology.kubernetes.io/zone": self.zone,
            "topology.kubernetes.io/region": self.region,
            REAL_NODE_LABEL: "true",
        }


DEFAULT_REAL_NODES = (RealNode("real-1", 1, "eu-1a"), RealNode("real-2", 2, "eu-1b"))


def _setns(fd: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.setns(fd, _CLONE_NEWNET) != 0:
        raise OSError(ctypes.get_errno(), "setns")


class NetNs:
    """A network namespace of this run (`ip netns add`), deleted by `delete`."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.path = Path("/run/netns") / name
        subprocess.run(["ip", "netns", "add", name], check=True, capture_output=True)
        self.ip("link", "set", "lo", "up")

    def ip(self, *args: str) -> None:
        subprocess.run(["ip", "-n", self.name, *args], check=True, capture_output=True)

    def argv(self, command: Sequence[str]) -> list[str]:
        return ["nsenter", f"--net={self.path}", "--", *command]

    @contextlib.contextmanager
    def entered(self) -> Iterator[None]:
        """The calling thread in this namespace (setns is per thread): a socket made here stays in it."""
        with open("/proc/thread-self/ns/net") as home, open(self.path) as there:
            _setns(there.fileno())
            try:
                yield
            finally:
                _setns(home.fileno())

    def socket(self) -> socket.socket:
        with self.entered():
            return socket.socket(socket.AF_INET, socket.SOCK_STREAM)

    def delete(self) -> None:
        subprocess.run(["ip", "netns", "delete", self.name], capture_output=True)


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        with contextlib.suppress(Exception):
            writer.close()


async def _splice(a: tuple[asyncio.StreamReader, asyncio.StreamWriter],
                  b: tuple[asyncio.StreamReader, asyncio.StreamWriter]) -> None:  # fmt: skip
    await asyncio.gather(_pipe(a[0], b[1]), _pipe(b[0], a[1]))


class Relays:
    """The two relays between the machine's loopback and the namespace (see the module's docstring)."""

    def __init__(self, ns: NetNs, apiserver_port: int, egress_socket: Path) -> None:
        self.ns = ns
        self.apiserver_port = apiserver_port
        self.egress_socket = egress_socket
        self.loop = BackgroundLoop()
        self.servers: list[asyncio.AbstractServer] = []

    def start(self) -> Relays:
        self.loop.run(self._start())
        return self

    async def _start(self) -> None:
        listener = self.ns.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((APISERVER_IP, self.apiserver_port))
        self.servers.append(await asyncio.start_server(self._to_apiserver, sock=listener))
        self.servers.append(await asyncio.start_unix_server(self._egress, path=str(self.egress_socket)))

    async def _to_apiserver(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            upstream = await asyncio.open_connection(LOOPBACK, self.apiserver_port)
        except OSError:
            writer.close()
            return
        await _splice((reader, writer), upstream)

    async def _egress(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """One HTTP CONNECT from the apiserver: the connection is opened from inside the namespace."""
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
            method, target, _ = head.split(b"\r\n", 1)[0].decode().split(" ", 2)
            host, port = target.rsplit(":", 1)
            if method != "CONNECT":
                raise ValueError(method)
            sock = self.ns.socket()
            sock.setblocking(False)
            await asyncio.wait_for(asyncio.get_running_loop().sock_connect(sock, (host.strip("[]"), int(port))), 10)
            upstream = await asyncio.open_connection(sock=sock)
        except (TimeoutError, OSError, ValueError, asyncio.IncompleteReadError) as exc:
            with contextlib.suppress(Exception):
                writer.write(f"HTTP/1.1 503 Service Unavailable\r\n\r\n{exc}".encode())
                await writer.drain()
                writer.close()
            return
        writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
        await writer.drain()
        await _splice((reader, writer), upstream)

    def to_machine(self, port: int) -> tuple[str, int]:
        """A listener at MACHINE_SIDE_IP:`port` inside the namespace, each connection carried to the
        same port on the machine's loopback: where a Service's EndpointSlice sends pods (and the
        apiserver's egress) to reach a server of the test run. The ports are the machine's free
        ones, so they never collide inside the namespace either."""
        self.loop.run(self._listen_in_namespace(MACHINE_SIDE_IP, port, LOOPBACK, port))
        return MACHINE_SIDE_IP, port

    def from_machine(self, host: str, port: int, target: str, target_port: int) -> None:
        """A listener at `host`:`port` on the machine, each connection opened from inside the
        namespace to `target`:`target_port` (a Service's ClusterIP, where kube-proxy picks a Ready
        endpoint): how the test process calls the install's Service as a pod of the cluster would."""
        self.loop.run(self._listen_on_machine(host, port, target, target_port))

    async def _listen_in_namespace(self, ip: str, port: int, upstream_host: str, upstream_port: int) -> None:
        listener = self.ns.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((ip, port))

        async def carry(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            try:
                upstream = await asyncio.open_connection(upstream_host, upstream_port)
            except OSError:
                writer.close()  # the server is down: the caller sees its connection closed
                return
            await _splice((reader, writer), upstream)

        self.servers.append(await asyncio.start_server(carry, sock=listener))

    async def _listen_on_machine(self, host: str, port: int, target: str, target_port: int) -> None:
        async def carry(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            sock = self.ns.socket()
            sock.setblocking(False)
            try:
                await asyncio.wait_for(asyncio.get_running_loop().sock_connect(sock, (target, target_port)), 10)
                upstream = await asyncio.open_connection(sock=sock)
            except (TimeoutError, OSError):
                sock.close()
                writer.close()
                return
            await _splice((reader, writer), upstream)

        self.servers.append(await asyncio.start_server(carry, host, port, reuse_address=True))

    def stop(self) -> None:
        async def close() -> None:
            for server in self.servers:
                server.close()

        with contextlib.suppress(Exception):
            self.loop.run(close())
        self.loop.close()


def write_egress_config(path: Path, egress_socket: Path) -> Path:
    """The apiserver's EgressSelectorConfiguration: its traffic to the cluster goes through the relay."""
    config = {
        "apiVersion": "apiserver.k8s.io/v1beta1",
        "kind": "EgressSelectorConfiguration",
        "egressSelections": [{"name": "cluster", "connection": {
            "proxyProtocol": "HTTPConnect", "transport": {"uds": {"udsName": str(egress_socket)}}}}],
    }  # fmt: skip
    path.write_text(yaml.safe_dump(config))
    return path


def pause_image_archive(pause_binary: Path, path: Path) -> Path:
    """An OCI archive of the sandbox image: one layer holding our pause program."""
    layer = io.BytesIO()
    with tarfile.open(fileobj=layer, mode="w") as tar:
        info = tar.gettarinfo(str(pause_binary), arcname="pause")
        info.uid = info.gid = 0
        info.uname = info.gname = ""
        info.mode = 0o755
        with pause_binary.open("rb") as f:
            tar.addfile(info, f)
    layer_bytes = layer.getvalue()
    layer_digest = "sha256:" + hashlib.sha256(layer_bytes).hexdigest()
    config = json.dumps({
        "architecture": "amd64", "os": "linux",
        "config": {"Entrypoint": ["/pause"]},
        "rootfs": {"type": "layers", "diff_ids": [layer_digest]},
    }).encode()  # fmt: skip
    config_digest = "sha256:" + hashlib.sha256(config).hexdigest()
    manifest = json.dumps({
        "schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": config_digest,
                   "size": len(config)},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": layer_digest,
                    "size": len(layer_bytes)}],
    }).encode()  # fmt: skip
    manifest_digest = "sha256:" + hashlib.sha256(manifest).hexdigest()
    index = json.dumps({
        "schemaVersion": 2,
        "manifests": [{"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": manifest_digest,
                       "size": len(manifest), "annotations": {"org.opencontainers.image.ref.name": PAUSE_IMAGE}}],
    }).encode()  # fmt: skip
    with tarfile.open(path, "w") as tar:
        for name, data in (("oci-layout", b'{"imageLayoutVersion": "1.0.0"}'), ("index.json", index),
                           (f"blobs/sha256/{config_digest[7:]}", config),
                           (f"blobs/sha256/{manifest_digest[7:]}", manifest),
                           (f"blobs/sha256/{layer_digest[7:]}", layer_bytes)):  # fmt: skip
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def image_archive() -> tuple[Path, str]:
    """The image `make image` built from this work tree (OCI archive) and its tag: the build
    folder is named in the work tree's .image (hack/image/build.sh), as clones sharing PEERS_DIR
    may have built different sources."""
    pointer = peers.REPO / ".image"
    folder = Path(pointer.read_text().strip()) if pointer.exists() else peers.peers_dir() / "image" / "builds" / "none"
    archive, tag = folder / "scheduling-webhook.oci.tar", folder / "scheduling-webhook.tag"
    if not archive.exists() or not tag.exists():
        peers.missing(f"the image of this work tree ({archive}; `make image` builds it)")
    return archive, tag.read_text().strip()


@dataclass
class NodeProcesses:
    node: RealNode
    dir: Path
    socket: Path
    cgroup_root: str
    containerd: Process | None = None
    kubelet: Process | None = None


@dataclass
class RealNodes:
    ns: NetNs
    relays: Relays
    run_dir: Path  # short paths for the sockets (a Unix socket path has at most 107 bytes)
    nodes: dict[str, NodeProcesses] = field(default_factory=dict)
    kube_proxy: Process | None = None
    timings: dict[str, float] = field(default_factory=dict)  # per node: process start to Ready

    def ctr(self, node: str, *args: str, timeout: float = 120) -> str:
        n = self.nodes[node]
        result = subprocess.run(
            [str(peers.binary("ctr")), "--address", str(n.socket), "--namespace", "k8s.io", *args],
            capture_output=True, text=True, timeout=timeout,
        )  # fmt: skip
        if result.returncode != 0:
            raise RuntimeError(f"ctr {' '.join(args)} on {node}: {result.stderr}")
        return result.stdout

    def processes(self) -> list[Process]:
        procs = [p for n in self.nodes.values() for p in (n.containerd, n.kubelet) if p is not None]
        return procs + ([self.kube_proxy] if self.kube_proxy else [])

    def stop(self) -> None:
        """Kubelets first (no restart of what is killed next), then every container, then the rest."""
        for n in self.nodes.values():
            if n.kubelet:
                n.kubelet.stop()
        for name, n in self.nodes.items():
            if n.containerd and n.containerd.alive():
                with contextlib.suppress(Exception):
                    for task in self.ctr(name, "tasks", "list", "--quiet").split():
                        with contextlib.suppress(Exception):
                            self.ctr(name, "tasks", "kill", "--signal", "SIGKILL", task)
                time.sleep(0.5)
        if self.kube_proxy:
            self.kube_proxy.stop()
        for n in self.nodes.values():
            if n.containerd:
                n.containerd.stop()
            _kill_shims(n.socket)
        _unmount_under([n.dir for n in self.nodes.values()] + [self.run_dir])
        for n in self.nodes.values():
            _remove_cgroups(n.cgroup_root)
        self.relays.stop()
        self.ns.delete()
        shutil.rmtree(self.run_dir, ignore_errors=True)


def _kill_shims(containerd_socket: Path) -> None:
    """The shims (and so the containers) of one containerd: each runs in a session of its own, so
    stopping containerd leaves them; found by the containerd address on their command line."""
    needle = str(containerd_socket).encode()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        with contextlib.suppress(OSError):
            if needle in Path(f"/proc/{pid}/cmdline").read_bytes():
                os.kill(int(pid), signal.SIGKILL)


def _unmount_under(dirs: Sequence[Path]) -> None:
    roots = [str(d.resolve()) for d in dirs]
    mounts = [line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()]
    for point in sorted((m for m in mounts if any(m == r or m.startswith(r + "/") for r in roots)), reverse=True):
        subprocess.run(["umount", "-l", point], capture_output=True)


def _cgroup_controllers() -> list[Path]:
    base = Path("/sys/fs/cgroup")
    return [p for p in base.iterdir() if p.is_dir() and not p.is_symlink() and (p / "cgroup.procs").exists()]


def _make_cgroups(root: str) -> None:
    for controller in _cgroup_controllers():
        top = controller / root.strip("/")
        top.mkdir(exist_ok=True)
        # cgroup v1 starts a cpuset with no CPU and no memory node, where no process may join.
        for name in ("cpuset.cpus", "cpuset.mems"):
            if (top / name).exists() and not (top / name).read_text().strip():
                (top / name).write_text((controller / name).read_text())


def _kill_cgroup(root: str) -> None:
    """Every process left in a node's cgroup tree (a container whose shim is gone is reparented)."""
    for controller in _cgroup_controllers():
        top = controller / root.strip("/")
        for procs in top.rglob("cgroup.procs") if top.exists() else ():
            for pid in procs.read_text().split():
                with contextlib.suppress(OSError):
                    os.kill(int(pid), signal.SIGKILL)


def _remove_cgroups(root: str) -> None:
    _kill_cgroup(root)
    time.sleep(0.2)
    for controller in _cgroup_controllers():
        top = controller / root.strip("/")
        if top.exists():
            for sub in sorted(top.rglob("*"), key=lambda p: len(p.parts), reverse=True):
                if sub.is_dir():
                    with contextlib.suppress(OSError):
                        sub.rmdir()
            with contextlib.suppress(OSError):
                top.rmdir()


def _containerd_config(n: NodeProcesses, state: Path) -> str:
    cni_bin = peers.peers_dir() / "bin" / "cni"
    return f"""version = 3
root = "{n.dir / "containerd"}"
state = "{state}"
disabled_plugins = ["io.containerd.nri.v1.nri"]

[grpc]
  address = "{n.socket}"

[ttrpc]
  address = "{n.socket}.ttrpc"

[plugins.'io.containerd.cri.v1.images']
  snapshotter = "overlayfs"
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = "{PAUSE_IMAGE}"

[plugins.'io.containerd.cri.v1.runtime']
  enable_selinux = false
  # The pods' network namespaces under this node's state folder, not /run/netns of the machine.
  netns_mounts_under_state_dir = true
  # This machine's root may not lower an OOM score (no CAP_SYS_RESOURCE), and the kubelet asks
  # -998 for every sandbox: containerd keeps each score at or above its own.
  restrict_oom_score_adj = true
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = ["{cni_bin}"]
    conf_dir = "{n.dir / "cni"}"
  [plugins.'io.containerd.cri.v1.runtime'.containerd]
    default_runtime_name = "runc"
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
        BinaryName = "{RUNC}"
        SystemdCgroup = false

[plugins.'io.containerd.grpc.v1.cri']
  stream_server_address = "{n.node.ip}"
  stream_server_port = "0"
"""


def _cni_config(n: NodeProcesses) -> dict[str, Any]:
    return {
        "cniVersion": "1.0.0",
        "name": f"pods-{n.node.name}",
        "plugins": [{
            "type": "bridge", "bridge": f"swbr{n.node.index}", "isGateway": True, "ipMasq": False,
            "hairpinMode": True,
            "ipam": {"type": "host-local", "ranges": [[{"subnet": str(n.node.pod_cidr)}]],
                     "routes": [{"dst": "0.0.0.0/0"}], "dataDir": str(n.dir / "ipam")},
        }],
    }  # fmt: skip


def _kubelet_config(n: NodeProcesses, ca_file: Path) -> dict[str, Any]:
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        # This machine mounts cgroup v1 (the kubelet refuses it unless told otherwise).
        "failCgroupV1": False,
        "failSwapOn": False,
        "cgroupDriver": "cgroupfs",
        # Each node its own cgroup tree: two kubelets on one machine must not share /kubepods.
        "cgroupRoot": n.cgroup_root,
        "address": n.node.ip,
        "healthzBindAddress": n.node.ip,
        "readOnlyPort": 0,
        "authentication": {"anonymous": {"enabled": False}, "webhook": {"enabled": True},
                           "x509": {"clientCAFile": str(ca_file)}},
        "authorization": {"mode": "Webhook"},
        "containerRuntimeEndpoint": f"unix://{n.socket}",
        "podLogsDir": str(n.dir / "pod-logs"),
        # No DNS in the namespace: pods get an empty resolv.conf rather than the machine's resolvers.
        "resolvConf": str(n.dir / "resolv.conf"),
        # The machine's disk is shared: a nearly full disk must not evict the install's pods.
        "evictionHard": {"memory.available": "50Mi", "nodefs.available": "1%", "imagefs.available": "1%",
                         "nodefs.inodesFree": "1%"},
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "maxPods": 30,
        "serializeImagePulls": False,
        "syncFrequency": "5s",
        "fileCheckFrequency": "5s",
        "nodeStatusReportFrequency": "10s",
        "shutdownGracePeriod": "0s",
        "localStorageCapacityIsolation": False,
    }  # fmt: skip


def _node_ready(kubectl: Any, name: str) -> bool:
    result = kubectl("get", "node", name, "-o", "json", check=False)
    if result.returncode != 0:
        return False
    conditions = json.loads(result.stdout).get("status", {}).get("conditions", [])
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def prepare(dir: Path, apiserver_port: int) -> RealNodes:
    """The namespace and the relays, before the apiserver starts (it is told where its egress goes)."""
    token = uuid.uuid4().hex[:8]
    run_dir = Path("/run") / f"sw-{token}"
    run_dir.mkdir(parents=True)
    ns = NetNs(f"sw-{token}")
    try:
        ns.ip("addr", "add", f"{APISERVER_IP}/32", "dev", "lo")
        ns.ip("addr", "add", f"{MACHINE_SIDE_IP}/32", "dev", "lo")
        # A route for the Service CIDR, or a connection from the namespace itself (the apiserver's
        # egress) fails before kube-proxy's DNAT sees it; the source is an address pods answer.
        ns.ip("route", "add", str(SERVICE_CIDR), "dev", "lo", "src", APISERVER_IP)
        relays = Relays(ns, apiserver_port, run_dir / "egress.sock").start()
    except BaseException:
        ns.delete()
        shutil.rmtree(run_dir, ignore_errors=True)
        raise
    return RealNodes(ns, relays, run_dir)


def start_nodes(
    real: RealNodes, dir: Path, pki: Pki, apiserver_port: int, kubectl: Any, nodes: Sequence[RealNode]
) -> None:
    """containerd (with the images imported), kubelet and one kube-proxy for the namespace, until
    every node is Ready."""
    names = ("containerd", "containerd-shim-runc-v2", "ctr", "kubelet", "kube-proxy", "pause", "cni/bridge")
    binaries = {name: peers.binary(name) for name in names}
    if not os.access(RUNC, os.X_OK):
        peers.missing(f"runc ({RUNC}; `make peers` installs Debian's package)")
    archive, _tag = image_archive()
    logs = dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    pause_archive = pause_image_archive(binaries["pause"], dir / "pause.oci.tar")
    server = f"https://{APISERVER_IP}:{apiserver_port}"
    path_env = {"PATH": f"{binaries['containerd'].parent}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}

    def kubeconfig(name: str, cert: ClientCert) -> Path:
        from tests.support.control_plane.cluster import write_kubeconfig

        user = {"client-certificate": str(cert.cert_file), "client-key": str(cert.key_file)}
        return write_kubeconfig(dir / f"{name}.kubeconfig", server, pki.ca_file, user)

    for node in nodes:
        ndir = dir / node.name
        ndir.mkdir(parents=True, exist_ok=True)
        sock_dir = real.run_dir / node.name
        sock_dir.mkdir(parents=True, exist_ok=True)
        n = NodeProcesses(node, ndir, sock_dir / "containerd.sock", f"/{real.ns.name}-{node.name}")
        real.nodes[node.name] = n
        real.ns.ip("addr", "add", f"{node.ip}/32", "dev", "lo")
        (ndir / "cni").mkdir(exist_ok=True)
        (ndir / "cni" / "10-pods.conflist").write_text(json.dumps(_cni_config(n)))
        (ndir / "resolv.conf").write_text("")
        config = ndir / "containerd.toml"
        config.write_text(_containerd_config(n, sock_dir / "state"))
        t0 = time.monotonic()
        containerd = [str(binaries["containerd"]), "--config", str(config), "--log-level", "warn"]
        n.containerd = Process(f"{node.name}-containerd", real.ns.argv(containerd), logs, path_env).start()
        sock = n.socket
        n.containerd.wait_for(sock.exists, within=30, what="containerd's socket")
        real.ctr(node.name, "images", "import", str(archive))
        real.ctr(node.name, "images", "import", str(pause_archive))
        _make_cgroups(n.cgroup_root)
        cert = client_cert(pki, f"node-{node.name}", f"system:node:{node.name}", ("system:nodes",))
        kconfig = ndir / "kubelet.yaml"
        kconfig.write_text(yaml.safe_dump(_kubelet_config(n, pki.ca_file)))
        labels = ",".join(f"{k}={v}" for k, v in node.labels().items())
        n.kubelet = Process(f"{node.name}-kubelet", real.ns.argv([
            str(binaries["kubelet"]), f"--config={kconfig}", f"--kubeconfig={kubeconfig(f'kubelet-{node.name}', cert)}",
            f"--root-dir={ndir / 'kubelet'}", f"--cert-dir={ndir / 'kubelet-pki'}",
            f"--hostname-override={node.name}", f"--node-ip={node.ip}", f"--node-labels={labels}",
            f"--register-with-taints={REAL_NODE_TAINT['key']}={REAL_NODE_TAINT['value']}:{REAL_NODE_TAINT['effect']}",
            "--v=1",
        ]), logs, path_env).start()  # fmt: skip
        real.timings[f"{node.name} start"] = t0
    proxy_cert = client_cert(pki, "kube-proxy", "system:kube-proxy")
    proxy_config = dir / "kube-proxy.yaml"
    first = nodes[0]
    proxy_config.write_text(yaml.safe_dump({
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1", "kind": "KubeProxyConfiguration",
        "clientConnection": {"kubeconfig": str(kubeconfig("kube-proxy", proxy_cert))},
        "mode": "iptables", "clusterCIDR": str(NETWORK), "hostnameOverride": first.name,
        "bindAddress": first.ip, "healthzBindAddress": f"{LOOPBACK}:10256", "metricsBindAddress": f"{LOOPBACK}:10249",
        # 0: leave the machine-wide conntrack sysctls alone (they are not per namespace).
        "conntrack": {"maxPerCore": 0, "min": 0, "tcpEstablishedTimeout": "0s", "tcpCloseWaitTimeout": "0s"},
        "iptables": {"localhostNodePorts": False},
    }))  # fmt: skip
    real.kube_proxy = Process("kube-proxy", real.ns.argv(
        [str(binaries["kube-proxy"]), f"--config={proxy_config}", "--v=1"]), logs, path_env).start()  # fmt: skip
    deadline = time.monotonic() + 180
    pending = {n.name for n in nodes}
    while pending:
        for proc in real.processes():
            if not proc.alive():
                raise RuntimeError(f"{proc.name} exited while its node joined:\n{proc.tail()}")
        for name in sorted(pending):
            if _node_ready(kubectl, name):
                real.timings[name] = time.monotonic() - real.timings.pop(f"{name} start")
                pending.discard(name)
        if time.monotonic() > deadline:
            raise RuntimeError(f"nodes {sorted(pending)} not Ready after 180 s:\n"
                               + "\n".join(f"--- {p.name}\n{p.tail()}" for p in real.processes()))  # fmt: skip
        time.sleep(0.5)
