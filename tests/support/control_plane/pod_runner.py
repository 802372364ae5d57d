"""The kubelet's part for the pods of one workload: their containers are real local processes.

kwok gives the test cluster nodes and fakes every other pod's lifecycle. The install's own pods
(the Deployment of `scheduling-webhook serve`) must really run, so kwok leaves them alone (see
`kwok_stages`) and this runner does what a kubelet would, from the pod as stored:

- starts the container's command (the image maps to a local program) with the pod's args and env
  (`value`, `fieldRef`, `secretKeyRef`, `configMapKeyRef`; `$(VAR)` expanded), its Secret,
  ConfigMap and emptyDir volumes written to a folder of the pod's (mount paths in args and env
  point there), and a token of the pod's ServiceAccount bound to the pod (TokenRequest), given as
  a kubeconfig;
- reports status (Running, a pod IP, restarts), and Ready from the pod's own startup and readiness
  probes, periods and thresholds included, so the Deployment controller rolls and the endpoints
  follow as in a cluster;
- restarts a container that dies (restartPolicy Always); a pod of restartPolicy Never (a Job's)
  ends Succeeded or Failed by its exit code, as the Job controller expects;
- on deletion: not Ready at once, the preStop sleep, SIGTERM, SIGKILL after the grace period, then
  the pod is deleted for good.

What it does not: the network. A container listens where `network_args` says (the Service's
ClusterIP, see cluster.py), liveness probes are not run, and resources are not enforced.
"""

from __future__ import annotations

import base64
import contextlib
import datetime as dt
import itertools
import re
import shutil
import ssl
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tests.support.control_plane.processes import Process
from tests.support.control_plane.rest import Rest, RestError

Obj = dict[str, Any]
NetworkArgs = Callable[[Obj, int], list[str]]  # (pod, probe port) -> arguments appended to the command
POLL_S = 0.2
_VAR = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")
_pod_ips = itertools.count(1)


def _now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class Probe:
    path: str
    port: int
    period_s: float
    failure_threshold: int
    success_threshold: int
    next_at: float = 0.0
    failures: int = 0
    successes: int = 0


@dataclass
class Container:
    pod: str
    uid: str
    dir: Path
    process: Process
    probe_port: int
    pod_ip: str
    started_at: str
    restarts: int = 0
    started: bool = False  # startup probe passed
    ready: bool = False
    terminating: bool = False
    exit_code: int | None = None  # set once a pod that is not restarted has ended
    startup: Probe | None = None
    readiness: Probe | None = None
    secret_versions: dict[str, str] = field(default_factory=dict)


def _probe(spec: Obj | None, port: int) -> Probe | None:
    if not spec or "httpGet" not in spec:
        return None
    return Probe(
        spec["httpGet"].get("path", "/"),
        port,
        float(spec.get("periodSeconds", 10)),
        int(spec.get("failureThreshold", 3)),
        int(spec.get("successThreshold", 1)),
        next_at=time.monotonic() + float(spec.get("initialDelaySeconds", 0)),
    )


class PodRunner:
    def __init__(
        self,
        rest: Rest,
        namespace: str,
        selector: str,
        programs: Mapping[str, Sequence[str]],
        network_args: NetworkArgs,
        probe_host: str,
        free_port: Callable[[], int],
        dir: Path,
        apiserver_url: str,
        ca_file: Path,
    ) -> None:
        self.rest = rest
        self.namespace = namespace
        self.selector = selector
        self.programs = programs  # image name (without tag) -> the local command
        self.network_args = network_args
        self.probe_host = probe_host
        self.free_port = free_port
        self.dir = dir
        self.apiserver_url = apiserver_url
        self.ca_file = ca_file
        self.containers: dict[str, Container] = {}  # by pod uid
        self.errors: list[str] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"pod-runner-{namespace}", daemon=True)
        self._probe_ctx = ssl.create_default_context()
        self._probe_ctx.check_hostname = False
        self._probe_ctx.verify_mode = ssl.CERT_NONE  # as the kubelet: probes do not verify

    # ---- for tests

    def start(self) -> PodRunner:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)
        with self._lock:
            containers = list(self.containers.values())
            self.containers.clear()
        for c in containers:
            c.process.stop(grace_s=5)

    def running(self) -> list[Container]:
        with self._lock:
            return [c for c in self.containers.values() if not c.terminating and c.process.alive()]

    def container(self, pod_name: str) -> Container:
        with self._lock:
            for c in self.containers.values():
                if c.pod == pod_name:
                    return c
        raise KeyError(pod_name)

    def wait_ready(self, count: int, within: float = 60) -> list[Container]:
        deadline = time.monotonic() + within
        while True:
            ready = [c for c in self.running() if c.ready]
            if len(ready) >= count:
                return ready
            if time.monotonic() > deadline:
                logs = "\n".join(f"--- {c.pod}\n{c.process.tail()}" for c in self.running())
                raise AssertionError(f"{len(ready)} of {count} pods Ready after {within:.0f} s; errors "
                                     f"{self.errors[-5:]}\n{logs}")  # fmt: skip
            time.sleep(0.1)

    # ---- the loop

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._sync()
            except Exception as exc:
                self.errors.append(f"{type(exc).__name__}: {exc}")
            self._stop.wait(POLL_S)

    def _sync(self) -> None:
        selector = urllib.parse.quote(self.selector)
        pods = self.rest.get(f"/api/v1/namespaces/{self.namespace}/pods?labelSelector={selector}")["items"]
        seen = set()
        for pod in pods:
            uid = pod["metadata"]["uid"]
            seen.add(uid)
            container = self.containers.get(uid)
            if pod["metadata"].get("deletionTimestamp"):
                if container is None:
                    self._delete_now(pod)
                elif not container.terminating:
                    container.terminating = True
                    threading.Thread(target=self._terminate, args=(pod, container), daemon=True).start()
                continue
            if not pod["spec"].get("nodeName"):
                continue  # not scheduled yet
            if container is None:
                container = self._start(pod)
                with self._lock:
                    self.containers[uid] = container
                self._report(pod, container)
                continue
            if container.exit_code is not None:
                continue  # ended, not restarted: the Job controller or the owner deletes it
            self._refresh_volumes(pod, container)
            if not container.process.alive() and pod["spec"].get("restartPolicy", "Always") != "Always":
                assert container.process.popen is not None
                container.exit_code = container.process.popen.returncode
                self._report(pod, container)
                continue
            if not container.process.alive():
                container.restarts += 1
                container.ready = container.started = False
                container.process.start()
                container.started_at = _now()
                container.startup = _probe(pod["spec"]["containers"][0].get("startupProbe"), container.probe_port)
                container.readiness = _probe(pod["spec"]["containers"][0].get("readinessProbe"), container.probe_port)
                self._report(pod, container)
                continue
            if self._probe(container):
                self._report(pod, container)
        for uid in set(self.containers) - seen:  # deleted by someone else with grace 0
            with self._lock:
                gone = self.containers.pop(uid)
            gone.process.stop(grace_s=1)

    # ---- start

    def _start(self, pod: Obj) -> Container:
        meta, spec = pod["metadata"], pod["spec"]
        (container_spec,) = spec["containers"]  # one container per pod is all the install has
        pod_dir = self.dir / meta["name"]
        shutil.rmtree(pod_dir, ignore_errors=True)
        pod_dir.mkdir(parents=True)
        mounts = self._volumes(pod, container_spec, pod_dir)
        env = self._env(pod, container_spec)

        def local(value: str) -> str:
            for mount_path, local_path in sorted(mounts.items(), key=lambda kv: -len(kv[0])):
                if value == mount_path or value.startswith(mount_path.rstrip("/") + "/"):
                    return str(local_path) + value[len(mount_path) :]
            return value

        env = {k: local(v) for k, v in env.items()}
        env["KUBECONFIG"] = str(self._kubeconfig(pod, pod_dir))  # ours: never remapped
        expand = lambda s: _VAR.sub(lambda m: env.get(m.group(1), m.group(0)), s)  # noqa: E731
        image = container_spec["image"].rsplit(":", 1)[0].rsplit("/", 1)[-1]
        program = self.programs.get(image)
        if program is None:
            raise RuntimeError(f"no local program for image {container_spec['image']}")
        probe_port = self.free_port()
        n = next(_pod_ips)
        args = [local(expand(a)) for a in [*container_spec.get("command", []), *container_spec.get("args", [])]]
        argv = [*program, *args, *self.network_args(pod, probe_port)]
        process = Process(meta["name"], argv, pod_dir, env=env).start()
        return Container(
            pod=meta["name"], uid=meta["uid"], dir=pod_dir, process=process, probe_port=probe_port,
            pod_ip=f"10.245.{n // 250}.{n % 250 + 1}", started_at=_now(),
            startup=_probe(container_spec.get("startupProbe"), probe_port),
            readiness=_probe(container_spec.get("readinessProbe"), probe_port),
        )  # fmt: skip

    def _env(self, pod: Obj, container: Obj) -> dict[str, str]:
        fields = {
            "metadata.name": pod["metadata"]["name"],
            "metadata.namespace": pod["metadata"]["namespace"],
            "metadata.uid": pod["metadata"]["uid"],
            "spec.serviceAccountName": pod["spec"].get("serviceAccountName", "default"),
            "spec.nodeName": pod["spec"].get("nodeName", ""),
        }
        env: dict[str, str] = {}
        for item in container.get("env") or ():
            if "value" in item:
                env[item["name"]] = _VAR.sub(lambda m: env.get(m.group(1), m.group(0)), item["value"])
                continue
            source = item.get("valueFrom") or {}
            if "fieldRef" in source:
                env[item["name"]] = fields.get(source["fieldRef"]["fieldPath"], "")
            for kind, ref in (("secrets", source.get("secretKeyRef")), ("configmaps", source.get("configMapKeyRef"))):
                if ref:
                    data = self._data(kind, ref["name"], optional=bool(ref.get("optional")))
                    if ref["key"] in data:
                        env[item["name"]] = data[ref["key"]].decode()
        return env

    def _data(self, kind: str, name: str, *, optional: bool) -> dict[str, bytes]:
        try:
            obj = self.rest.get(f"/api/v1/namespaces/{self.namespace}/{kind}/{name}")
        except RestError as exc:
            if exc.status == 404 and optional:
                return {}
            raise
        if kind == "secrets":
            return {k: base64.b64decode(v) for k, v in (obj.get("data") or {}).items()}
        return {k: v.encode() for k, v in (obj.get("data") or {}).items()}

    def _volumes(self, pod: Obj, container: Obj, pod_dir: Path) -> dict[str, Path]:
        volumes = {v["name"]: v for v in pod["spec"].get("volumes") or ()}
        mounts: dict[str, Path] = {}
        for mount in container.get("volumeMounts") or ():
            volume = volumes[mount["name"]]
            local = pod_dir / "volumes" / mount["name"]
            local.mkdir(parents=True, exist_ok=True)
            self._write_volume(volume, local)
            mounts[mount["mountPath"]] = local
        return mounts

    def _write_volume(self, volume: Obj, local: Path) -> str | None:
        """Writes a Secret or ConfigMap volume's files; returns the source's resourceVersion."""
        for kind, key, name_key in (("secrets", "secret", "secretName"), ("configmaps", "configMap", "name")):
            source = volume.get(key)
            if source is None:
                continue
            try:
                obj = self.rest.get(f"/api/v1/namespaces/{self.namespace}/{kind}/{source[name_key]}")
            except RestError as exc:
                if exc.status == 404 and source.get("optional"):
                    return None
                raise
            raw = obj.get("data") or {}
            data = {k: base64.b64decode(v) if kind == "secrets" else v.encode() for k, v in raw.items()}
            items = source.get("items") or [{"key": k, "path": k} for k in data]
            for item in items:
                if item["key"] in data:
                    target = local / item["path"]
                    tmp = target.with_name(f".{target.name}.tmp")
                    tmp.write_bytes(data[item["key"]])
                    tmp.replace(target)  # as the kubelet's atomic writer: readers never see half a file
            return str(obj["metadata"]["resourceVersion"])
        return None

    def _refresh_volumes(self, pod: Obj, container: Container) -> None:
        # The kubelet updates Secret and ConfigMap volumes in place (eventually); so does this, each second.
        now = time.monotonic()
        if container.secret_versions.get("_at") and now - float(container.secret_versions["_at"]) < 1:
            return
        container.secret_versions["_at"] = str(now)
        volumes = {v["name"]: v for v in pod["spec"].get("volumes") or ()}
        for mount in pod["spec"]["containers"][0].get("volumeMounts") or ():
            version = self._write_volume(volumes[mount["name"]], container.dir / "volumes" / mount["name"])
            if version is not None:
                container.secret_versions[mount["name"]] = version

    def _kubeconfig(self, pod: Obj, pod_dir: Path) -> Path:
        meta = pod["metadata"]
        account = pod["spec"].get("serviceAccountName", "default")
        request = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                   "spec": {"expirationSeconds": 4 * 3600,
                            "boundObjectRef": {"apiVersion": "v1", "kind": "Pod", "name": meta["name"],
                                               "uid": meta["uid"]}}}  # fmt: skip
        answer = self.rest.call("POST", f"/api/v1/namespaces/{self.namespace}/serviceaccounts/{account}/token", request)
        path = pod_dir / "kubeconfig"
        path.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config",
            "clusters": [{"name": "c", "cluster": {"server": self.apiserver_url,
                                                   "certificate-authority": str(self.ca_file)}}],
            "users": [{"name": "sa", "user": {"token": answer["status"]["token"]}}],
            "contexts": [{"name": "c", "context": {"cluster": "c", "user": "sa", "namespace": self.namespace}}],
            "current-context": "c",
        }))  # fmt: skip
        return path

    # ---- probes and status

    def _probe(self, c: Container) -> bool:
        """Runs the probe that is due; True when Ready changed."""
        now = time.monotonic()
        probe = c.startup if (c.startup is not None and not c.started) else c.readiness
        if probe is None:
            changed = not c.ready
            c.started = c.ready = True
            return changed
        if now < probe.next_at:
            return False
        probe.next_at = now + probe.period_s
        ok = self._http_ok(c, probe)
        if probe is c.startup:
            if ok:
                c.started = True
                if c.readiness is not None:
                    c.readiness.next_at = now  # readiness starts right after startup succeeds
                    return False
                c.ready = True
                return True
            return False
        before = c.ready
        if ok:
            probe.failures, probe.successes = 0, probe.successes + 1
            if probe.successes >= probe.success_threshold:
                c.ready = True
        else:
            probe.successes, probe.failures = 0, probe.failures + 1
            if probe.failures >= probe.failure_threshold:
                c.ready = False
        return c.ready != before

    def _http_ok(self, c: Container, probe: Probe) -> bool:
        try:
            url = f"https://{self.probe_host}:{probe.port}{probe.path}"
            with urllib.request.urlopen(url, context=self._probe_ctx, timeout=2) as resp:
                return bool(200 <= resp.status < 400)
        except Exception:
            return False

    def _report(self, pod: Obj, c: Container) -> None:
        ready = "True" if c.ready and not c.terminating and c.exit_code is None else "False"
        name = pod["spec"]["containers"][0]["name"]
        image = pod["spec"]["containers"][0]["image"]
        running = c.process.alive()
        state: Obj = (
            {"running": {"startedAt": c.started_at}} if running else {"waiting": {"reason": "ContainerCreating"}}
        )
        phase = "Running"
        if c.exit_code is not None:
            phase = "Succeeded" if c.exit_code == 0 else "Failed"
            state = {"terminated": {"exitCode": c.exit_code, "startedAt": c.started_at, "finishedAt": _now(),
                                    "reason": "Completed" if c.exit_code == 0 else "Error"}}  # fmt: skip
        status = {
            "phase": phase,
            "hostIP": "10.0.0.1",
            "podIP": c.pod_ip,
            "podIPs": [{"ip": c.pod_ip}],
            "startTime": pod["status"].get("startTime") or c.started_at,
            "conditions": [
                {"type": "PodScheduled", "status": "True"},
                {"type": "Initialized", "status": "True"},
                {"type": "ContainersReady", "status": ready},
                {"type": "Ready", "status": ready},
            ],
            "containerStatuses": [{
                "name": name, "image": image, "imageID": image, "ready": ready == "True", "started": c.started,
                "restartCount": c.restarts, "state": state,
            }],
        }  # fmt: skip
        with contextlib.suppress(RestError):
            self.rest.merge_patch(f"/api/v1/namespaces/{self.namespace}/pods/{c.pod}/status", {"status": status})

    # ---- stop

    def _terminate(self, pod: Obj, c: Container) -> None:
        self._report(pod, c)  # not Ready at once: the endpoints drop the pod
        container = pod["spec"]["containers"][0]
        grace = float(pod["metadata"].get("deletionGracePeriodSeconds", 30))
        start = time.monotonic()
        pre_stop = ((container.get("lifecycle") or {}).get("preStop") or {}).get("sleep")
        if pre_stop:
            time.sleep(min(float(pre_stop["seconds"]), grace))
        c.process.stop(grace_s=max(0.0, grace - (time.monotonic() - start)))
        self._delete_now(pod)
        with self._lock:
            self.containers.pop(c.uid, None)

    def _delete_now(self, pod: Obj) -> None:
        meta = pod["metadata"]
        body = {"apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": 0,
                "preconditions": {"uid": meta["uid"]}}  # fmt: skip
        with contextlib.suppress(RestError):
            self.rest.call("DELETE", f"/api/v1/namespaces/{self.namespace}/pods/{meta['name']}", body)


# kwok completes a Job's pod as soon as it runs; a test that needs a job running (to be preempted,
# or relabelled while it runs) puts this annotation on the Job's pod template.
KEEP_RUNNING_ANNOTATION = "test.scheduling-webhook/keep-running"


def kwok_stages(stage_dir: Path, out_dir: Path, exclude_label: str, exclude_values: Sequence[str]) -> list[Path]:
    """kwok's own pod stages, each told to leave alone the pods a PodRunner runs, and the one that
    completes Job pods told to leave alone those annotated KEEP_RUNNING_ANNOTATION."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for source in sorted((stage_dir / "pod/fast").glob("pod-*.yaml")):
        stage = yaml.safe_load(source.read_text())
        stage["spec"]["selector"].setdefault("matchExpressions", []).append(
            {"key": f'.metadata.labels["{exclude_label}"]', "operator": "NotIn", "values": list(exclude_values)}
        )
        if source.name == "pod-complete.yaml":
            stage["spec"]["selector"]["matchExpressions"].append(
                {"key": f'.metadata.annotations["{KEEP_RUNNING_ANNOTATION}"]', "operator": "DoesNotExist"}
            )
        target = out_dir / source.name
        target.write_text(yaml.safe_dump(stage))
        paths.append(target)
    return paths
