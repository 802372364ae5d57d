"""The kube-apiserver's admission chain, attached to the Kubernetes API emulator.

    services = Services()
    services.add("hopsworks", "scheduling-webhook", replica_a_port, replica_b_port)
    chain = AdmissionChain(services).install(emulator)     # reads the webhook configurations stored there
    emulator.put_object(mutating_configuration)            # e.g. the rendered manifests, unedited
    ...                                                    # every create/update/delete over HTTP is admitted
    await chain.close()

Order, as the apiserver runs it on a write: NamespaceLifecycle; for pods, the schema's defaults and
the Priority plugin; the mutating webhooks (configurations sorted by name, webhooks in their order),
then one reinvocation pass for `reinvocationPolicy: IfNeeded` webhooks when a later one changed the
object; then (after naming and defaulting, so validating webhooks see the name and uid) the
validating webhooks, all of them, concurrently; then storage. Webhooks are called over HTTPS at the
Service of their `clientConfig`, which `services` maps to loopback ports, verifying the certificate
against `caBundle` and the Service's DNS name. What differs from a real apiserver is listed in
docs/admission-chain.md.
"""

from __future__ import annotations

import asyncio
import base64
import copy
import itertools
import json
import re
import ssl
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import jsonpatch

from tests.support.https import LOOPBACK, StaticResolver
from tests.support.kube_emulator import (
    NAMESPACES,
    AdmissionAttributes,
    ApiError,
    KubeEmulator,
    Obj,
    ResourceType,
)

MUTATING = ResourceType(
    "admissionregistration.k8s.io", "v1", "mutatingwebhookconfigurations", "MutatingWebhookConfiguration", False,
    generation=True,
)  # fmt: skip
VALIDATING = ResourceType(
    "admissionregistration.k8s.io", "v1", "validatingwebhookconfigurations", "ValidatingWebhookConfiguration", False,
    generation=True,
)  # fmt: skip

# Classes the apiserver creates itself (scheduling.k8s.io's SystemPriorityClasses).
SYSTEM_PRIORITY_CLASSES = {"system-node-critical": 2000001000, "system-cluster-critical": 2000000000}
IMMORTAL_NAMESPACES = ("default", "kube-system", "kube-public")
DEFAULT_TIMEOUT_S = 10  # admissionregistration/v1's default timeoutSeconds
OPTIONS_KIND = {"CREATE": "CreateOptions", "UPDATE": "UpdateOptions", "DELETE": "DeleteOptions"}


class Services:
    """Service -> loopback ports of its ready endpoints, taken in turn (as kube-proxy spreads them)."""

    def __init__(self) -> None:
        self.endpoints: dict[tuple[str, str], list[int]] = {}
        self._turns: dict[tuple[str, str], itertools.cycle[int]] = {}

    def add(self, namespace: str, name: str, *ports: int) -> None:
        self.endpoints[(namespace, name)] = list(ports)
        self._turns[(namespace, name)] = itertools.cycle(ports)

    def __call__(self, namespace: str, name: str, port: int) -> int:
        turns = self._turns.get((namespace, name))
        if turns is None or not self.endpoints[(namespace, name)]:
            raise LookupError(f'service "{name}" not found or has no endpoints available')
        return next(turns)


ServiceResolver = Callable[[str, str, int], int]  # (namespace, service, service port) -> loopback port


@dataclass(frozen=True, slots=True)
class WebhookCall:
    """What the chain did with one webhook on one request, for tests to read."""

    webhook: str
    operation: str
    resource: str
    namespace: str
    name: str
    dry_run: bool
    outcome: str  # allowed, patched, denied, error, ignored-error
    reinvoked: bool = False
    detail: str = ""


@dataclass(slots=True)
class _Hook:
    name: str
    spec: Mapping[str, Any]
    configuration: str
    mutating: bool

    @property
    def failure_policy(self) -> str:
        return str(self.spec.get("failurePolicy") or "Fail")

    @property
    def timeout_s(self) -> float:
        return float(self.spec.get("timeoutSeconds") or DEFAULT_TIMEOUT_S)


class _CallError(Exception):
    """The webhook could not be called or answered nonsense: failurePolicy decides."""


@dataclass
class AdmissionChain:
    services: ServiceResolver
    # Seconds after a namespace write before the chain's namespace cache shows it (the apiserver
    # reads namespaceSelector labels from its informer, fed by its watch cache). 0: the next turn
    # of the event loop, i.e. before the writer has even read its answer.
    namespace_lag_s: float = 0.0
    calls: list[WebhookCall] = field(default_factory=list)
    namespaces: dict[str, Obj] = field(default_factory=dict)  # the chain's own namespace cache
    _emulator: KubeEmulator | None = None
    _sessions: dict[str, aiohttp.ClientSession] = field(default_factory=dict)

    # -- wiring ---------------------------------------------------------------------------------
    def install(self, emulator: KubeEmulator) -> AdmissionChain:
        for rt in (MUTATING, VALIDATING):
            emulator.add_resource(rt)
        for obj in emulator.objects("Namespace"):  # the informer's initial list
            self.namespaces[obj["metadata"]["name"]] = obj
        emulator.observers.append(self._observe)
        emulator.admission = self
        self._emulator = emulator
        return self

    async def close(self) -> None:
        for session in self._sessions.values():
            await session.close()
        self._sessions.clear()

    @property
    def emulator(self) -> KubeEmulator:
        assert self._emulator is not None, "install() the chain first"
        return self._emulator

    def _observe(self, etype: str, rt: ResourceType, obj: Obj) -> None:
        if rt.key != NAMESPACES.key:
            return
        name = obj["metadata"]["name"]

        def update() -> None:
            if etype == "DELETED":
                self.namespaces.pop(name, None)
            else:
                current = self.namespaces.get(name)
                if current is None or int(current["metadata"]["resourceVersion"]) < int(
                    obj["metadata"]["resourceVersion"]
                ):
                    self.namespaces[name] = obj

        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            update()  # a write made outside any event loop (test setup)
            return
        loop.call_later(self.namespace_lag_s, update)

    # -- the Admission protocol -------------------------------------------------------------------
    async def mutate(self, attrs: AdmissionAttributes) -> Obj | None:
        self._namespace_lifecycle(attrs)
        obj = copy.deepcopy(attrs.obj) if attrs.obj is not None else None
        if obj is not None and attrs.rt.kind == "Pod" and not attrs.subresource:
            default_pod(obj)
            if attrs.operation == "CREATE":
                self._priority(attrs, obj)
        hooks = [h for h in self._hooks(MUTATING) if self._matches(h, attrs, obj)]
        outputs: dict[str, Obj | None] = {}  # each hook's output, for reinvocation
        for hook in hooks:
            obj = await self._mutate_once(hook, attrs, obj)
            outputs[hook.name] = copy.deepcopy(obj)
        # One reinvocation pass: an IfNeeded hook whose output a later hook changed runs again.
        for hook in hooks:
            if hook.spec.get("reinvocationPolicy") == "IfNeeded" and outputs[hook.name] != obj:
                obj = await self._mutate_once(hook, attrs, obj, reinvoked=True)
        return obj

    async def validate(self, attrs: AdmissionAttributes) -> None:
        hooks = [h for h in self._hooks(VALIDATING) if self._matches(h, attrs, attrs.obj)]
        results = await asyncio.gather(
            *(self._validate_once(h, attrs) for h in hooks), return_exceptions=True
        )  # fmt: skip
        for result in results:  # the first refusal in configuration order
            if isinstance(result, BaseException):
                raise result

    # -- built-in plugins ---------------------------------------------------------------------------
    def _namespace_lifecycle(self, attrs: AdmissionAttributes) -> None:
        rt = attrs.rt
        if attrs.operation == "DELETE" and rt.key == NAMESPACES.key and attrs.name in IMMORTAL_NAMESPACES:
            raise ApiError(403, f'namespaces "{attrs.name}" is forbidden: this namespace may not be deleted')
        if attrs.operation != "CREATE" or not rt.namespaced:
            return
        namespace = self._namespace(attrs.namespace)
        if namespace is None:
            details = {"name": attrs.namespace, "kind": "namespaces"}
            raise ApiError(404, f'namespaces "{attrs.namespace}" not found', details=details)
        if namespace["metadata"].get("deletionTimestamp"):
            raise ApiError(
                403,
                f'{rt.plural} "{attrs.name}" is forbidden: unable to create new content in namespace '
                f"{attrs.namespace} because it is being terminated",
            )

    def _namespace(self, name: str) -> Obj | None:
        # The informer first; like the apiserver, a live read when it does not have the namespace yet.
        return self.namespaces.get(name) or self.emulator.get_object("Namespace", name)

    def _priority(self, attrs: AdmissionAttributes, pod: Obj) -> None:
        """The Priority plugin on pod CREATE: the class's value and preemption policy, the global
        default class when none is named, a refusal for an unknown class."""
        spec = pod.setdefault("spec", {})
        classes = {o["metadata"]["name"]: o for o in self.emulator.objects("PriorityClass")}
        name = spec.get("priorityClassName") or ""
        policy = "PreemptLowerPriority"
        if not name:
            defaults = [c for c in classes.values() if c.get("globalDefault")]
            if defaults:
                chosen = min(defaults, key=lambda c: int(c.get("value") or 0))  # the lowest, as the plugin
                name, value = chosen["metadata"]["name"], int(chosen.get("value") or 0)
                policy = chosen.get("preemptionPolicy") or policy
            else:
                value = 0
        elif name in SYSTEM_PRIORITY_CLASSES:
            value = SYSTEM_PRIORITY_CLASSES[name]
        elif name in classes:
            value = int(classes[name].get("value") or 0)
            policy = classes[name].get("preemptionPolicy") or policy
        else:
            raise _forbidden(attrs, f"no PriorityClass with name {name} was found")
        if spec.get("priority") is not None and spec["priority"] != value:
            raise _forbidden(
                attrs,
                f"the integer value of priority ({spec['priority']}) must not be provided in pod spec; priority "
                f"admission controller computed {value} from the given PriorityClass name",
            )
        if spec.get("preemptionPolicy") is not None and spec["preemptionPolicy"] != policy:
            raise _forbidden(
                attrs,
                f"the string value of PreemptionPolicy ({spec['preemptionPolicy']}) must not be provided in pod "
                f"spec; priority admission controller computed {policy} from the given PriorityClass name",
            )
        if name:
            spec["priorityClassName"] = name
        spec["priority"] = value
        spec["preemptionPolicy"] = policy

    # -- matching -----------------------------------------------------------------------------------
    def _hooks(self, rt: ResourceType) -> list[_Hook]:
        configurations = sorted(self.emulator.objects(rt.kind), key=lambda o: o["metadata"]["name"])
        return [
            _Hook(str(spec["name"]), spec, c["metadata"]["name"], rt is MUTATING)
            for c in configurations
            for spec in c.get("webhooks") or ()
        ]

    def _matches(self, hook: _Hook, attrs: AdmissionAttributes, obj: Obj | None) -> bool:
        spec = hook.spec
        equivalent = (spec.get("matchPolicy") or "Equivalent") == "Equivalent"
        if not any(_rule_matches(rule, attrs, equivalent) for rule in spec.get("rules") or ()):
            return False
        if not self._namespace_selected(spec.get("namespaceSelector"), attrs):
            return False
        object_selector = spec.get("objectSelector")
        if object_selector:
            candidates = [o for o in (obj, attrs.old) if o is not None]
            if not any(selector_matches(object_selector, _labels(o)) for o in candidates):
                return False
        conditions = spec.get("matchConditions") or ()
        return all(evaluate_match_condition(c["expression"], self._request(attrs, obj)) for c in conditions)

    def _namespace_selected(self, selector: Mapping[str, Any] | None, attrs: AdmissionAttributes) -> bool:
        if not selector:
            return True
        if attrs.rt.key == NAMESPACES.key:  # a namespace is matched by its own labels
            return selector_matches(selector, _labels(attrs.obj if attrs.obj is not None else attrs.old))
        if not attrs.rt.namespaced:
            return True
        namespace = self._namespace(attrs.namespace)
        return selector_matches(selector, _labels(namespace))

    # -- calling ------------------------------------------------------------------------------------
    async def _mutate_once(
        self, hook: _Hook, attrs: AdmissionAttributes, obj: Obj | None, reinvoked: bool = False
    ) -> Obj | None:
        response = await self._call_or_policy(hook, attrs, obj, reinvoked)
        if response is None:
            return obj
        patch = response.get("patch")
        if not patch or obj is None:
            self._record(hook, attrs, "allowed", reinvoked)
            return obj
        try:
            operations = json.loads(base64.b64decode(patch))
            patched = jsonpatch.JsonPatch(operations).apply(obj)
        except (ValueError, TypeError, jsonpatch.JsonPatchException, jsonpatch.JsonPointerException) as exc:
            self._record(hook, attrs, "error", reinvoked, str(exc))
            raise ApiError(500, f"Internal error occurred: {exc}", reason="InternalError") from None
        if attrs.rt.kind == "Pod":
            default_pod(patched)  # the apiserver defaults the patched object again
        self._record(hook, attrs, "patched" if patched != obj else "allowed", reinvoked)
        return patched

    async def _validate_once(self, hook: _Hook, attrs: AdmissionAttributes) -> None:
        if await self._call_or_policy(hook, attrs, attrs.obj, False) is not None:
            self._record(hook, attrs, "allowed", False)

    async def _call_or_policy(
        self, hook: _Hook, attrs: AdmissionAttributes, obj: Obj | None, reinvoked: bool
    ) -> Mapping[str, Any] | None:
        """The webhook's allowing response; raises its refusal; None when a failed call is ignored."""
        if attrs.dry_run and hook.spec.get("sideEffects") not in ("None", "NoneOnDryRun"):
            raise ApiError(400, f'admission webhook "{hook.name}" does not support dry run', reason="BadRequest")
        try:
            response = await self._call(hook, attrs, obj)
        except _CallError as exc:
            if hook.failure_policy == "Ignore":
                self._record(hook, attrs, "ignored-error", reinvoked, str(exc))
                return None
            self._record(hook, attrs, "error", reinvoked, str(exc))
            raise ApiError(
                500, f'Internal error occurred: failed calling webhook "{hook.name}": {exc}', reason="InternalError"
            ) from None
        if not response.get("allowed"):
            self._record(hook, attrs, "denied", reinvoked)
            raise _denial(hook.name, response.get("status"))
        return response

    async def _call(self, hook: _Hook, attrs: AdmissionAttributes, obj: Obj | None) -> Mapping[str, Any]:
        config = hook.spec.get("clientConfig") or {}
        service = config.get("service")
        if not service:
            raise _CallError("only clientConfig.service is emulated")
        host = f"{service['name']}.{service['namespace']}.svc"
        timeout_s = hook.timeout_s
        url = f"https://{host}:{service.get('port', 443)}{service.get('path') or '/'}?timeout={timeout_s:g}s"
        try:
            port = self.services(service["namespace"], service["name"], int(service.get("port", 443)))
        except LookupError as exc:
            raise _CallError(f'failed to call webhook: Post "{url}": {exc}') from None
        review = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": self._request(attrs, obj)}
        session = self._session(host, str(config.get("caBundle") or ""))
        target = f"https://{host}:{port}{service.get('path') or '/'}?timeout={timeout_s:g}s"
        try:
            async with asyncio.timeout(timeout_s):
                async with session.post(target, json=review) as resp:
                    body = await resp.read()
                    if resp.status != 200:
                        raise _CallError(f"failed to call webhook: the server responded with status {resp.status}")
        except TimeoutError:
            raise _CallError(f'failed to call webhook: Post "{url}": context deadline exceeded') from None
        except (aiohttp.ClientError, ssl.SSLError, OSError) as exc:
            raise _CallError(f'failed to call webhook: Post "{url}": {exc}') from None
        try:
            answer = json.loads(body)
            response = answer["response"]
            uid_ok = response.get("uid") == review["request"]["uid"]
        except (ValueError, KeyError, TypeError, AttributeError):
            raise _CallError("received invalid webhook response: not an AdmissionReview") from None
        if not uid_ok:
            raise _CallError(
                f"expected response.uid={review['request']['uid']!r}, got {response.get('uid')!r}"
            )  # fmt: skip
        if response.get("patch") and response.get("patchType") != "JSONPatch":
            raise _CallError(f"unsupported patch type {response.get('patchType')!r}")
        if response.get("patch") and not hook.mutating:
            raise _CallError("a validating webhook returned a patch")
        return response

    def _session(self, host: str, ca_bundle: str) -> aiohttp.ClientSession:
        """One keep-alive session per Service name and CA bundle, as the apiserver caches clients."""
        key = f"{host}|{ca_bundle}"
        session = self._sessions.get(key)
        if session is None:
            try:
                context = ssl.create_default_context(cadata=base64.b64decode(ca_bundle).decode())
            except (ValueError, ssl.SSLError):
                context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # trusts nothing: every call fails
            connector = aiohttp.TCPConnector(ssl=context, resolver=StaticResolver({host: LOOPBACK}))
            session = aiohttp.ClientSession(connector=connector)
            self._sessions[key] = session
        return session

    def _request(self, attrs: AdmissionAttributes, obj: Obj | None) -> Obj:
        rt = attrs.rt
        kind = {"group": rt.group, "version": rt.version, "kind": rt.kind}
        resource = {"group": rt.group, "version": rt.version, "resource": rt.plural}
        request: Obj = {
            "uid": str(uuid.uuid4()),
            "kind": kind,
            "resource": resource,
            "requestKind": kind,
            "requestResource": resource,
            "operation": attrs.operation,
            "userInfo": {"username": attrs.user.username, "uid": attrs.user.uid, "groups": list(attrs.user.groups)},
            "object": obj,
            "oldObject": attrs.old,
            "dryRun": attrs.dry_run,
            "options": {
                "apiVersion": "meta.k8s.io/v1",
                "kind": OPTIONS_KIND[attrs.operation],
                **({"dryRun": ["All"]} if attrs.dry_run else {}),
            },
        }
        if attrs.name:
            request["name"] = attrs.name
        if rt.namespaced:
            request["namespace"] = attrs.namespace
        if attrs.subresource:
            request["subResource"] = request["requestSubResource"] = attrs.subresource
        return request

    def _record(self, hook: _Hook, attrs: AdmissionAttributes, outcome: str, reinvoked: bool, detail: str = "") -> None:
        resource = attrs.rt.plural + (f"/{attrs.subresource}" if attrs.subresource else "")
        call = WebhookCall(
            hook.name, attrs.operation, resource, attrs.namespace, attrs.name, attrs.dry_run, outcome, reinvoked, detail
        )
        self.calls.append(call)

    def calls_to(self, webhook: str, outcome: str | None = None) -> list[WebhookCall]:
        return [c for c in self.calls if c.webhook == webhook and (outcome is None or c.outcome == outcome)]


# -- pure helpers -----------------------------------------------------------------------------------
def _labels(obj: Mapping[str, Any] | None) -> Mapping[str, str]:
    return ((obj or {}).get("metadata") or {}).get("labels") or {}


def _forbidden(attrs: AdmissionAttributes, why: str) -> ApiError:
    who = f'{attrs.rt.plural} "{attrs.name}"' if attrs.name else attrs.rt.plural
    return ApiError(403, f"{who} is forbidden: {why}", reason="Forbidden")


def _denial(webhook: str, status: Mapping[str, Any] | None) -> ApiError:
    """The apiserver's shape for a webhook's refusal (ToStatusErr): its code (403 when under 400),
    its reason, and the message behind `admission webhook "NAME" denied the request`."""
    status = status or {}
    code = int(status.get("code") or 0)
    denied = f'admission webhook "{webhook}" denied the request'
    if status.get("message"):
        message = f"{denied}: {status['message']}"
    elif status.get("reason"):
        message = f"{denied}: {status['reason']}"
    else:
        message = f"{denied} without explanation"
    return ApiError(code if code >= 400 else 403, message, reason=status.get("reason") or None)


def _rule_matches(rule: Mapping[str, Any], attrs: AdmissionAttributes, equivalent: bool) -> bool:
    rt = attrs.rt
    operations = rule.get("operations") or ()
    if "*" not in operations and attrs.operation not in operations:
        return False
    if not _listed(rule.get("apiGroups"), rt.group):
        return False
    # Equivalent: another version of the same group/resource matches too. The emulator serves one
    # version of each resource, so converting the object is the identity.
    if not equivalent and not _listed(rule.get("apiVersions"), rt.version):
        return False
    scope = rule.get("scope") or "*"
    if (scope == "Cluster" and rt.namespaced) or (scope == "Namespaced" and not rt.namespaced):
        return False
    # "*": every resource, no subresource; "pods/*": every subresource of pods; "*/*": everything.
    for resource in rule.get("resources") or ():
        if resource == "*/*":
            return True
        main, _, sub = resource.partition("/")
        if main not in ("*", rt.plural):
            continue
        if sub == attrs.subresource or (sub == "*" and attrs.subresource):
            return True
    return False


def _listed(values: Any, value: str) -> bool:
    values = values or ()
    return "*" in values or value in values


def selector_matches(selector: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    """A metav1.LabelSelector: matchLabels and matchExpressions (In, NotIn, Exists, DoesNotExist)."""
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for expression in selector.get("matchExpressions") or ():
        key, operator = expression["key"], expression["operator"]
        values = expression.get("values") or ()
        present = key in labels
        if operator == "In" and not (present and labels[key] in values):
            return False
        if operator == "NotIn" and present and labels[key] in values:
            return False
        if operator == "Exists" and not present:
            return False
        if operator == "DoesNotExist" and present:
            return False
        if operator not in ("In", "NotIn", "Exists", "DoesNotExist"):
            raise ValueError(f"unknown selector operator {operator!r}")
    return True


# matchConditions: the subset of CEL the manifests use (comparisons, `in` a list literal, `&&`,
# `||`, `!`, field access on `request`), translated to Python and evaluated without builtins.
_CEL_TOKEN = re.compile(r"\s*(&&|\|\||!=|==|!|\(|\)|\[|\]|,|'[^']*'|\"[^\"]*\"|[A-Za-z_][A-Za-z0-9_.]*)")


class _Fields:
    def __init__(self, value: Any) -> None:
        self._value = value

    def __getattr__(self, name: str) -> Any:
        found = self._value.get(name) if isinstance(self._value, dict) else None
        return _Fields(found) if isinstance(found, dict) else found


def evaluate_match_condition(expression: str, request: Obj) -> bool:
    out: list[str] = []
    position = 0
    text = expression.strip()
    while position < len(text):
        token = _CEL_TOKEN.match(text, position)
        if token is None:
            raise ValueError(f"matchCondition not supported by the emulated chain: {expression!r}")
        value = token.group(1)
        position = token.end()
        if value == "&&":
            out.append(" and ")
        elif value == "||":
            out.append(" or ")
        elif value == "!":
            out.append(" not ")
        elif value[0].isalpha() or value[0] == "_":
            if value == "in":
                out.append(" in ")
            elif value.split(".")[0] != "request":
                raise ValueError(f"matchCondition variable not supported by the emulated chain: {value!r}")
            else:
                out.append(value)
        else:
            out.append(value)
    return bool(eval("".join(out), {"__builtins__": {}}, {"request": _Fields(request)}))


def default_pod(pod: Obj) -> None:
    """The Pod schema's defaults that a stored pod always carries (SetDefaults_Pod and friends)."""
    spec = pod.setdefault("spec", {})
    spec.setdefault("restartPolicy", "Always")
    spec.setdefault("dnsPolicy", "ClusterFirst")
    spec.setdefault("schedulerName", "default-scheduler")
    spec.setdefault("terminationGracePeriodSeconds", 30)
    spec.setdefault("securityContext", {})
    spec.setdefault("enableServiceLinks", True)
    for container in [*(spec.get("initContainers") or ()), *(spec.get("containers") or ())]:
        image = str(container.get("image") or "")
        tag = image.rsplit("/", 1)[-1].partition("@")[0].partition(":")[2]
        always = tag in ("", "latest") and "@" not in image
        container.setdefault("imagePullPolicy", "Always" if always else "IfNotPresent")
        container.setdefault("terminationMessagePath", "/dev/termination-log")
        container.setdefault("terminationMessagePolicy", "File")
        container.setdefault("resources", {})
        for port in container.get("ports") or ():
            port.setdefault("protocol", "TCP")
