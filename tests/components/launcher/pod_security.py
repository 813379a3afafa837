"""The Pod Security Standards' "restricted" profile as a checker of pod specs (Kubernetes 1.25+).

Written from the policy's table (kubernetes.io/docs/concepts/security/pod-security-standards):
every baseline control plus the restricted ones. `violations(pod_spec)` returns one line per broken
control, naming the field, like the admission controller's warnings.
"""

from __future__ import annotations

BASELINE_CAPABILITIES = {"AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD",
                         "NET_BIND_SERVICE", "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT"}
RESTRICTED_VOLUME_TYPES = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim",
                           "projected", "secret"}
SAFE_SYSCTLS = {"kernel.shm_rmid_forced", "net.ipv4.ip_local_port_range", "net.ipv4.ip_unprivileged_port_start",
                "net.ipv4.tcp_syncookies", "net.ipv4.ping_group_range", "net.ipv4.ip_local_reserved_ports",
                "net.ipv4.tcp_keepalive_time", "net.ipv4.tcp_fin_timeout", "net.ipv4.tcp_keepalive_intvl",
                "net.ipv4.tcp_keepalive_probes"}
SELINUX_TYPES = {"", "container_t", "container_init_t", "container_kvm_t", "container_engine_t"}


def _containers(pod: dict) -> list[tuple[str, dict]]:
    return [(f"{kind}[{c.get('name')}]", c) for kind in ("initContainers", "containers", "ephemeralContainers")
            for c in pod.get(kind, [])]


def _baseline(pod: dict, problems: list[str]) -> None:
    pod_context = pod.get("securityContext", {})
    for name in ("hostNetwork", "hostPID", "hostIPC"):
        if pod.get(name):
            problems.append(f"{name} is true")
    if pod_context.get("windowsOptions", {}).get("hostProcess"):
        problems.append("securityContext.windowsOptions.hostProcess is true")
    for volume in pod.get("volumes", []):
        if "hostPath" in volume:
            problems.append(f"volume {volume['name']} is a hostPath")
    for sysctl in pod_context.get("sysctls", []):
        if sysctl["name"] not in SAFE_SYSCTLS:
            problems.append(f"sysctl {sysctl['name']} is not a safe sysctl")
    for where, context in [("pod", pod_context)] + [(n, c.get("securityContext", {})) for n, c in _containers(pod)]:
        selinux = context.get("seLinuxOptions", {})
        if selinux.get("type", "") not in SELINUX_TYPES or selinux.get("user") or selinux.get("role"):
            problems.append(f"{where}: seLinuxOptions {selinux} are not allowed")
        if context.get("seccompProfile", {}).get("type") == "Unconfined":
            problems.append(f"{where}: seccompProfile is Unconfined")
        if context.get("appArmorProfile", {}).get("type") == "Unconfined":
            problems.append(f"{where}: appArmorProfile is Unconfined")
    for name, container in _containers(pod):
        context = container.get("securityContext", {})
        if context.get("privileged"):
            problems.append(f"{name}: privileged is true")
        added = set(context.get("capabilities", {}).get("add", [])) - BASELINE_CAPABILITIES
        if added:
            problems.append(f"{name}: capabilities.add {sorted(added)} beyond the baseline set")
        if context.get("procMount", "Default") != "Default":
            problems.append(f"{name}: procMount is {context['procMount']}")
        if any(port.get("hostPort") for port in container.get("ports", [])):
            problems.append(f"{name}: hostPort is set")


def _restricted(pod: dict, problems: list[str]) -> None:
    pod_context = pod.get("securityContext", {})
    for volume in pod.get("volumes", []):
        kinds = set(volume) - {"name"}
        if not kinds <= RESTRICTED_VOLUME_TYPES:
            problems.append(f"volume {volume['name']} has type {sorted(kinds)}, not allowed under restricted")
    if pod_context.get("runAsUser") == 0:
        problems.append("securityContext.runAsUser is 0")
    for name, container in _containers(pod):
        context = container.get("securityContext", {})
        if context.get("allowPrivilegeEscalation") is not False:
            problems.append(f"{name}: allowPrivilegeEscalation is not false")
        if "ALL" not in context.get("capabilities", {}).get("drop", []):
            problems.append(f"{name}: capabilities.drop does not contain ALL")
        if set(context.get("capabilities", {}).get("add", [])) - {"NET_BIND_SERVICE"}:
            problems.append(f"{name}: capabilities.add may only contain NET_BIND_SERVICE")
        if context.get("runAsUser") == 0:
            problems.append(f"{name}: runAsUser is 0")
        non_root = context.get("runAsNonRoot", pod_context.get("runAsNonRoot"))
        if non_root is not True:
            problems.append(f"{name}: runAsNonRoot is not true (neither on the container nor on the pod)")
        seccomp = context.get("seccompProfile", pod_context.get("seccompProfile", {})).get("type")
        if seccomp not in ("RuntimeDefault", "Localhost"):
            problems.append(f"{name}: seccompProfile is {seccomp!r}, expected RuntimeDefault or Localhost")


def violations(pod_spec: dict) -> list[str]:
    """Every way `pod_spec` breaks the restricted profile (empty when it meets it)."""
    problems: list[str] = []
    _baseline(pod_spec, problems)
    _restricted(pod_spec, problems)
    return problems
