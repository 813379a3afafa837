"""The pod options are declared once: one new entry in POD_OPTIONS reaches every place a knob must reach.

The test makes that one edit to a copy of `components/` and runs, in a fresh process (the dataclasses are
built from the declaration when their modules are imported), what a platform, a component, a run and a
pipeline compile do with the new knob.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from components.launcher.settings.options import POD_OPTIONS, RUN, options_set_by
from components.launcher.stage_job import ClusterOptions

ROOT = Path(__file__).parents[4]
NEW_OPTION = ('    PodOption("runtime_class_name", "text", None, "The pods\' RuntimeClass (gVisor, Kata).", '
              '"ALIGNFLOW_RUNTIME_CLASS", RUN, "runtimeClassName"),\n')
DECLARATION_END = "\n)\n\n\ndef options_set_by("

CHECKS = """
from kfp import compiler, dsl

from components.stage_io import cluster_options
from components.launcher.kinds.pytorchjob.manifest import build_pytorchjob
from components.launcher.kinds.trainjob.request import build_trainjob_request
from components.launcher.settings.platform import PlatformDefaults
from components.launcher.stage_job import stage_spec
from pipelines.options import DEFAULTS_KEYS, as_stage

environ = {"ALIGNFLOW_RUNTIME_CLASS": "gvisor"}
params = {"launcher_mode": "kubernetes", "trainer_image": "", "num_nodes": 1, "gpus_per_node": 0}
# The platform's default, from the component pod's environment (the defaults ConfigMap).
assert PlatformDefaults.from_environment(environ).options["runtime_class_name"] == "gvisor"
assert cluster_options(params, environ).runtime_class_name == "gvisor"
# A run may override it (RUN): as a component parameter, and in its `scheduling` parameter.
assert cluster_options({**params, "runtime_class_name": "runc"}, environ).runtime_class_name == "runc"
cluster = cluster_options({**params, "scheduling": {"runtime_class_name": "kata"}}, environ)
assert cluster.runtime_class_name == "kata"
# The job spec carries it, and both kinds' pods get it.
spec = stage_spec("sft", "s3://b/sft.yaml", "run-1", "sft", cluster)
assert spec.runtime_class_name == "kata"
pod = build_pytorchjob(spec)["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]
assert pod["runtimeClassName"] == "kata", pod
fields = [option for option in build_trainjob_request(spec).options if type(option).__name__ == "PodFields"]
assert fields[0].fields["runtimeClassName"] == "kata", fields
# Every pipeline task's pod gets the ConfigMap key.
assert "ALIGNFLOW_RUNTIME_CLASS" in DEFAULTS_KEYS

@dsl.component
def step() -> None:
    pass

@dsl.pipeline(name="one-knob")
def pipeline() -> None:
    as_stage(step())

compiler.Compiler().compile(pipeline, "one-knob.yaml")
assert "ALIGNFLOW_RUNTIME_CLASS" in open("one-knob.yaml").read()
print("reached everywhere")
"""


def test_the_declaration_is_what_the_launcher_and_the_pipelines_read():
    assert "runtime_class_name" not in {option.name for option in POD_OPTIONS}  # the knob below is new
    assert not hasattr(ClusterOptions(), "runtime_class_name")
    assert set(options_set_by(RUN)) >= {"cpu_request", "node_selector", "pending_timeout_seconds"}
    assert "kueue_queue" not in options_set_by(RUN)  # quota stays the platform's (or the component's)


def test_adding_a_pod_option_is_one_edit(tmp_path):
    shutil.copytree(ROOT / "components", tmp_path / "components", ignore=shutil.ignore_patterns("__pycache__"))
    declaration = tmp_path / "components" / "launcher" / "settings" / "options.py"
    source = declaration.read_text()
    assert source.count(DECLARATION_END) == 1
    declaration.write_text(source.replace(DECLARATION_END, "\n" + NEW_OPTION.rstrip("\n") + DECLARATION_END))
    (tmp_path / "checks.py").write_text(CHECKS)  # a file: KFP reads a component's source
    done = subprocess.run([sys.executable, "checks.py"], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                          env={"PATH": "/usr/bin:/bin", "PYTHONPATH": f"{tmp_path}:{ROOT}", "HOME": str(tmp_path)})
    assert done.returncode == 0 and "reached everywhere" in done.stdout, done.stderr[-3000:]


def test_every_option_field_is_typed_by_its_kind():
    import dataclasses
    import types
    import typing

    from components.launcher.pod.spec import JobSpec
    from components.launcher.settings.options import KIND_TYPES
    from components.launcher.settings.scheduling import EXPECTED

    assert set(KIND_TYPES) == set(EXPECTED)  # every kind a value is checked as has a type
    cluster = {field.name: field.type for field in dataclasses.fields(ClusterOptions)}
    job = {field.name: field.type for field in dataclasses.fields(JobSpec)}
    for option in POD_OPTIONS:
        assert cluster[option.name] == option.annotation and typing.Any not in (option.annotation, cluster[option.name])
        assert job.get(option.name, option.annotation) == option.annotation
        default = option.default() if callable(option.default) else option.default
        origin = typing.get_origin(option.annotation)
        runtime = option.annotation if origin in (None, types.UnionType) else origin
        assert isinstance(default, runtime), f"{option.name}: {default!r} is not {option.annotation}"
