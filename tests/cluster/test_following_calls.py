"""What following a running TrainJob costs the API server, counted by the emulated one (every request is recorded).

The launcher follows a job with one read of the TrainJob per poll; it lists the job's pods only when the TrainJob
changed or no trainer pod is known yet, and reads the trainer's log (what the component's log shows). Measured by
this test before that design (the SDK's `get_job`: GET TrainJob, GET runtime, LIST pods; then `PodMonitor` listing
the pods again, and the log): 85 calls in 17 polls, 5.0 per poll (30 a minute at 10 s polls); after: 2.1 per poll
(13 a minute). docs/kubeflow.md has the figures.
"""

from __future__ import annotations

import time
from collections import Counter

import pytest

from tests.cluster.test_emulated_trainer import NS, launcher_for, shell_request, trainer_cluster  # noqa: F401

CHART_POLL_SECONDS = 10  # scheduling.pollSeconds' default: what a minute of a real job costs


def test_following_a_running_trainjob_costs_two_calls_per_poll(trainer_cluster):  # noqa: F811
    launcher = launcher_for(trainer_cluster)  # polls every 0.5 s
    requests = trainer_cluster.api.requests
    name = "calls"
    launcher.create(shell_request(name, "for i in $(seq 1 40); do echo step $i; sleep 0.25; done"))
    trainer_cluster.wait_for(lambda: (trainer_cluster.store.get("trainjobs", NS, name).get("status") or {}).get(
        "jobsStatus", [{}])[0].get("ready"), 30, "the TrainJob's pod runs")
    first, started = len(requests), time.monotonic()
    launcher.wait(NS, name, timeout=120)
    elapsed = time.monotonic() - started
    calls = Counter(f"{r.verb} {r.resource}{'/' + r.subresource if r.subresource else ''}"
                    for r in requests[first:])
    polls = calls["get trainjobs"]  # each poll reads the TrainJob once, in either design
    per_poll = sum(calls.values()) / polls
    print(f"{sum(calls.values())} calls in {polls} polls over {elapsed:.1f} s ({per_poll:.2f} per poll, "
          f"{per_poll * 60 / CHART_POLL_SECONDS:.0f} per minute at {CHART_POLL_SECONDS} s polls): {dict(calls)}")
    assert per_poll <= 2.3, dict(calls)  # one TrainJob read and one log read; pods only when something changed
    assert calls["list pods"] <= 4, dict(calls)
    assert calls["get trainingruntimes"] == 0 and calls["get clustertrainingruntimes"] == 0
    launcher.delete(NS, name)


def test_a_trainjob_kueue_holds_is_reported_as_queued_with_the_queues_reason(trainer_cluster):  # noqa: F811
    from kubernetes import client as k8s

    from components.launcher.kinds.interface import JobState
    from components.launcher.shared.retry import RetryPolicy

    # What Kueue's webhook leaves of a job submitted to a LocalQueue: suspended until its Workload is admitted.
    job = {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
           "metadata": {"name": "queued", "labels": {"kueue.x-k8s.io/queue-name": "gpu-queue"}},
           "spec": {"runtimeRef": {"name": "af-alignflow-torch", "kind": "TrainingRuntime"}, "suspend": True}}
    created = k8s.CustomObjectsApi(trainer_cluster.client()).create_namespaced_custom_object(
        "trainer.kubeflow.org", "v1alpha1", NS, "trainjobs", job)
    kind = launcher_for(trainer_cluster).kind
    [state] = kind.follower(NS, "queued", RetryPolicy()).states(0)
    assert state == JobState("Queued", "queued by Kueue in queue gpu-queue, waiting for quota")  # no Workload yet
    # Kueue's Workload for the job, as Kueue writes it while the queue's ClusterQueue lacks quota.
    why = "couldn't assign flavors to pod set node: insufficient unused quota for nvidia.com/gpu in flavor a100, 8 more needed"
    trainer_cluster.store.create("workloads", {
        "metadata": {"name": "trainjob-queued-1a2b3", "namespace": NS,
                     "labels": {"kueue.x-k8s.io/job-uid": created["metadata"]["uid"]}},
        "status": {"conditions": [{"type": "QuotaReserved", "status": "False", "reason": "Pending", "message": why}]}})
    [state] = kind.follower(NS, "queued", RetryPolicy()).states(0)
    assert state == JobState("Queued", f"queued by Kueue in queue gpu-queue: {why}")
    assert trainer_cluster.pods(NS, "jobset.sigs.k8s.io/jobset-name=queued") == []  # nothing runs while queued


@pytest.mark.parametrize("served", [("v1beta2",), ("v1beta1",)], ids=["kueue-0.15-storage-version", "older-kueue"])
def test_kueues_reason_is_read_at_v1beta2_first_and_at_v1beta1_where_only_that_is_served(trainer_cluster,  # noqa: F811
                                                                                        served, monkeypatch):
    from kubernetes import client as k8s

    from components.launcher.kinds.interface import JobState
    from components.launcher.shared.retry import RetryPolicy

    monkeypatch.setitem(trainer_cluster.api.versions, "workloads", served)
    job = {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
           "metadata": {"name": f"queued-{served[0]}", "labels": {"kueue.x-k8s.io/queue-name": "gpu-queue"}},
           "spec": {"runtimeRef": {"name": "af-alignflow-torch", "kind": "TrainingRuntime"}, "suspend": True}}
    created = k8s.CustomObjectsApi(trainer_cluster.client()).create_namespaced_custom_object(
        "trainer.kubeflow.org", "v1alpha1", NS, "trainjobs", job)
    trainer_cluster.store.create("workloads", {
        "metadata": {"name": f"trainjob-{served[0]}", "namespace": NS,
                     "labels": {"kueue.x-k8s.io/job-uid": created["metadata"]["uid"]}},
        "status": {"conditions": [{"type": "QuotaReserved", "status": "False", "reason": "Pending",
                                   "message": "insufficient unused quota"}]}})
    before = len(trainer_cluster.api.calls("list", "workloads"))
    [state] = launcher_for(trainer_cluster).kind.follower(NS, job["metadata"]["name"], RetryPolicy()).states(0)
    assert state == JobState("Queued", "queued by Kueue in queue gpu-queue: insufficient unused quota")
    # One list answered (the stand-in answers an unserved version's 404 before it logs a request).
    assert len(trainer_cluster.api.calls("list", "workloads")) - before == 1
