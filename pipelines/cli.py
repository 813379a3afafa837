"""`alignflow`: run a pipeline on this machine, compile it, or send it to Kubeflow Pipelines.

    alignflow run [PIPELINE] [--preset tiny] [--param key=value ...] [--root DIR]
    alignflow compile PIPELINE -o pipeline.yaml
    alignflow submit PIPELINE --host URL [--param key=value ...] [--experiment NAME] [--wait]
    alignflow schedule PIPELINE --host URL --cron "0 3 * * *" [--param key=value ...]
    alignflow upload PIPELINE --host URL [--name NAME] [--version NAME]
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
    run.add_argument("--preset", default=None, help="Named parameter set, e.g. `tiny` (the offline tiny model "
                                                    "and addition task that `make demo` runs).")
    compile_ = commands.add_parser("compile", help="Compile a pipeline to a KFP package (YAML).")
    compile_.add_argument("pipeline", help="Pipeline name.")
    compile_.add_argument("-o", "--output", type=Path, required=True, help="Where to write the package.")
    for name, text in (("submit", "Start a run on a KFP API server."),
                       ("schedule", "Create a recurring run (a scheduled retrain)."),
                       ("upload", "Upload the pipeline (or a new version) for the Kubeflow UI.")):
        command = commands.add_parser(name, help=text)
        command.add_argument("pipeline", help="Pipeline name.")
        command.add_argument("--host", required=True, help="KFP API endpoint, e.g. http://ml-pipeline-ui.kubeflow")
        if name != "upload":
            command.add_argument("--param", action="append", default=[], metavar="KEY=VALUE", help="Pipeline parameter.")
            command.add_argument("--experiment", default="alignflow", help="KFP experiment (created if missing).")
    submit = commands.choices["submit"]
    submit.add_argument("--run-name", default=None, help="Run name (default: pipeline and time).")
    submit.add_argument("--wait", action="store_true", help="Follow the run; exit 1 unless it succeeds.")
    submit.add_argument("--timeout", type=float, default=86400.0, help="Seconds --wait waits before giving up.")
    submit.add_argument("--poll-seconds", type=float, default=10.0, help="Seconds between status checks.")
    schedule = commands.choices["schedule"]
    schedule.add_argument("--cron", required=True, help='When to run, e.g. "0 3 * * *" (seconds field optional).')
    schedule.add_argument("--name", default=None, help="Recurring run name (default: PIPELINE-retrain).")
    upload = commands.choices["upload"]
    upload.add_argument("--name", default=None, help="Pipeline name in KFP (default: PIPELINE).")
    upload.add_argument("--version", default=None, help="Version name when the pipeline exists (default: a timestamp).")
    return parser


def run_remote(args: argparse.Namespace) -> int:
    from pipelines import remote
    from pipelines.catalog import get_pipeline

    get_pipeline(args.pipeline)  # an unknown name fails before anything is sent
    params = parse_params(getattr(args, "param", []))
    if args.command == "schedule":
        remote.cron_with_seconds(args.cron)  # a bad schedule fails before anything is sent
    try:
        return _call_remote(args, params)
    except AlignflowError:
        raise
    except Exception as err:  # the KFP client's API, connection and timeout errors
        raise PipelineError(f"{args.host}: {args.command} {args.pipeline} failed: {type(err).__name__}: "
                            f"{str(err).splitlines()[0] if str(err) else ''}") from err


def _call_remote(args: argparse.Namespace, params: dict) -> int:
    from pipelines import remote

    if args.command == "submit":
        run_id, state = remote.submit(args.pipeline, args.host, params, args.experiment,
                                      args.run_name, args.wait, args.timeout, args.poll_seconds)
        print(f"run {run_id}: {state} ({args.host.rstrip('/')}/#/runs/details/{run_id})")
        return 0 if state in ("submitted", remote.SUCCEEDED) else 1
    if args.command == "schedule":
        recurring_id = remote.schedule(args.pipeline, args.host, params, args.experiment,
                                       args.cron, args.name)
        print(f"recurring run {recurring_id}: {args.cron}")
        return 0
    pipeline_id, version_id = remote.upload(args.pipeline, args.host, args.name, args.version)
    print(f"pipeline {pipeline_id}" + (f", version {version_id}" if version_id else ""))
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.command == "compile":
            from kfp import compiler

            from pipelines.catalog import get_pipeline

            compiler.Compiler().compile(get_pipeline(args.pipeline), str(args.output))
            print(f"wrote {args.output}")
        elif args.command in ("submit", "schedule", "upload"):
            return run_remote(args)
        else:
            from pipelines.local_run import run_and_summarise

            print(run_and_summarise(args.pipeline, args.root, parse_params(args.param), args.preset))
    except AlignflowError as err:
        print(f"{type(err).__name__}: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
