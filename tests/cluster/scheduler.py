"""Which emulated node a pod fits on, and the scheduler's message when none does.

The filters a real kube-scheduler applies first, in its own words: node selector and required node
affinity ("didn't match Pod's node affinity/selector"), taints with effect NoSchedule/NoExecute
("had untolerated taint {key: value}"), and resource requests against what is left of each node's
allocatable ("Insufficient nvidia.com/gpu"). The message has the real shape:
`0/2 nodes are available: 1 Insufficient nvidia.com/gpu, 1 node(s) had untolerated taint {...}.
preemption: 0/2 nodes are available: 2 Preemption is not helpful for scheduling.`

Left out: pod (anti-)affinity, topology spread, preferred terms and preemption itself.
"""

from __future__ import annotations

import re
from collections import Counter

_QUANTITY = re.compile(r"^([0-9.]+)([a-zA-Z]*)$")
_SUFFIX = {"": 1, "m": 1e-3, "k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "Ki": 2**10, "Mi": 2**20,
           "Gi": 2**30, "Ti": 2**40}


def quantity(value: object) -> float:
    """A Kubernetes quantity ('500m', '16Gi', 2) as a number."""
    match = _QUANTITY.match(str(value))
    if not match or match.group(2) not in _SUFFIX:
        raise ValueError(f"not a quantity: {value!r}")
    return float(match.group(1)) * _SUFFIX[match.group(2)]


def pod_requests(pod: dict) -> dict[str, float]:
    """Summed container requests (a limit without a request counts as the request, as the API defaults it)."""
    total: Counter = Counter()
    for container in pod["spec"].get("containers", []):
        resources = container.get("resources") or {}
        merged = {**(resources.get("limits") or {}), **(resources.get("requests") or {})}
        for name, value in merged.items():
            total[name] += quantity(value)
    return dict(total)


def _tolerates(toleration: dict, taint: dict) -> bool:
    if toleration.get("effect") and toleration["effect"] != taint.get("effect"):
        return False
    if toleration.get("operator") == "Exists":
        return not toleration.get("key") or toleration["key"] == taint["key"]
    return toleration.get("key") == taint["key"] and toleration.get("value", "") == taint.get("value", "")


def _expression_holds(expression: dict, labels: dict[str, str]) -> bool:
    key, operator, values = expression["key"], expression["operator"], expression.get("values", [])
    if operator == "In":
        return labels.get(key) in values
    if operator == "NotIn":
        return labels.get(key) not in values
    if operator == "Exists":
        return key in labels
    if operator == "DoesNotExist":
        return key not in labels
    raise ValueError(f"node affinity operator {operator} is not emulated")


def _affinity_holds(pod_spec: dict, labels: dict[str, str]) -> bool:
    required = (((pod_spec.get("affinity") or {}).get("nodeAffinity") or {})
                .get("requiredDuringSchedulingIgnoredDuringExecution") or {})
    terms = required.get("nodeSelectorTerms") or []
    return not terms or any(all(_expression_holds(e, labels) for e in term.get("matchExpressions", []))
                            for term in terms)


def misfit(pod: dict, node: dict, used: dict[str, float]) -> list[str]:
    """Why `pod` cannot go on `node` (empty when it fits), in the scheduler's words."""
    spec, labels = pod["spec"], node["metadata"].get("labels") or {}
    selector = spec.get("nodeSelector") or {}
    if any(labels.get(k) != v for k, v in selector.items()) or not _affinity_holds(spec, labels):
        return ["node(s) didn't match Pod's node affinity/selector"]
    for taint in node["spec"].get("taints") or []:
        if taint.get("effect") in ("NoSchedule", "NoExecute") and \
                not any(_tolerates(t, taint) for t in spec.get("tolerations") or []):
            return [f"node(s) had untolerated taint {{{taint['key']}: {taint.get('value', '')}}}"]
    allocatable = node["status"].get("allocatable") or {}
    reasons = []
    for name, amount in sorted(pod_requests(pod).items()):
        if amount > quantity(allocatable.get(name, 0)) - used.get(name, 0.0):
            reasons.append(f"Insufficient {name}")
    return reasons


def choose_node(pod: dict, nodes: list[dict], used_by_node: dict[str, dict[str, float]]) -> tuple[str | None, str]:
    """(node name, "") for the first node the pod fits on, else (None, the FailedScheduling message)."""
    if not nodes:
        return None, "no nodes available to schedule pods"
    counts: Counter = Counter()
    for node in nodes:
        name = node["metadata"]["name"]
        reasons = misfit(pod, node, used_by_node.get(name, {}))
        if not reasons:
            return name, ""
        counts.update(reasons)
    total = len(nodes)
    details = ", ".join(f"{count} {reason}" for reason, count in sorted(counts.items()))
    return None, (f"0/{total} nodes are available: {details}. preemption: 0/{total} nodes are available: "
                  f"{total} Preemption is not helpful for scheduling.")
