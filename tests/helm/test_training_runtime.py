"""The chart's training runtime for TrainJobs (templates/training/runtime.yaml) and the name it tells the launcher."""

from __future__ import annotations

import pytest

from tests.helm.chart import OPERATOR_APIS, RUNTIME_KINDS, TRAINER_APIS, one, pod_spec, render
from tests.schemas import TRAINER_RELEASES, problems, trainer_v24_problems

CLUSTERS = {"trainer-only": TRAINER_APIS, "operator-only": OPERATOR_APIS, "both": TRAINER_APIS + OPERATOR_APIS,
            "offline (helm template)": ()}


def runtimes(values: dict, api_versions: tuple[str, ...] = TRAINER_APIS + OPERATOR_APIS) -> list[dict]:
    return [d for d in render(values, api_versions=api_versions) if d["kind"] in RUNTIME_KINDS]


def test_the_runtime_is_what_the_launcher_is_told_to_reference():
    [runtime] = runtimes({})
    config = one(render({}), "ConfigMap")["data"]
    assert runtime["kind"] == "TrainingRuntime" and runtime["metadata"]["name"] == config["ALIGNFLOW_TRAINER_RUNTIME"]
    # The Kubeflow SDK lists a runtime only with its framework label; `torch` makes the plugin inject PET_*.
    assert runtime["metadata"]["labels"]["trainer.kubeflow.org/framework"] == "torch"
    assert runtime["spec"]["mlPolicy"] == {"numNodes": 1, "torch": {}}


def test_the_pods_get_what_a_trainjob_cannot_patch():
    values = {"scheduling": {"priorityClassName": "training"},
              "images": {"trainer": {"repository": "registry.corp/ml/trainer", "tag": "7"},
                         "launcher": {"repository": "l", "tag": "1"}}}
    [runtime] = runtimes(values)
    pod = pod_spec(runtime)
    assert pod["priorityClassName"] == "training" and pod["automountServiceAccountToken"] is False
    assert pod["restartPolicy"] == "Never"  # what a podFailurePolicy requires
    [node] = pod["containers"]
    assert (node["name"], node["image"]) == ("node", "registry.corp/ml/trainer:7")


def test_the_trainer_pods_carry_the_ancestor_step_label_a_network_policy_selects():
    """Trainer's own runtimes label the Job template; a Job's labels do not reach its pods, so the pod template
    carries the label too (what a NetworkPolicy in front of Trainer's status server selects by)."""
    [runtime] = runtimes({})
    [node] = runtime["spec"]["template"]["spec"]["replicatedJobs"]
    label = {"trainer.kubeflow.org/trainjob-ancestor-step": "trainer"}
    assert node["template"]["metadata"]["labels"] == label
    assert node["template"]["spec"]["template"]["metadata"]["labels"] == label


def test_preemption_restarts_without_counting_and_real_failures_count():
    [runtime] = runtimes({"training": {"runtime": {"maxRestarts": 5}}})
    jobset = runtime["spec"]["template"]["spec"]
    [node_job] = jobset["replicatedJobs"]
    job = node_job["template"]["spec"]
    # A preempted trainer exits 143 (SIGTERM) or 130 (SIGINT); an evicted pod has the DisruptionTarget condition.
    rules = job["podFailurePolicy"]["rules"]
    assert {"action": "FailJob", "onExitCodes": {"containerName": "node", "operator": "In", "values": [130, 143]}} \
        in rules
    assert {"action": "FailJob", "onPodConditions": [{"type": "DisruptionTarget"}]} in rules
    assert job["backoffLimit"] == 0  # any other failure fails the Job at once: the JobSet restarts all nodes
    assert jobset["failurePolicy"]["maxRestarts"] == 5
    [rule] = jobset["failurePolicy"]["rules"]
    assert (rule["action"], rule["onJobFailureReasons"]) == ("RestartJobSetAndIgnoreMaxRestarts", ["PodFailurePolicy"])


@pytest.mark.parametrize(("values", "expected"), [
    ({"training": {"jobKind": "pytorchjob"}}, []),
    ({"training": {"runtime": {"create": False}}}, []),
    ({"training": {"runtime": {"kind": "ClusterTrainingRuntime"}}}, ["ClusterTrainingRuntime"]),
])
def test_the_runtime_is_installed_only_where_trainjobs_use_it(values, expected):
    assert [d["kind"] for d in runtimes(values)] == expected


def test_an_existing_runtime_is_named_as_given_or_the_stock_one():
    names = {key: one(render({"training": {"runtime": runtime}}), "ConfigMap")["data"]["ALIGNFLOW_TRAINER_RUNTIME"]
             for key, runtime in {"stock": {"create": False}, "named": {"create": False, "name": "team-torch"}}.items()}
    assert names == {"stock": "torch-distributed", "named": "team-torch"}


def test_a_bad_job_kind_is_rejected_at_install():
    import helm_python

    with pytest.raises(helm_python.HelmValuesError, match="jobKind"):
        render({"training": {"jobKind": "tfjob"}})


@pytest.mark.parametrize(("cluster", "job_kind", "expected"), [
    ("trainer-only", "auto", ["TrainingRuntime"]),
    ("operator-only", "auto", []),  # no TrainingRuntime CRD: installing one would fail the release
    ("both", "auto", ["TrainingRuntime"]),
    ("offline (helm template)", "auto", []),
    ("offline (helm template)", "trainjob", ["TrainingRuntime"]),  # an explicit choice installs it regardless
    ("trainer-only", "pytorchjob", []),
])
def test_the_runtime_follows_what_the_cluster_serves(cluster, job_kind, expected):
    documents = render({"training": {"jobKind": job_kind}}, api_versions=CLUSTERS[cluster])
    assert [d["kind"] for d in documents if d["kind"] in RUNTIME_KINDS] == expected
    # Nothing else the chart installs needs an API the cluster may lack: the install needs no manual step.
    assert all(not d["apiVersion"].startswith(("trainer.kubeflow.org/", "kubeflow.org/")) for d in documents
               if d["kind"] not in RUNTIME_KINDS)


def test_a_cluster_runtime_is_gated_on_its_own_kind():
    values = {"training": {"runtime": {"kind": "ClusterTrainingRuntime"}}}
    only_namespaced = ("trainer.kubeflow.org/v1alpha1", "trainer.kubeflow.org/v1alpha1/TrainingRuntime")
    assert runtimes(values, only_namespaced) == []
    assert [d["kind"] for d in runtimes(values, TRAINER_APIS)] == ["ClusterTrainingRuntime"]


@pytest.mark.parametrize("release", TRAINER_RELEASES)
@pytest.mark.parametrize("kind", RUNTIME_KINDS)
def test_the_runtime_is_valid_for_trainer_v2_3_and_v2_4(release, kind):
    [runtime] = runtimes({"training": {"runtime": {"kind": kind, "maxRestarts": 2}}})
    plural = f"{kind.lower()}s.trainer.kubeflow.org"
    assert problems(plural, runtime, TRAINER_RELEASES[release]) == []
    assert trainer_v24_problems(runtime) == []  # v2.4: replicated-job names of at most 20 characters


def test_the_v2_4_name_limit_is_checked():
    [runtime] = runtimes({})
    runtime["spec"]["template"]["spec"]["replicatedJobs"][0]["name"] = "node-with-a-long-name"  # 21 characters
    [problem] = trainer_v24_problems(runtime)
    assert "replicatedJobs[0].name" in problem and "longer than 20 characters" in problem


@pytest.mark.parametrize("release", TRAINER_RELEASES)
def test_initializers_add_trainers_model_and_dataset_steps_with_a_shared_volume(release):
    """Off by default (they need the initializer images); on, the runtime has Trainer's `model-initializer` and
    `dataset-initializer` jobs (ancestor-step labels, container names as Trainer's builder looks them up), a
    claim per JobSet mounted at /workspace, and the nodes depend on both."""
    [plain] = runtimes({})
    assert [job["name"] for job in plain["spec"]["template"]["spec"]["replicatedJobs"]] == ["node"]
    assert one(render({}), "ConfigMap")["data"]["ALIGNFLOW_INITIALIZERS"] == "false"
    values = {"training": {"initializers": {"enabled": True}}}
    [runtime] = runtimes(values)
    assert one(render(values), "ConfigMap")["data"]["ALIGNFLOW_INITIALIZERS"] == "true"
    jobset = runtime["spec"]["template"]["spec"]
    [claim] = jobset["volumeClaimPolicies"][0]["templates"]
    assert claim["metadata"]["name"] == "initializer"
    jobs = {job["name"]: job for job in jobset["replicatedJobs"]}
    assert list(jobs) == ["dataset-initializer", "model-initializer", "node"]
    for step in ("dataset-initializer", "model-initializer"):
        assert jobs[step]["template"]["metadata"]["labels"]["trainer.kubeflow.org/trainjob-ancestor-step"] == step
        [container] = jobs[step]["template"]["spec"]["template"]["spec"]["containers"]
        assert container["name"] == step and container["image"].startswith(f"ghcr.io/kubeflow/trainer/{step}:")
        assert container["volumeMounts"] == [{"name": "initializer", "mountPath": "/workspace"}]
    assert jobs["node"]["dependsOn"] == [{"name": "dataset-initializer", "status": "Complete"},
                                         {"name": "model-initializer", "status": "Complete"}]
    [node] = jobs["node"]["template"]["spec"]["template"]["spec"]["containers"]
    assert node["volumeMounts"] == [{"name": "initializer", "mountPath": "/workspace", "readOnly": True}]
    plural = "trainingruntimes.trainer.kubeflow.org"
    assert problems(plural, runtime, TRAINER_RELEASES[release]) == []
    assert trainer_v24_problems(runtime) == []


def test_the_initializers_get_the_s3_endpoint_and_credentials_under_the_names_they_read():
    """Trainer's S3 initializers read ENDPOINT, REGION, ACCESS_KEY_ID and SECRET_ACCESS_KEY; the chart's S3 Secret
    holds AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, so the runtime maps them (never values in the manifest), and
    a step the TrainJob gives no STORAGE_URI completes instead of failing the JobSet."""
    values = {"training": {"initializers": {"enabled": True}},
              "s3": {"endpoint": "http://minio.kubeflow:9000", "region": "eu-west-1", "credentialsSecret": "s3-keys"}}
    [runtime] = runtimes(values)
    for job in runtime["spec"]["template"]["spec"]["replicatedJobs"][:2]:
        [container] = job["template"]["spec"]["template"]["spec"]["containers"]
        step = container["name"].removesuffix("-initializer")
        env = {item["name"]: item.get("value") or item["valueFrom"]["secretKeyRef"] for item in container["env"]}
        assert env == {"HF_HOME": "/tmp/huggingface", "ENDPOINT": "http://minio.kubeflow:9000", "REGION": "eu-west-1",
                       "ACCESS_KEY_ID": {"name": "s3-keys", "key": "AWS_ACCESS_KEY_ID"},
                       "SECRET_ACCESS_KEY": {"name": "s3-keys", "key": "AWS_SECRET_ACCESS_KEY"}}
        assert container["command"][:2] == ["/bin/sh", "-c"]
        assert container["command"][2].endswith(f"exec python -m pkg.initializers.{step}")  # the image's ENTRYPOINT
    [runtime] = runtimes({"training": {"initializers": {"enabled": True}}})  # no Secret (IRSA), AWS's endpoint
    [container] = runtime["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"][
        "containers"]
    assert [item["name"] for item in container["env"]] == ["HF_HOME", "REGION"]
