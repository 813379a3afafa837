"""What the Kubeflow UI says about a component parameter that several components share, written once.

KFP reads a component input's description from the `Args:` section of the function's docstring
(`__doc__`, kfp's `extract_component_interface`) and writes it into the compiled IR. A lightweight
component's source is embedded in the IR and run in the pod, so the function keeps its explicit
parameters; `documented`, applied below `@dsl.component`, only completes its docstring. KFP embeds the
source from the `def` line on (the decorators above it are dropped), so the pod never imports this module.

A parameter's description comes from, first match wins:

- the component's own `Args:` entry (what only it takes, or what means something else there, such as
  `evaluate_model`'s `job_root`);
- the stage config field the parameter sets (`stage_io`'s key tables: `lr` -> `optimizer.lr`), so the
  UI says what the config says;
- `SHARED`: the run, the outputs every training stage publishes, and the job's cluster parameters.

A table and a docstring writer rather than generated signatures: KFP needs the parameters in the source.
`write_args` writes the pipelines' `Args:` too (pipelines/parameters.py).
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable

SHARED = {
    "metrics": "Final training and evaluation metrics.",
    "report": "Metrics, curves and the resolved config.",
    "curves": "Loss, reward, KL and learning-rate curves against step, as an HTML plot.",
    "run_id": "The pipeline run id (names the job and keys its checkpoints).",
    "settings": "Any other config fields, as {\"dotted.key\": value}.",
    "reward_function": "Registered reward function name, called as f(prompt, completion, answer) -> float.",
    "environment": "Multi-turn episodes in this allowed environment (`environment.name`, docs/agents.md; its limits "
                   "and tools through `settings`); empty samples one response per prompt.",
    "launcher_mode": "`kubernetes` runs a training job (TrainJob or PyTorchJob, the platform's kind); `local` runs "
                     "its nodes as local processes.",
    "trainer_image": "Image of the training job; empty uses the platform's trainer image (one the platform allows).",
    "num_nodes": "Nodes (pods) of the job.",
    "gpus_per_node": "GPUs per node (one process each; 0 runs one CPU process).",
    "s3_secret": "Name of an existing Secret with AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY.",
    "job_root": "Checkpoint and log root of this stage; empty uses a folder beside the model.",
    "parent_run_id": "The pipeline's MLflow run (from open_lineage); this stage's run nests under it.",
    "task_name": "This task's name in the pipeline run (dsl.PIPELINE_TASK_NAME_PLACEHOLDER): where KFP's MLflow "
                 "integration opens a run per task, the stage's run nests under the one of this name.",
    "scheduling": "Overrides of the platform's scheduling defaults for this job's pods, e.g. {\"cpu_request\": \"8\", "
                  "\"memory_limit\": \"96Gi\", \"active_deadline_seconds\": 86400, \"pending_timeout_seconds\": 600}; "
                  "keys are listed in components/launcher/settings/options.py.",
}
# An `Args:` entry: a parameter's name at the section's indentation; its continuation lines are indented further.
ENTRY = re.compile(r"^    (\w+)\s*(\(.*\))?:")


def config_description(stage: str, parameter: str) -> str | None:
    """The description of the stage config field that a training component's `parameter` sets, if it sets one."""
    from components.stage_io import COMMON_KEYS, STAGE_KEYS
    from trainer.config import STAGE_CONFIGS

    dotted = {**COMMON_KEYS, **STAGE_KEYS.get(stage, {})}.get(parameter)
    if dotted is None:
        return None
    model = STAGE_CONFIGS[stage]
    *sections, leaf = dotted.split(".")
    for section in sections:
        model = model.model_fields[section].annotation
    return model.model_fields[leaf].description


def own_entries(args: list[str]) -> dict[str, list[str]]:
    """The lines of each entry of an `Args:` section, by parameter name, kept as written."""
    entries: dict[str, list[str]] = {}
    for line in args:
        match = ENTRY.match(line)
        if match:
            entries[match.group(1)] = [line]
        elif entries:
            entries[next(reversed(entries))].append(line)
    return entries


def write_args(func: Callable, describe: Callable[[str], str | None]) -> Callable:
    """`func` whose `Args:` section describes each parameter, in the signature's order: with the docstring's own
    entry where it has one, else with `describe(name)` (a parameter neither describes is left out).

    Raises:
        ValueError: The docstring has no summary line, or describes a name that is not a parameter of `func`.
    """
    lines = inspect.cleandoc(func.__doc__ or "").splitlines()
    start = lines.index("Args:") if "Args:" in lines else len(lines)
    end = next((i for i in range(start + 1, len(lines)) if not lines[i].startswith(" ")), len(lines))
    own = own_entries(lines[start + 1:end])
    entries = []
    for name in inspect.signature(func).parameters:
        if name in own:
            entries += own.pop(name)
        elif text := describe(name):
            entries.append(f"    {name}: " + " ".join(text.split()))
    if own:
        raise ValueError(f"{func.__name__}: its docstring describes {sorted(own)}, which are not its parameters")
    head = lines[:start]
    while head and not head[-1]:
        head.pop()
    if not head:  # Google style starts with a summary: without one, the parser takes `Args:` for it
        raise ValueError(f"{func.__name__}: its docstring needs a summary line")
    func.__doc__ = "\n".join([*head, "", "Args:", *entries, *lines[end:]]) + "\n"
    return func


def documented(stage: str | None = None) -> Callable[[Callable], Callable]:
    """Complete a component's `Args:` from its stage config's fields and `SHARED` (apply below `@dsl.component`).

    Args:
        stage: The training stage whose config fields describe the parameters that set them; None for a
            component that sets no stage config (`evaluate_model`).
    """
    def describe(name: str) -> str | None:
        return (config_description(stage, name) if stage else None) or SHARED.get(name)

    return lambda component: write_args(component, describe)
