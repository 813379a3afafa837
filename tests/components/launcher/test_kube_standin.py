"""The API stand-in behaves like the API server where the launcher depends on it (checked with the real client)."""

from __future__ import annotations

import pytest

from tests.components.launcher.follow.test_launcher import NAME, manifest
from tests.components.launcher.kube_standin import KubeStandIn

GROUP = ("kubeflow.org", "v1", "ml", "pytorchjobs")


@pytest.fixture
def api():
    from kubernetes import client

    with KubeStandIn("hang", step_seconds=0.2) as standin:
        api_client = client.ApiClient(client.Configuration(host=standin.host))
        yield standin, client.CustomObjectsApi(api_client), client.CoreV1Api(api_client)


def test_resource_versions_lists_and_watches(api):
    from kubernetes import watch

    standin, custom, _ = api
    created = custom.create_namespaced_custom_object(*GROUP, manifest())
    listing = custom.list_namespaced_custom_object(*GROUP, field_selector=f"metadata.name={NAME}")
    assert int(listing["metadata"]["resourceVersion"]) >= int(created["metadata"]["resourceVersion"])
    events = list(watch.Watch().stream(custom.list_namespaced_custom_object, *GROUP, timeout_seconds=1,
                                       resource_version=created["metadata"]["resourceVersion"]))
    # Everything after the creation: Created -> Running on the job.
    assert [e["type"] for e in events] == ["MODIFIED"] * len(events) and events
    versions = [int(e["raw_object"]["metadata"]["resourceVersion"]) for e in events]
    assert versions == sorted(versions)


def test_an_expired_version_is_410_and_a_deleted_job_is_404(api):
    from kubernetes import watch
    from kubernetes.client.exceptions import ApiException

    standin, custom, _ = api
    created = custom.create_namespaced_custom_object(*GROUP, manifest())
    standin.store.compact()
    with pytest.raises(ApiException) as err:
        list(watch.Watch().stream(custom.list_namespaced_custom_object, *GROUP, timeout_seconds=1,
                                  resource_version=created["metadata"]["resourceVersion"]))
    assert err.value.status == 410 and "too old resource version" in err.value.reason
    custom.delete_namespaced_custom_object(*GROUP, NAME)
    with pytest.raises(ApiException) as err:
        custom.get_namespaced_custom_object(*GROUP, NAME)
    assert err.value.status == 404


def test_pods_events_and_logs(api):
    from kubernetes.client.exceptions import ApiException

    standin, custom, core = api
    custom.create_namespaced_custom_object(*GROUP, manifest(num_nodes=2))
    pods = core.list_namespaced_pod("ml", label_selector=f"training.kubeflow.org/job-name={NAME}").items
    assert sorted(p.metadata.name for p in pods) == [f"{NAME}-worker-0", f"{NAME}-worker-1"]
    assert pods[0].metadata.owner_references[0].kind == "PyTorchJob"
    with pytest.raises(ApiException) as err:  # not started yet
        core.read_namespaced_pod_log(f"{NAME}-worker-0", "ml", container="pytorch")
    assert err.value.status == 400
    custom.delete_namespaced_custom_object(*GROUP, NAME)
    assert core.list_namespaced_pod("ml").items == []  # the garbage collector took the pods
