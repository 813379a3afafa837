"""The Kubernetes API calls the Kubeflow SDK makes for the launcher, read from the SDK's own source.

`components/` calls `TrainerClient` methods (`train`, `get_runtime`, `get_job`, ...); each delegates to
the Kubernetes backend's method of the same name, whose calls on `self.custom_api` and `self.core_api`
(and on its own methods, followed) need RBAC rules like the launcher's own calls. They are found by
parsing `kubeflow/trainer/backends/kubernetes/backend.py` of the installed SDK, with its constants
(`constants.GROUP`, `constants.TRAINJOB_PLURAL`, ...) resolved from the package, so an SDK release that
makes a new call fails tests/helm/test_rbac.py until the Role grants it (or the test says why not).
"""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

# core/v1 methods the SDK calls -> (resource, verb).
CORE = {"list_namespaced_pod": ("pods", "list"), "read_namespaced_pod_log": ("pods/log", "get"),
        "list_namespaced_event": ("events", "list"), "read_namespaced_config_map": ("configmaps", "get")}
# custom-object methods -> (verb, cluster-scoped?, index of the plural among the arguments after group, version).
CUSTOM = {"create_namespaced_custom_object": ("create", False), "get_namespaced_custom_object": ("get", False),
          "list_namespaced_custom_object": ("list", False), "delete_namespaced_custom_object": ("delete", False),
          "get_cluster_custom_object": ("get", True), "list_cluster_custom_object": ("list", True)}


def trainer_client_methods_used(root: Path, folders: tuple[str, ...]) -> set[str]:
    """Public `TrainerClient` methods called in `folders` (as `<something>.client.<method>`)."""
    from kubeflow.trainer import TrainerClient

    public = {name for name in dir(TrainerClient) if not name.startswith("_")}
    used = set()
    for folder in folders:
        for path in (root / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
                if isinstance(node, ast.Attribute) and node.attr in public and isinstance(node.value, ast.Attribute) \
                        and node.value.attr == "client":
                    used.add(node.attr)
    return used


def _backend_methods() -> dict[str, ast.FunctionDef]:
    from kubeflow.trainer.backends.kubernetes import backend

    tree = ast.parse(inspect.getsource(backend))
    [cls] = [node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == "KubernetesBackend"]
    return {item.name: item for item in cls.body if isinstance(item, ast.FunctionDef)}


def _constant(node: ast.expr) -> str | None:
    from kubeflow.trainer.constants import constants

    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "constants":
        return getattr(constants, node.attr, None)
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def _permission(api: str, method: str, arguments: list[ast.expr]) -> tuple[str, str, str, str] | None:
    """(group, resource, verb, scope) of one call on `self.custom_api` / `self.core_api`."""
    assert method in (CORE if api == "core_api" else CUSTOM), (
        f"the Kubeflow SDK calls {api}.{method}, which tests/helm/sdk_calls.py does not know: add it, and the rule "
        "it needs to templates/rbac/role.yaml")
    if api == "core_api":
        resource, verb = CORE[method]
        return "", resource, verb, "namespace"
    verb, cluster = CUSTOM[method]
    group, plural = _constant(arguments[0]), _constant(arguments[2 if cluster else 3])
    return group, plural, verb, "cluster" if cluster else "namespace"


def sdk_permissions(methods: set[str]) -> set[tuple[str, str, str, str]]:
    """(group, resource, verb, scope) of every API call the backend's `methods` make, following its own methods."""
    backend = _backend_methods()
    found: set[tuple[str, str, str, str]] = set()
    seen: set[str] = set()
    pending = ["__init__", *methods]
    while pending:
        name = pending.pop()
        if name in seen or name not in backend:
            continue
        seen.add(name)
        for node in ast.walk(backend[name]):
            if not isinstance(node, ast.Attribute):
                continue
            owner = node.value
            if isinstance(owner, ast.Attribute) and isinstance(owner.value, ast.Name) and owner.value.id == "self" \
                    and owner.attr in ("custom_api", "core_api"):
                call = _call_of(backend[name], node)
                found.add(_permission(owner.attr, node.attr, call))
            elif isinstance(owner, ast.Name) and owner.id == "self":
                pending.append(node.attr)
    return found


def _call_of(function: ast.FunctionDef, method: ast.Attribute) -> list[ast.expr]:
    """The arguments `method` gets: those of the call it is the function of, or the ones after it when handed
    to a function (`Watch().stream(self.core_api.read_namespaced_pod_log, ...)`)."""
    for node in ast.walk(function):
        if isinstance(node, ast.Call):
            if node.func is method:
                return node.args
            if method in node.args:
                return node.args[node.args.index(method) + 1:]
    return []
