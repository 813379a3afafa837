"""What a KFP v2 backend derives from a compiled pipeline for one task: executor input, pod, URIs.

Mirrors the KFP driver and launcher (kubeflow/pipelines `backend/src/v2`): output artifact URIs
`<pipeline root>/<pipeline name>/<run id>/<task name>/<salt>/<output>`, output parameter files
`/tmp/kfp/outputs/<name>`, the executor output file `/tmp/kfp_outputs/output_metadata.json`,
component defaults added for parameters the task does not set, the placeholders the launcher
substitutes in command and args (`{{$}}` is the executor input as protobuf JSON), the local path
of an artifact URI (`/minio/...`, `/s3/...`, `/gcs/...`), and the pod the driver asks for: the
container's image, command, args and resources from the IR, and from the `platforms.kubernetes`
section exactly the env (`secretAsEnv`, `configMapAsEnv`, `fieldPathAsEnv`), node selector,
tolerations, node affinity, pod labels/annotations and deadline it declares. Any other platform
setting is reported as not emulated instead of being ignored silently.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml

OUTPUT_METADATA = "/tmp/kfp_outputs/output_metadata.json"
PARAMETER_OUTPUTS = "/tmp/kfp/outputs"
MOUNTS = {"gs://": "/gcs/", "minio://": "/minio/", "s3://": "/s3/"}
EMULATED_PLATFORM_KEYS = {"secretAsEnv", "configMapAsEnv", "fieldPathAsEnv", "nodeSelector", "tolerations",
                          "nodeAffinity", "podMetadata", "activeDeadlineSeconds", "imagePullPolicy"}


def load_package(path: Path) -> tuple[dict, dict]:
    """(pipeline spec, kubernetes platform spec by executor label) of a compiled package."""
    documents = [doc for doc in yaml.safe_load_all(path.read_text()) if doc]
    platform = {}
    for doc in documents[1:]:
        platform = doc.get("platforms", {}).get("kubernetes", {}).get("deploymentSpec", {}).get("executors", {})
    return documents[0], platform


def local_path(uri: str) -> str:
    """KFP's LocalPathForURI: where an artifact's files are inside the pod."""
    for scheme, mount in MOUNTS.items():
        if uri.startswith(scheme):
            return mount + uri[len(scheme):]
    raise ValueError(f"failed to generate local path for URI {uri}: unsupported storage scheme")


def resolve_runtime_placeholders(value: Any, context: dict[str, str]) -> Any:
    """`{{$.pipeline_job_uuid}}` and friends inside a constant, as the driver resolves them."""
    if isinstance(value, str):
        for key, replacement in context.items():
            value = value.replace("{{$.%s}}" % key, replacement)
        return value
    if isinstance(value, dict):
        return {k: resolve_runtime_placeholders(v, context) for k, v in value.items()}
    if isinstance(value, list):
        return [resolve_runtime_placeholders(v, context) for v in value]
    return value


def resolve_parameter(spec: dict, scope: dict[str, Any], results: dict[str, Any], context: dict[str, str]) -> Any:
    """The value of a TaskInputsSpec.InputParameterSpec in a DAG scope (`results`: outputs of finished tasks)."""
    if "componentInputParameter" in spec:
        return scope[spec["componentInputParameter"]]
    if "taskOutputParameter" in spec:
        ref = spec["taskOutputParameter"]
        return results[ref["producerTask"]].parameters[ref["outputParameterKey"]]
    if "runtimeValue" in spec:
        return resolve_runtime_placeholders(spec["runtimeValue"]["constant"], context)
    if "taskFinalStatus" in spec:  # dsl.PipelineTaskFinalStatus of an exit handler's task
        producer = results[spec["taskFinalStatus"]["producerTask"]]
        status = {"state": producer.state if producer.state in ("SUCCEEDED", "FAILED", "CANCELLED") else "FAILED",
                  "pipelineJobResourceName": context["pipeline_job_resource_name"],
                  "pipelineTaskName": producer.name}
        if producer.error:
            status["error"] = {"code": 2, "message": producer.error}
        return status
    raise ValueError(f"input parameter spec {spec} is not emulated")


def executor_input(component: dict, parameters: dict[str, Any], artifacts: dict[str, list[dict]],
                   output_root: str) -> dict:
    """The ExecutorInput (as protobuf JSON) of a container task, defaults added as the launcher does."""
    definitions = component.get("inputDefinitions", {}).get("parameters", {})
    values = {name: spec["defaultValue"] for name, spec in definitions.items() if "defaultValue" in spec}
    values.update(parameters)
    outputs = component.get("outputDefinitions", {})
    message = {
        "inputs": {"parameterValues": values, "artifacts": {name: {"artifacts": items} for name, items in
                                                            artifacts.items()}},
        "outputs": {
            "artifacts": {name: {"artifacts": [{"name": name, "type": spec["artifactType"],
                                                "uri": f"{output_root}/{name}", "metadata": {}}]}
                          for name, spec in outputs.get("artifacts", {}).items()},
            "parameters": {name: {"outputFile": f"{PARAMETER_OUTPUTS}/{name}"}
                           for name in outputs.get("parameters", {})},
            "outputFile": OUTPUT_METADATA,
        },
    }
    return _through_protobuf(message)


def _through_protobuf(message: dict) -> dict:
    """Round-trip through the ExecutorInput message: the JSON a pod gets is what protojson writes."""
    from google.protobuf import json_format
    from kfp.pipeline_spec import pipeline_spec_pb2

    parsed = json_format.ParseDict(message, pipeline_spec_pb2.ExecutorInput())
    return _integral_numbers(json.loads(json_format.MessageToJson(parsed, indent=None)))


def _integral_numbers(value: Any) -> Any:
    """Go's protojson writes the number 20.0 as `20` (Python's writer keeps `20.0`): a pod sees an int."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, dict):
        return {k: _integral_numbers(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_integral_numbers(v) for v in value]
    return value


def substitute_placeholders(items: list[str], executor: dict) -> list[str]:
    """The launcher's placeholder substitution in a container's command or args."""
    replacements = {"{{$}}": json.dumps(executor, separators=(",", ":"))}
    for name, value in executor["inputs"].get("parameterValues", {}).items():
        replacements[f"{{{{$.inputs.parameters['{name}']}}}}"] = value if isinstance(value, str) else json.dumps(value)
    for direction in ("inputs", "outputs"):
        for name, artifact_list in executor[direction].get("artifacts", {}).items():
            uri = artifact_list["artifacts"][0]["uri"]
            replacements[f"{{{{$.{direction}.artifacts['{name}'].uri}}}}"] = uri
            replacements[f"{{{{$.{direction}.artifacts['{name}'].path}}}}"] = local_path(uri)
    for name, parameter in executor["outputs"].get("parameters", {}).items():
        replacements[f"{{{{$.outputs.parameters['{name}'].output_file}}}}"] = parameter["outputFile"]
    out = []
    for item in items:
        for placeholder, value in replacements.items():
            item = item.replace(placeholder, value)
        out.append(item)
    return out


def container_resources(container: dict, parameters: dict[str, Any]) -> dict:
    """The pod container's `resources` from the IR's (whose values may be `{{$.inputs.parameters[...]}}`)."""
    spec = container.get("resources") or {}

    def value(raw: Any) -> str:
        text = str(raw)
        match = re.fullmatch(r"\{\{\$\.inputs\.parameters\['(.+)'\]\}\}", text)
        return str(parameters[match.group(1)]) if match else text

    requests, limits = {}, {}
    for key, target, name in (("resourceCpuRequest", requests, "cpu"), ("resourceCpuLimit", limits, "cpu"),
                              ("resourceMemoryRequest", requests, "memory"),
                              ("resourceMemoryLimit", limits, "memory")):
        if spec.get(key):
            target[name] = value(spec[key])
    accelerator = spec.get("accelerator") or {}
    if accelerator.get("resourceType") and int(value(accelerator.get("resourceCount", "1")) or 0):
        limits[value(accelerator["resourceType"])] = value(accelerator.get("resourceCount", "1"))
    return {k: v for k, v in (("requests", requests), ("limits", limits)) if v}


def platform_pod_parts(platform: dict, resolve: Any) -> tuple[list[dict], dict, list[str]]:
    """(env entries, pod spec/metadata fields, settings not emulated) from one executor's platform config.

    `resolve(InputParameterSpec)` resolves a parameter reference in the task's scope.
    """
    env: list[dict] = []
    pod: dict[str, Any] = {"spec": {}, "metadata": {}}
    for item in platform.get("secretAsEnv", []):
        name = resolve(item["secretNameParameter"]) if "secretNameParameter" in item else item["secretName"]
        env += [{"name": m["envVar"], "valueFrom": {"secretKeyRef": {"name": name, "key": m["secretKey"],
                                                                     "optional": item.get("optional", False)}}}
                for m in item.get("keyToEnv", [])]
    for item in platform.get("configMapAsEnv", []):
        name = resolve(item["configMapNameParameter"]) if "configMapNameParameter" in item else item["configMapName"]
        env += [{"name": m["envVar"], "valueFrom": {"configMapKeyRef": {"name": name, "key": m["configMapKey"],
                                                                        "optional": item.get("optional", False)}}}
                for m in item.get("keyToEnv", [])]
    env += [{"name": item["name"], "valueFrom": {"fieldRef": {"fieldPath": item["fieldPath"]}}}
            for item in platform.get("fieldPathAsEnv", [])]
    selector = platform.get("nodeSelector") or {}
    labels = dict(selector.get("labels") or {})
    if "nodeSelectorJson" in selector:
        labels.update(_json_value(resolve(selector["nodeSelectorJson"])) or {})
    if labels:
        pod["spec"]["nodeSelector"] = labels
    tolerations = []
    for item in platform.get("tolerations", []):
        if "tolerationJson" in item:
            resolved = _json_value(resolve(item["tolerationJson"])) or []
            tolerations += resolved if isinstance(resolved, list) else [resolved]
        else:
            tolerations.append({k: item[k] for k in ("key", "operator", "value", "effect", "tolerationSeconds")
                                if k in item})
    if tolerations:
        pod["spec"]["tolerations"] = tolerations
    terms = [{"matchExpressions": term["matchExpressions"]} for term in platform.get("nodeAffinity", [])
             if "weight" not in term and term.get("matchExpressions")]
    if terms:
        pod["spec"]["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution":
                                                    {"nodeSelectorTerms": terms}}}
    if platform.get("activeDeadlineSeconds"):
        pod["spec"]["activeDeadlineSeconds"] = int(platform["activeDeadlineSeconds"])
    metadata = platform.get("podMetadata") or {}
    pod["metadata"] = {"labels": dict(metadata.get("labels") or {}),
                       "annotations": dict(metadata.get("annotations") or {})}
    return env, pod, sorted(set(platform) - EMULATED_PLATFORM_KEYS)


def _json_value(value: Any) -> Any:
    return json.loads(value) if isinstance(value, str) and value.strip()[:1] in "[{" else value
