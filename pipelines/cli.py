"""`alignflow`: run a pipeline on this machine, compile it, or send it to Kubeflow Pipelines.

    alignflow run [PIPELINE] [--preset tiny] [--param key=value ...] [--root DIR] [--verbose]
    alignflow compile PIPELINE -o pipeline.yaml
    alignflow submit [PIPELINE] --host URL [--params-file FILE] [--param key=value ...] [--wait]
    alignflow schedule [PIPELINE] --host URL --cron "0 3 * * *" [--params-file FILE] [--param key=value ...]
    alignflow upload PIPELINE --host URL [--name NAME] [--version NAME]

submit, schedule and upload take `--namespace` (default `KFP_NAMESPACE`) for multi-user Kubeflow
and authenticate as pipelines/remote.py describes (`KFP_TOKEN_PATH`, `KFP_TOKEN`).
Exit codes: 0 done (or submitted), 1 the run did not succeed, 2 a usage or API error, 3 `--wait`
ran out of time (the run goes on; its link is printed).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from trainer.errors import AlignflowError, PipelineError

EXIT_RUN_FAILED, EXIT_ERROR, EXIT_WAIT_TIMEOUT = 1, 2, 3


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
    run.add_argument("--verbose", action="store_true",
                     help="Show every task's executor output as it runs (by default it goes only to the log files "
                          "under ROOT/logs/, and a line per task shows its start and end).")
    compile_ = commands.add_parser("compile", help="Compile a pipeline to a KFP package (YAML).")
    compile_.add_argument("pipeline", help="Pipeline name.")
    compile_.add_argument("-o", "--output", type=Path, required=True, help="Where to write the package.")
    for name, text in (("submit", "Start a run on a KFP API server."),
                       ("schedule", "Create or replace a recurring run (a scheduled retrain)."),
                       ("upload", "Upload the pipeline (or a new version) for the Kubeflow UI.")):
        command = commands.add_parser(name, help=text)
        command.add_argument("--host", required=True, help="KFP API endpoint, e.g. http://ml-pipeline-ui.kubeflow")
        command.add_argument("--namespace", default=os.environ.get("KFP_NAMESPACE") or None,
                             help="Kubeflow profile namespace (multi-user) of experiments, runs, recurring runs and "
                                  "uploads (default: KFP_NAMESPACE; none in single-user Kubeflow).")
        if name == "upload":
            command.add_argument("pipeline", help="Pipeline name.")
            continue
        command.add_argument("pipeline", nargs="?", default=None,
                             help="Pipeline name (default: the `pipeline` of --params-file).")
        command.add_argument("--params-file", type=Path, default=None,
                             help="YAML parameters file (and the dataset manifest it names); --param wins over it.")
        command.add_argument("--param", action="append", default=[], metavar="KEY=VALUE", help="Pipeline parameter.")
        command.add_argument("--experiment", default="alignflow",
                             help="KFP experiment (created if missing), and the MLflow experiment of the run's MLflow "
                                  "runs where KFP's MLflow plugin opens them (KFP 2.17: plugins_input).")
        command.add_argument("--service-account", default=os.environ.get("KFP_SERVICE_ACCOUNT", ""),
                             help="ServiceAccount of the run's pods (default: KFP_SERVICE_ACCOUNT, else the "
                                  "namespace's default, `default-editor` in a Kubeflow profile).")
        command.add_argument("--pipeline-root", default=os.environ.get("ALIGNFLOW_PIPELINE_ROOT", ""),
                             help="Where the run's artifacts go, e.g. s3://bucket/runs (default: "
                                  "ALIGNFLOW_PIPELINE_ROOT, else KFP's).")
    submit = commands.choices["submit"]
    submit.add_argument("--run-name", default=None, help="Run name (default: pipeline and time).")
    submit.add_argument("--wait", action="store_true", help="Follow the run; exit 1 unless it succeeds.")
    submit.add_argument("--timeout", type=float, default=86400.0,
                        help="Seconds --wait follows the run before giving up with exit code 3 (the run goes on).")
    submit.add_argument("--poll-seconds", type=float, default=10.0, help="Seconds between status checks.")
    submit.add_argument("--ui-url", default=os.environ.get("KFP_UI_URL", ""),
                        help="Base URL of the KFP UI for the run link (default: KFP_UI_URL, else --host).")
    schedule = commands.choices["schedule"]
    schedule.add_argument("--cron", required=True, help='When to run, e.g. "0 3 * * *" (seconds field optional).')
    schedule.add_argument("--name", default=None,
                          help="Recurring run name (default: PIPELINE-retrain); one of that name is replaced.")
    upload = commands.choices["upload"]
    upload.add_argument("--name", default=None, help="Pipeline name in KFP (default: PIPELINE).")
    upload.add_argument("--version", default=None, help="Version name when the pipeline exists (default: a timestamp).")
    return parser


def resolve_pipeline_and_params(args: argparse.Namespace) -> tuple[str, dict]:
    """The pipeline and its parameters: the parameters file first, then --param; checked against the pipeline."""
    from pipelines.catalog import get_pipeline
    from pipelines.params_file import load_params_file

    named, params = (None, {})
    if getattr(args, "params_file", None) is not None:
        named, params = load_params_file(args.params_file)
    pipeline = args.pipeline or named
    if pipeline is None:
        raise PipelineError(f"{args.command}: name a pipeline, or give --params-file with a `pipeline:` key")
    if args.pipeline and named and args.pipeline != named:
        raise PipelineError(f"{args.params_file}: pipeline is {named!r} but the command line names "
                            f"{args.pipeline!r}; one file says what a retrain trains, so they must agree")
    accepted = set(get_pipeline(pipeline).component_spec.inputs or {})
    params = {**params, **parse_params(getattr(args, "param", []))}
    unknown = sorted(set(params) - accepted)
    if unknown:
        raise PipelineError(f"{pipeline} has no parameter(s) {unknown}; it takes {sorted(accepted)}")
    return pipeline, check_scheduling(params)


def check_scheduling(params: dict) -> dict:
    """`params` with its `scheduling` overrides checked here, before a run starts (LaunchError naming the key)."""
    from components.launcher.settings.scheduling import scheduling_overrides

    if params.get("scheduling") not in (None, "", {}):
        scheduling_overrides(params["scheduling"], "parameter scheduling")
    return params


def run_remote(args: argparse.Namespace) -> int:
    from pipelines import remote

    pipeline, params = resolve_pipeline_and_params(args)  # bad input fails before anything is sent
    if args.command == "schedule":
        remote.cron_with_seconds(args.cron)
    endpoint = remote.Endpoint(args.host, args.namespace, getattr(args, "ui_url", ""))
    try:
        return _call_remote(args, pipeline, params, endpoint)
    except AlignflowError:
        raise
    except Exception as err:  # the KFP client's API, connection and timeout errors
        raise PipelineError(f"{args.host}: {args.command} {pipeline} failed: {type(err).__name__}: "
                            f"{str(err).splitlines()[0] if str(err) else ''}") from err


def _call_remote(args: argparse.Namespace, pipeline: str, params: dict, endpoint) -> int:
    from pipelines import remote

    if args.command == "upload":
        pipeline_id, version_id = remote.upload(pipeline, endpoint, args.name, args.version)
        print(f"pipeline {pipeline_id}" + (f", version {version_id}" if version_id else ""))
        return 0
    options = remote.RunOptions(args.experiment, args.service_account, args.pipeline_root)
    if args.command == "schedule":
        recurring_id, replaced = remote.schedule(pipeline, endpoint, params, options, args.cron, args.name)
        print(f"recurring run {recurring_id}: {args.cron}" + (f" (replaced {', '.join(replaced)})" if replaced else ""))
        return 0
    run_id = remote.start_run(pipeline, endpoint, params, options, args.run_name)
    link = endpoint.run_link(run_id)
    print(f"run {run_id}: submitted ({link})", flush=True)  # the link is out even if waiting fails later
    if not args.wait:
        return 0
    try:
        state = remote.wait_for_run(endpoint, run_id, args.timeout, args.poll_seconds)
    except remote.WaitTimeout as err:
        print(f"run {run_id}: still running after {args.timeout:g} s ({link})")
        print(f"{type(err).__name__}: {err}", file=sys.stderr)
        return EXIT_WAIT_TIMEOUT
    print(f"run {run_id}: {state} ({link})")
    return 0 if state == remote.SUCCEEDED else EXIT_RUN_FAILED


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

            print(run_and_summarise(args.pipeline, args.root, check_scheduling(parse_params(args.param)), args.preset,
                                    args.verbose))
    except AlignflowError as err:
        from pipelines.local_run import LocalRunFailed

        print(f"{type(err).__name__}: {err}", file=sys.stderr)
        return EXIT_RUN_FAILED if isinstance(err, LocalRunFailed) else EXIT_ERROR
    return 0


if __name__ == "__main__":
    sys.exit(main())
