"""`alignflow`: compile a pipeline, or run it on this machine.

    alignflow run [PIPELINE] [--param key=value ...] [--root DIR]
    alignflow compile PIPELINE -o pipeline.yaml
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from trainer.errors import AlignflowError, PipelineError


def parse_params(items: list[str]) -> dict:
    """`key=value` pairs; values are read as JSON when they parse (numbers, booleans, dicts), else strings."""
    params = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise PipelineError(f"--param {item!r}: expected key=value, e.g. --param dpo_beta=0.2")
        try:
            params[key] = json.loads(raw)
        except json.JSONDecodeError:
            params[key] = raw
    return params


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="alignflow", description="RLHF pipelines on Kubeflow, or on this machine.")
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="Run a pipeline locally (kfp.local, local launcher, local MLflow).")
    run.add_argument("pipeline", nargs="?", default="rlhf-dpo", help="Pipeline name (default rlhf-dpo).")
    run.add_argument("--param", action="append", default=[], metavar="KEY=VALUE", help="Pipeline parameter.")
    run.add_argument("--root", type=Path, default=Path("alignflow-runs"), help="Local pipeline root.")
    compile_ = commands.add_parser("compile", help="Compile a pipeline to a KFP package (YAML).")
    compile_.add_argument("pipeline", help="Pipeline name.")
    compile_.add_argument("-o", "--output", type=Path, required=True, help="Where to write the package.")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.command == "compile":
            from kfp import compiler

            from pipelines.registry import get_pipeline

            compiler.Compiler().compile(get_pipeline(args.pipeline), str(args.output))
            print(f"wrote {args.output}")
        else:
            from pipelines.local_run import run_and_summarise

            print(run_and_summarise(args.pipeline, args.root, parse_params(args.param)))
    except AlignflowError as err:
        print(f"{type(err).__name__}: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
