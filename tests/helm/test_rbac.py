"""The launcher's Role grants exactly the Kubernetes API calls the code in components/ makes, and those the
Kubeflow SDK makes for it, for the job kinds `training.jobKind` allows.

The calls are found by parsing the source (every attribute named like a kubernetes client method; the SDK's
backend for each `TrainerClient` method the code calls, `sdk_calls.py`), so a new call without a rule here
and in templates/rbac/role.yaml fails, and so does a rule no code needs.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from tests.helm.chart import one, render
from tests.helm.sdk_calls import sdk_permissions, trainer_client_methods_used

ROOT = Path(__file__).parents[2]
SCANNED = ("components", "pipelines")  # pipelines/ must make no Kubernetes API call at all

# kubernetes client method -> (api group, resource, verb). Custom-object methods take the group and the
# plural from their arguments (resolved from the call site).
CORE_METHODS = {
    "list_namespaced_pod": ("", "pods", "list"),
    "read_namespaced_pod": ("", "pods", "get"),
    "read_namespaced_pod_status": ("", "pods/status", "get"),
    "read_namespaced_pod_log": ("", "pods/log", "get"),
    "delete_namespaced_pod": ("", "pods", "delete"),
    "list_namespaced_event": ("", "events", "list"),
    "read_namespaced_event": ("", "events", "get"),
}
CUSTOM_OBJECT_VERBS = {
    "create_namespaced_custom_object": "create",
    "get_namespaced_custom_object": "get",
    "get_namespaced_custom_object_status": "get",
    "list_namespaced_custom_object": "list",
    "delete_namespaced_custom_object": "delete",
    "delete_collection_namespaced_custom_object": "deletecollection",
    "patch_namespaced_custom_object": "patch",
    "replace_namespaced_custom_object": "update",
}
# What a kubernetes client API method is named like (boto3's `delete_object` or `list_objects` are not).
CLIENT_METHOD = re.compile(r"^(create|read|get|list|patch|replace|delete|delete_collection|connect)_"
                           r"(namespaced_\w+|\w+_for_all_namespaces|\w*custom_object\w*)$")

API_GROUP, RESOURCE = re.compile(r"[a-z0-9-]+(\.[a-z0-9-]+)+"), re.compile(r"[a-z0-9]+")

# The SDK reads Kubeflow Trainer's version ConfigMap in `kubeflow-system` when its client starts, and carries on
# when refused (components/launcher/kinds/trainjob/kind.py holds back its warning): nothing in that namespace is granted.
SDK_REFUSED = {("", "configmaps", "get")}

# Calls another change to components/launcher/follow/launcher.py is adding (pods listed and read for the reason a
# replica is Pending, the namespace's events for scheduling failures). Once the code makes them, they are
# found by the scan and this set is redundant; it never grants anything the scan would refuse.
ANNOUNCED = {("", "pods", "get"), ("", "events", "list")}


def module_constants(path: Path, seen: frozenset[Path] = frozenset()) -> dict[str, str]:
    """Module-level string constants of a source file, including `A, B = "x", "y"` and names it imports
    from other modules of this project (`from components.launcher.kinds.pytorchjob.watch import GROUP`)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    constants: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in SCANNED:
            source = ROOT.joinpath(*node.module.split(".")).with_suffix(".py")
            if source.exists() and source not in seen:
                imported = module_constants(source, seen | {path})
                constants.update({alias.asname or alias.name: imported[alias.name] for alias in node.names
                                  if alias.name in imported})
        if not isinstance(node, ast.Assign):
            continue
        for target in node.targets:
            if isinstance(target, ast.Name) and isinstance(node.value, ast.Constant):
                constants[target.id] = node.value.value
            elif isinstance(target, ast.Tuple) and isinstance(node.value, ast.Tuple):
                for name, value in zip(target.elts, node.value.elts):
                    if isinstance(name, ast.Name) and isinstance(value, ast.Constant):
                        constants[name.id] = value.value
    return constants


def resolve(node: ast.expr, constants: dict[str, str]) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.Name):
        return constants.get(node.id)
    return None


def custom_object_target(arguments: list[ast.expr], constants: dict[str, str], where: str) -> tuple[str, str]:
    """(group, plural) of a custom-object call: the first argument that resolves to an API group followed,
    three later, by a resource name (the client's order is group, version, namespace, plural). Wrappers such
    as `retry.call(method, "what", GROUP, ...)` put other arguments first."""
    for index in range(len(arguments) - 3):
        group, plural = resolve(arguments[index], constants), resolve(arguments[index + 3], constants)
        if group and plural and API_GROUP.fullmatch(group) and RESOURCE.fullmatch(plural):
            return group, plural
    raise AssertionError(f"{where}: cannot tell the API group and resource from "
                         f"({', '.join(ast.unparse(a) for a in arguments)})")


def permission(method: str, arguments: list[ast.expr], constants: dict[str, str], where: str,
               watched: bool) -> tuple[str, str, str]:
    if method in CUSTOM_OBJECT_VERBS:
        group, plural = custom_object_target(arguments, constants, where)
        resource = plural + ("/status" if method.endswith("_status") else "")
        return group, resource, "watch" if watched else CUSTOM_OBJECT_VERBS[method]
    assert method in CORE_METHODS, (f"{where}: {method} is a Kubernetes API call this test does not know: add it "
                                    "to CORE_METHODS and the rule it needs to templates/rbac/role.yaml")
    group, resource, verb = CORE_METHODS[method]
    return group, resource, "watch" if watched else verb


def api_calls_in(path: Path, root: Path = ROOT) -> set[tuple[str, str, str, str]]:
    """(group, resource, verb, file:line) of each Kubernetes API call in a source file.

    A client method is either called (`api.get_namespaced_custom_object(GROUP, ...)`) or handed to a
    function with its arguments after it: `Watch().stream(method, *args)` (a watch) or a retry wrapper
    (`retry.call(method, "what", *args)`).
    """
    tree = ast.parse(path.read_text(), filename=str(path))
    constants = module_constants(path)
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    found = set()
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Attribute) and CLIENT_METHOD.match(node.attr)):
            continue
        where = f"{path.relative_to(root)}:{node.lineno}"
        parent = parents.get(node)
        if isinstance(parent, ast.Call) and parent.func is node:
            found.add((*permission(node.attr, parent.args, constants, where, watched=False), where))
        elif isinstance(parent, ast.Call) and node in parent.args:
            following = parent.args[parent.args.index(node) + 1:]
            watched = isinstance(parent.func, ast.Attribute) and parent.func.attr == "stream"
            found.add((*permission(node.attr, following, constants, where, watched=watched), where))
        else:
            raise AssertionError(f"{where}: {node.attr} is used in a way this test cannot follow")
    return found


def sdk_required(scope: str = "namespace") -> set[tuple[str, str, str]]:
    """What the Kubeflow SDK calls the code makes need, at namespace or cluster scope."""
    methods = trainer_client_methods_used(ROOT, SCANNED)
    return {(group, resource, verb) for group, resource, verb, where in sdk_permissions(methods)
            if where == scope} - SDK_REFUSED


def required_permissions() -> dict[tuple[str, str, str], list[str]]:
    required: dict[tuple[str, str, str], list[str]] = {}
    for folder in SCANNED:
        for path in sorted((ROOT / folder).rglob("*.py")):
            for group, resource, verb, where in api_calls_in(path):
                required.setdefault((group, resource, verb), []).append(where)
    for permission in sdk_required():
        required.setdefault(permission, []).append("the Kubeflow SDK (kubeflow.trainer)")
    return required


def job_kind_of(permission: tuple[str, str, str]) -> str:
    """Which job kind needs a permission: `pytorchjob`, `trainjob`, or `both` (pods, logs, events)."""
    group = permission[0]
    return {"kubeflow.org": "pytorchjob", "trainer.kubeflow.org": "trainjob",
            "kueue.x-k8s.io": "trainjob"}.get(group, "both")  # a queued TrainJob's Kueue Workload


def granted_permissions(values: dict, kind: str = "Role") -> set[tuple[str, str, str]]:
    roles = [d for d in render(values) if d["kind"] == kind]
    return {(group, resource, verb) for role in roles for rule in role["rules"] for group in rule["apiGroups"]
            for resource in rule["resources"] for verb in rule["verbs"]}


def test_scan_finds_the_launchers_calls():
    required = required_permissions()
    assert {("kubeflow.org", "pytorchjobs", verb) for verb in ("create", "get", "list", "watch", "delete")} <= set(
        required)
    assert ("", "pods/log", "get") in required
    # kubernetes is used by the launcher only (DESIGN.md)
    assert all(where.startswith("components/launcher/") or where == "the Kubeflow SDK (kubeflow.trainer)"
               for places in required.values() for where in places), required


def test_role_allows_every_api_call_in_the_code():
    granted = granted_permissions({})
    missing = {permission: places for permission, places in required_permissions().items()
               if permission not in granted}
    assert missing == {}, f"calls without RBAC (add rules to templates/rbac/role.yaml): {missing}"


def test_role_allows_nothing_the_code_does_not_call():
    extra = granted_permissions({}) - set(required_permissions()) - ANNOUNCED
    assert extra == set(), f"rules no code needs (remove them from templates/rbac/role.yaml): {extra}"


@pytest.mark.parametrize("job_kind", ["auto", "trainjob", "pytorchjob"])
def test_each_job_kind_is_granted_exactly_what_it_calls(job_kind):
    allowed = {"auto": {"pytorchjob", "trainjob"}}.get(job_kind, {job_kind}) | {"both"}
    needed = {permission for permission in required_permissions() if job_kind_of(permission) in allowed}
    granted = granted_permissions({"training": {"jobKind": job_kind}})
    assert granted - ANNOUNCED == needed - ANNOUNCED


def test_the_sdk_calls_are_found():
    # TrainJobs created, read (with their runtime and pods), their log read and deleted through the SDK.
    assert {("trainer.kubeflow.org", "trainjobs", verb) for verb in ("create", "get", "delete")} <= sdk_required()
    assert {("trainer.kubeflow.org", "trainingruntimes", "get"), ("", "pods/log", "get")} <= sdk_required()
    assert sdk_required("cluster") == {("trainer.kubeflow.org", "clustertrainingruntimes", "get")}


def test_a_cluster_runtime_is_readable_through_a_cluster_role_only_then():
    # The SDK looks for the namespace's TrainingRuntime first and only then for a ClusterTrainingRuntime of that
    # name, so the cluster-scoped read is granted only where the runtime is one.
    values = {"training": {"runtime": {"kind": "ClusterTrainingRuntime"}}}
    assert granted_permissions(values, "ClusterRole") == sdk_required("cluster")
    binding = one(render(values), "ClusterRoleBinding")
    assert [s["name"] for s in binding["subjects"]] == ["af-alignflow", "default-editor", "pipeline-runner"]
    assert granted_permissions({}, "ClusterRole") == set()
    assert granted_permissions({"training": {"jobKind": "pytorchjob", "runtime": {"kind": "ClusterTrainingRuntime"}}},
                               "ClusterRole") == set()


def test_no_cluster_wide_rbac():
    documents = render({"kfp": {"multiUser": {"enabled": True}}})
    assert not any(d["kind"] in ("ClusterRole", "ClusterRoleBinding") for d in documents)


def test_scan_catches_a_new_call_and_a_watch(tmp_path):
    source = tmp_path / "probe.py"
    source.write_text('G, V, P = "kubeflow.org", "v1", "tfjobs"\n'
                      "def f(api, core, watch, s3, retry):\n"
                      "    watch.Watch().stream(api.list_namespaced_custom_object, G, V, 'ns', P)\n"
                      "    api.patch_namespaced_custom_object(G, V, 'ns', P, 'n', {})\n"
                      "    core.list_namespaced_event('ns')\n"
                      "    retry.call(api.get_namespaced_custom_object, f'get {P}', G, V, 'ns', P, 'name')\n"
                      "    retry.call(core.read_namespaced_pod_log, 'log', 'pod', 'ns')\n"
                      "    s3.delete_object(Bucket='b', Key='k')\n")
    found = {(group, resource, verb) for group, resource, verb, _ in api_calls_in(source, tmp_path)}
    assert found == {("kubeflow.org", "tfjobs", "watch"), ("kubeflow.org", "tfjobs", "patch"),
                     ("", "events", "list"), ("kubeflow.org", "tfjobs", "get"), ("", "pods/log", "get")}


def test_scan_refuses_a_call_it_cannot_map(tmp_path):
    unknown = tmp_path / "unknown.py"
    unknown.write_text("def f(core):\n    core.list_namespaced_secret('ns')\n    core.list_pod_for_all_namespaces()\n")
    with pytest.raises(AssertionError, match="(list_namespaced_secret|list_pod_for_all_namespaces) is a Kubernetes API call"):
        api_calls_in(unknown, tmp_path)


def binding_subjects(values: dict) -> list[tuple[str, str]]:
    binding = next(d for d in render(values) if d["kind"] == "RoleBinding" and d["metadata"]["name"].endswith("-launcher"))
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                  "name": one(render(values), "Role")["metadata"]["name"]}
    return [(subject["name"], subject["namespace"]) for subject in binding["subjects"]]


def test_role_is_bound_to_the_accounts_kfp_runs_pipeline_pods_as():
    # Multi-user Kubeflow runs a profile's pipeline pods as default-editor; standalone KFP as pipeline-runner.
    assert binding_subjects({}) == [("af-alignflow", "ml"), ("default-editor", "ml"), ("pipeline-runner", "ml")]


def test_pipeline_service_accounts_are_configurable_and_never_duplicated():
    values = {"serviceAccount": {"name": "runner"},
              "rbac": {"pipelineServiceAccounts": ["team-runner", "runner", "team-runner"]}}
    assert binding_subjects(values) == [("runner", "ml"), ("team-runner", "ml")]
    assert binding_subjects({"rbac": {"pipelineServiceAccounts": []}}) == [("af-alignflow", "ml")]


@pytest.mark.parametrize("accounts", [[""], ["Default_Editor"], "default-editor"])
def test_a_bad_pipeline_service_account_is_rejected_at_install(accounts):
    import helm_python

    with pytest.raises(helm_python.HelmValuesError):
        render({"rbac": {"pipelineServiceAccounts": accounts}})
