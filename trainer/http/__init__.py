"""The one small HTTP layer every client and JSON server of alignflow shares.

`transient` is the one definition of a failure worth retrying; `retry` the backoff policy that retries
it (exponential, capped, honouring Retry-After, with a budget and a deadline); `client` a JSON client
with an optional bearer token that never shows in a message; `handler` the base of the small JSON
servers (the reward server, the sandbox service); `errors` what the client raises.

Its users: the launcher and the `alignflow` CLI (the Kubernetes and KFP APIs, through their own
generated clients: retry only), the reward service client and the judge, the sandbox client, and the
TrainJob status reporter. What this leaves out: what a failure means to each of them (the reward
client's shared fate of one scoring call, the launcher's rule never to delete a running job). S3 keeps
its own classification (`trainer/storage/s3.py`): S3 names its errors by code, not only by status.

Named `trainer.http`: a subpackage, so `import http` anywhere still finds the standard library's.
"""
