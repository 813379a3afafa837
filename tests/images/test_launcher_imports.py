"""What runs on the launcher image imports without what only the trainer image has (torch, transformers, ...).

Every KFP component runs on the launcher image, which has no torch. The trainer modules that components/ and
pipelines/ import (at module level or inside a function, where lightweight components import) are imported in a
process where every package of the trainer image that the launcher image lacks cannot be found. The lineage
component once imported the MLflow tracker, which needs torch: only a pipeline run on the built images showed it.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from importlib import metadata
from pathlib import Path

from tests.images.lock import LOCK, closure, image_requirements, read_lock

ROOT = Path(__file__).parents[2]
# Launcher-side code that runs only on a user's machine, never in a component's pod.
LOCAL_ONLY = {"pipelines/presets.py": "the tiny preset writes its model and data where `alignflow run` runs"}
BLOCKER = """
import importlib.abc, sys
class Absent(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ABSENT:
            raise ModuleNotFoundError(f"No module named {name!r} (not in the launcher image)")
sys.meta_path.insert(0, Absent())
"""


def absent_from_launcher() -> set[str]:
    """Top-level import names of the trainer image's packages that the launcher image does not install."""
    lock = read_lock(LOCK.read_text())
    images = {name: image_requirements((ROOT / "images" / name / "Dockerfile").read_text())
              for name in ("trainer", "launcher")}
    missing = closure(images["trainer"], lock) - closure(images["launcher"], lock)
    return {module for module, distributions in metadata.packages_distributions().items()
            if any(metadata.distribution(d).metadata["Name"].lower().replace("_", "-") in missing for d in distributions)
            and not module.startswith("_")}


def launcher_imports() -> dict[str, set[str]]:
    """Module -> files: every module components/ and pipelines/ import, anywhere in a file."""
    found: dict[str, set[str]] = {}
    for path in sorted([*ROOT.glob("components/**/*.py"), *ROOT.glob("pipelines/**/*.py")]):
        relative = str(path.relative_to(ROOT))
        if relative in LOCAL_ONLY:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = [alias.name for alias in node.names] if isinstance(node, ast.Import) else (
                [node.module] if isinstance(node, ast.ImportFrom) and node.module and not node.level else [])
            for name in names:
                found.setdefault(name, set()).add(relative)
    return found


def test_the_absent_set_is_what_the_launcher_image_leaves_out():
    absent = absent_from_launcher()
    assert {"torch", "transformers", "datasets", "peft"} <= absent
    assert not {"kfp", "kubernetes", "boto3", "mlflow", "yaml", "pydantic"} & absent


def test_no_launcher_code_imports_what_the_launcher_image_lacks():
    absent = absent_from_launcher()
    wrong = {name: sorted(files) for name, files in launcher_imports().items() if name.split(".")[0] in absent}
    assert wrong == {}


def test_every_module_launcher_code_imports_imports_without_the_trainers_stack():
    absent = absent_from_launcher()
    modules = sorted(name for name in launcher_imports() if name.split(".")[0] in ("trainer", "components",
                                                                                    "pipelines"))
    script = (f"ABSENT = {sorted(absent)!r}\n{BLOCKER}\nimport importlib\nfailed = []\n"
              f"for name in {modules!r}:\n"
              "    try:\n        importlib.import_module(name)\n"
              "    except ModuleNotFoundError as err:\n        failed.append(f'{name}: {err}')\n"
              "print('\\n'.join(failed))")
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == ""


def test_the_launcher_image_installs_every_package_launcher_code_imports():
    # A package the launcher code imports but the launcher image never installs would fail only in a cluster:
    # the test environment has it anyway (the Kubeflow SDK, once, when TrainJobs came).
    installed = closure(image_requirements((ROOT / "images" / "launcher" / "Dockerfile").read_text()),
                        read_lock(LOCK.read_text()))
    distributions = metadata.packages_distributions()
    missing = {}
    for name, files in launcher_imports().items():
        top = name.split(".")[0]
        if top in sys.stdlib_module_names or top in ("trainer", "components", "pipelines", "__future__"):
            continue
        provided_by = {metadata.distribution(d).metadata["Name"].lower().replace("_", "-")
                       for d in distributions.get(top, [])}
        if not provided_by & installed:
            missing[name] = sorted(files)
    assert missing == {}
