"""The settings guard (rules G1-G4, see docs/RULES.md): who may change the cluster settings
ConfigMap, and which changes are refused whoever asks.

A pure function of (AdmissionReview `request`, cluster snapshot, guard configuration) ->
`Decision`: no call out and no side effect, so a dryRun request is judged exactly like a real one.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from webhook.core.decision import Decision, Reason
from webhook.core.guard_config import GuardConfig, list_capped, request_kind, requester
from webhook.settings import SETTINGS_CONFIGMAP, ClusterSettings, SettingsError
from webhook.snapshot import RUNAI_PROJECT_ID_LABEL, RUNAI_QUEUE_LABEL, ClusterSnapshot

# Where the server sends the Run:ai client secret, and which secret: whoever may change these
# could have the secret sent to a host of their choosing, so, like run_ai_enable, only the
# installation changes them.
INSTALLER_ONLY = ("run_ai_url", "run_ai_client_id", "run_ai_client_secret_name", "run_ai_client_secret_key")


def _flags_of(data: Mapping[str, Any] | None, fallback: ClusterSettings) -> ClusterSettings:
    """run_ai_enable/kueue_installed of a ConfigMap that may not parse as a whole.

    A broken ConfigMap (written while the webhook was down) must still be fixable, and the flags
    it held are still what the change is measured against; if even they do not parse, the last
    good settings the caches hold are.
    """
    try:
        return ClusterSettings.from_configmap_data(data)
    except SettingsError:
        pass
    if not isinstance(data, Mapping):
        return fallback
    flags = {k: v for k, v in data.items() if k in ("run_ai_enable", "kueue_installed", *INSTALLER_ONLY)}
    try:
        return ClusterSettings.from_configmap_data(flags)
    except SettingsError:
        return fallback


def _bound_namespaces(snapshot: ClusterSnapshot) -> list[str]:
    # Any namespace with the label, project or not: Run:ai's webhooks select on it alone.
    return sorted(name for name, ns in snapshot.namespaces.items() if RUNAI_QUEUE_LABEL in ns.labels)


def validate_settings_change(request: Mapping[str, Any], snapshot: ClusterSnapshot, config: GuardConfig) -> Decision:
    """Judge a write to the settings ConfigMap (G1-G4); other ConfigMaps pass.

    The change is measured between the settings before and after the request; an absent ConfigMap
    means the default settings (the caches treat a deleted one so). Hence DELETE is allowed
    unless it would turn Run:ai off: deleting the ConfigMap while run_ai_enable is true is a
    change of run_ai_enable, so only the installer may do it (helm uninstall). Deleting the
    whole install namespace is always allowed: refusing there would leave it stuck terminating.
    """
    if request_kind(request) != "ConfigMap":
        return Decision.allow()
    operation = request.get("operation")
    obj = request.get("object") or {}
    old_obj = request.get("oldObject") or {}
    meta = obj.get("metadata") or old_obj.get("metadata") or {}
    name = request.get("name") or meta.get("name")
    namespace = request.get("namespace") or meta.get("namespace")
    if name != SETTINGS_CONFIGMAP or namespace != config.install_namespace:
        return Decision.allow()
    if operation not in ("CREATE", "UPDATE", "DELETE"):
        return Decision.allow()

    if operation == "CREATE":
        before = ClusterSettings()
    elif old_obj:
        before = _flags_of(old_obj.get("data"), snapshot.settings)
    else:
        # Old apiservers send no oldObject on DELETE: the caches' view is the best we have.
        before = snapshot.settings

    if operation == "DELETE":
        install_ns = snapshot.namespaces.get(config.install_namespace)
        if install_ns is not None and install_ns.deleting:
            return Decision.allow(audit={"settings-deleted-with-namespace": config.install_namespace})
        after = ClusterSettings()
    else:
        try:
            after = ClusterSettings.from_configmap_data(obj.get("data"))
        except SettingsError as exc:
            return Decision.deny(f"{SETTINGS_CONFIGMAP}: {exc}", code=422, reason=Reason.INVALID)

    exclusion = after.exclusion_error()
    if exclusion:
        return Decision.deny(
            f"{SETTINGS_CONFIGMAP}: {exclusion}; set kueue_installed to false, or turn Run:ai off through "
            "the installation first",
            # A policy refusal (G1), not a malformed object: 403 also makes `kubectl edit` print this
            # message, where for 422 it prints only that the object "is invalid".
            code=403,
            reason=Reason.FORBIDDEN,
        )

    promise = after.runai_error()
    if promise:
        # A policy refusal like G1 (403, so that `kubectl edit` prints the message).
        return Decision.deny(f"{SETTINGS_CONFIGMAP}: {promise}", code=403, reason=Reason.FORBIDDEN)

    warnings: list[str] = []
    audit: dict[str, str] = {}
    if after.run_ai_enable != before.run_ai_enable:
        change = f"{str(before.run_ai_enable).lower()}->{str(after.run_ai_enable).lower()}"
        if not config.installers.matches(request.get("userInfo")):
            hint = "" if config.installers else " (no installer identities are configured on this webhook)"
            verb = "deleting the settings would change" if operation == "DELETE" else "cannot change"
            return Decision.deny(
                f"{SETTINGS_CONFIGMAP}: {verb} run_ai_enable ({change}): it is set only by the installation. "
                f"Set hopsworks.variables.run_ai_enable in the Hopsworks Helm values and run helm upgrade; "
                f"{requester(request)} is not an installer identity{hint}"
            )
        audit["run-ai-enable"] = change
        if not after.run_ai_enable:
            bound = _bound_namespaces(snapshot)
            if bound:
                warnings.append(
                    f"Run:ai is turned off but {len(bound)} namespaces stay bound to it and Run:ai keeps "
                    f"scheduling their pods ({list_capped(bound)}); their GPU view reports "
                    "RUN_AI_BINDING_LEFT. See the README on leaving Run:ai."
                )

    # DELETE resets them to the shipped defaults, which send the secret nowhere of a caller's choosing.
    changed = [key for key in INSTALLER_ONLY if getattr(after, key) != getattr(before, key)]
    if changed and operation != "DELETE":
        if not config.installers.matches(request.get("userInfo")):
            hint = "" if config.installers else " (no installer identities are configured on this webhook)"
            return Decision.deny(
                f"{SETTINGS_CONFIGMAP}: cannot change {', '.join(changed)}: they say where the Run:ai client "
                "secret is sent and which secret it is, so they are set only by the installation. Set them in "
                f"the Hopsworks Helm values and run helm upgrade; {requester(request)} is not an installer "
                f"identity{hint}"
            )
        audit["run-ai-connection-changed"] = ",".join(changed)

    if after.kueue_installed and not before.kueue_installed:
        bound = _bound_namespaces(snapshot)
        if bound:
            return Decision.deny(
                f"{SETTINGS_CONFIGMAP}: cannot turn kueue_installed on while namespaces are still bound to "
                f"Run:ai ({list_capped(bound)}): Run:ai's admission webhooks and Kueue would both act on "
                "their pods. Unbind each one first: delete its Run:ai project in Run:ai (this stops its "
                f"workloads), then remove the {RUNAI_QUEUE_LABEL} and {RUNAI_PROJECT_ID_LABEL} labels "
                f"(kubectl label namespace NAME {RUNAI_QUEUE_LABEL}- {RUNAI_PROJECT_ID_LABEL}-)"
            )
        audit["kueue-installed"] = "false->true"
    return Decision.allow(warnings=warnings, audit=audit)
