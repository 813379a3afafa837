"""Where PyTorchJobs live in the Kubernetes API (the Training Operator v1): the one place they are spelled.

Plain string constants, so the chart's RBAC test (tests/helm/test_rbac.py) can read which resource
each API call names.
"""

GROUP, VERSION, PLURAL, KIND = "kubeflow.org", "v1", "pytorchjobs", "PyTorchJob"
API_VERSION = f"{GROUP}/{VERSION}"
API = (GROUP, VERSION, PLURAL)
INSTALL_HINT = "is the Training Operator v1 installed?"
