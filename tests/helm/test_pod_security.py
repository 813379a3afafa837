"""Every pod the chart renders meets the Pod Security Standard "restricted" (Kubernetes 1.30 rules).

`restricted_violations` checks each control of the standard
(https://kubernetes.io/docs/concepts/security/pod-security-standards/), baseline and restricted, on the
pod spec, the pod's annotations and every init, regular and ephemeral container.
"""

from __future__ import annotations

import pytest

from tests.helm.chart import EVERYTHING, OVERRIDES, containers, pod_spec, render

BASELINE_CAPABILITIES = {"AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD",
                         "NET_BIND_SERVICE", "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT"}
RESTRICTED_VOLUME_TYPES = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim",
                           "projected", "secret"}
SAFE_SYSCTLS = {"kernel.shm_rmid_forced", "net.ipv4.ip_local_port_range", "net.ipv4.ip_unprivileged_port_start",
                "net.ipv4.tcp_syncookies", "net.ipv4.ping_group_range", "net.ipv4.ip_local_reserved_ports",
                "net.ipv4.tcp_keepalive_time", "net.ipv4.tcp_fin_timeout", "net.ipv4.tcp_keepalive_intvl",
                "net.ipv4.tcp_keepalive_probes"}
SELINUX_TYPES = {None, "", "container_t", "container_init_t", "container_kvm_t", "container_engine_t"}


def restricted_violations(spec: dict, annotations: dict | None = None) -> list[str]:
    """Each way `spec` breaks the "restricted" profile, as `control: where`."""
    found = []
    pod_context = spec.get("securityContext") or {}
    everything = [("pod", pod_context)] + [(c["name"], c.get("securityContext") or {}) for c in containers(spec)]
    # baseline
    for key in ("hostNetwork", "hostPID", "hostIPC"):
        if spec.get(key):
            found.append(f"host namespaces: {key}")
    for where, context in everything:
        if (context.get("windowsOptions") or {}).get("hostProcess"):
            found.append(f"HostProcess: {where}")
        selinux = context.get("seLinuxOptions") or {}
        if selinux.get("type") not in SELINUX_TYPES or selinux.get("user") or selinux.get("role"):
            found.append(f"SELinux: {where}")
        if (context.get("seccompProfile") or {}).get("type") == "Unconfined":
            found.append(f"seccomp: {where} is Unconfined")
        if (context.get("appArmorProfile") or {}).get("type") not in (None, "RuntimeDefault", "Localhost"):
            found.append(f"AppArmor: {where}")
        if context.get("runAsUser") == 0:
            found.append(f"running as non-root user: {where} runs as UID 0")
    for key, value in (annotations or {}).items():
        if key.startswith("container.apparmor.security.beta.kubernetes.io/") and value != "runtime/default" \
                and not value.startswith("localhost/"):
            found.append(f"AppArmor: annotation {key}")
    for sysctl in pod_context.get("sysctls") or []:
        if sysctl["name"] not in SAFE_SYSCTLS:
            found.append(f"sysctls: {sysctl['name']}")
    for volume in spec.get("volumes") or []:
        kinds = set(volume) - {"name"}
        if not kinds <= RESTRICTED_VOLUME_TYPES:
            found.append(f"volume types: {volume['name']} is {sorted(kinds)}")
    pod_non_root = pod_context.get("runAsNonRoot") is True
    pod_seccomp = (pod_context.get("seccompProfile") or {}).get("type") in ("RuntimeDefault", "Localhost")
    for container in containers(spec):
        name, context = container["name"], container.get("securityContext") or {}
        if context.get("privileged"):
            found.append(f"privileged containers: {name}")
        added = set((context.get("capabilities") or {}).get("add") or [])
        if not added <= BASELINE_CAPABILITIES:
            found.append(f"capabilities (baseline): {name} adds {sorted(added)}")
        if any(port.get("hostPort") for port in container.get("ports") or []):
            found.append(f"host ports: {name}")
        if context.get("procMount", "Default") != "Default":
            found.append(f"/proc mount type: {name}")
        # restricted
        if context.get("allowPrivilegeEscalation") is not False:
            found.append(f"privilege escalation: {name} does not set allowPrivilegeEscalation: false")
        if context.get("runAsNonRoot") is False or not (pod_non_root or context.get("runAsNonRoot") is True):
            found.append(f"running as non-root: {name}")
        container_seccomp = (context.get("seccompProfile") or {}).get("type")
        if not (container_seccomp in ("RuntimeDefault", "Localhost") or pod_seccomp and container_seccomp is None):
            found.append(f"seccomp: {name} is not RuntimeDefault or Localhost")
        capabilities = context.get("capabilities") or {}
        if "ALL" not in (capabilities.get("drop") or []):
            found.append(f"capabilities: {name} does not drop ALL")
        if not set(capabilities.get("add") or []) <= {"NET_BIND_SERVICE"}:
            found.append(f"capabilities: {name} adds more than NET_BIND_SERVICE")
    return found


def workloads(values: dict) -> list[tuple[str, dict, dict]]:
    found = []
    for document in render(values):
        spec = pod_spec(document)
        if spec is not None:
            template = document["spec"]["jobTemplate"]["spec"] if document["kind"] == "CronJob" else document["spec"]
            annotations = (template.get("template", {}).get("metadata") or {}).get("annotations")
            found.append((f"{document['kind']}/{document['metadata']['name']}", spec, annotations or {}))
    return found


@pytest.mark.parametrize("values", OVERRIDES.values(), ids=OVERRIDES.keys())
def test_every_pod_meets_the_restricted_profile(values):
    for where, spec, pod_annotations in workloads(values):
        assert restricted_violations(spec, pod_annotations) == [], where


def test_every_kind_of_pod_is_checked():
    kinds = {where.split("/")[0] for where, _, _ in workloads(EVERYTHING)}
    assert kinds == {"Deployment", "Job", "CronJob", "ClusterTrainingRuntime"}
    assert "TrainingRuntime" in {where.split("/")[0] for where, _, _ in workloads({})}


def test_the_check_catches_each_rule():
    spec = {"hostNetwork": True, "securityContext": {"runAsUser": 0, "sysctls": [{"name": "kernel.msgmax"}]},
            "volumes": [{"name": "docker", "hostPath": {"path": "/var/run/docker.sock"}}],
            "initContainers": [{"name": "init", "securityContext": {"privileged": True}}],
            "containers": [{"name": "main", "ports": [{"containerPort": 80, "hostPort": 80}],
                            "securityContext": {"allowPrivilegeEscalation": False, "runAsNonRoot": True,
                                                "seccompProfile": {"type": "Unconfined"},
                                                "capabilities": {"drop": ["ALL"], "add": ["SYS_ADMIN"]}}}]}
    rules = {violation.split(":")[0] for violation in restricted_violations(spec)}
    assert rules == {"host namespaces", "running as non-root user", "sysctls", "volume types",
                     "privileged containers", "privilege escalation", "running as non-root", "seccomp",
                     "capabilities", "capabilities (baseline)", "host ports"}
