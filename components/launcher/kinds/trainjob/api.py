"""Where TrainJobs live in the Kubernetes API (Kubeflow Trainer v2): the one place they are spelled.

Plain string constants, so the chart's RBAC test (tests/helm/test_rbac.py) can read which resource
each API call names.
"""

GROUP, VERSION, PLURAL, KIND = "trainer.kubeflow.org", "v1alpha1", "trainjobs", "TrainJob"
API_VERSION = f"{GROUP}/{VERSION}"
API = (GROUP, VERSION, PLURAL)
INSTALL_HINT = "is Kubeflow Trainer v2 installed?"
