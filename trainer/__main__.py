"""`python -m trainer {sft,rm,dpo,kto,orpo,ppo,grpo,evaluate} --config stage.yaml [--set key=value ...]`.

The command a PyTorchJob runs under torchrun. It parses the config, runs the stage, and always
leaves the process group; a bad config or bad data ends with one message (a line per problem)
naming where it is, and exit code 2.

Nothing here imports torch: `--help`, `--help-config` and a bad config answer in well under a
second; the stage modules import it when a stage runs.
"""

from __future__ import annotations

import argparse
import logging
import sys

from trainer.config import COMMAND_CONFIGS, describe_fields, load_config
from trainer.errors import AlignflowError, ConfigError
from trainer.lifecycle import collector, preemption
from trainer.redact import redact_text
from trainer.runtime import leave_process_group, read_distributed_env, setup_logging

logger = logging.getLogger("trainer")

ONLINE_STAGES = ("ppo", "grpo")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m trainer", description="Run one alignflow training stage.")
    parser.add_argument("stage", choices=sorted(COMMAND_CONFIGS),
                        help="Which stage to run (or `evaluate`: score a model against a baseline).")
    parser.add_argument("--config", help="Stage config YAML.")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="Override a config field by its dotted key, e.g. --set optimizer.lr=1e-4 (repeatable).")
    parser.add_argument("--stop-after-steps", type=int, default=None, metavar="N",
                        help="Save and exit after step N (optimizer steps; episodes for ppo/grpo), as a preemption "
                             "would; rerun to resume.")
    parser.add_argument("--mode", choices=["colocated", "train", "explore", "both"], default="colocated",
                        help="ppo/grpo only: the OLTrainer loop in one job (colocated), or the experience-driven "
                             "Trainer (train), the explorer (explore), or both as two processes.")
    parser.add_argument("--help-config", action="store_true", help="List every config field of the stage and exit.")
    return parser.parse_args(argv)


def run_online(config, args: argparse.Namespace, argv: list[str]) -> None:
    from trainer.asynchronous import launch as run_async
    from trainer.online.stages import run_online_stage

    if args.mode == "colocated":
        run_online_stage(config, stop_after_episodes=args.stop_after_steps)
    elif args.mode == "train":
        run_async.run_trainer(config)
    elif args.mode == "explore":
        run_async.run_explorer(config)
    else:
        run_async.run_both(config, run_async.explorer_command(argv))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.help_config:
        print("\n".join(describe_fields(COMMAND_CONFIGS[args.stage])))
        return 0
    if not args.config:
        print("error: --config is required", file=sys.stderr)
        return 2
    setup_logging(read_distributed_env())
    collector.freeze_at_exit()
    if args.mode == "colocated":  # setups that end in `open_outputs` (or `run_evaluation`'s scorers)
        collector.pause_while_starting()
    try:
        config = load_config(args.stage, args.config, args.overrides)
        if args.mode != "colocated" and args.stage not in ONLINE_STAGES:
            raise ConfigError(f"--mode {args.mode} is for ppo and grpo; {args.stage} runs colocated only")
        if args.stage in ONLINE_STAGES:
            run_online(config, args, sys.argv[1:] if argv is None else argv)
        elif args.stage == "evaluate":
            from trainer.online.evaluate import run_evaluation

            run_evaluation(config)
        else:
            from trainer.supervised.stages import run_stage

            run_stage(config, stop_after_steps=args.stop_after_steps)
    except AlignflowError as err:
        # The one message a user sees: a URI it names loses any user:password it carried.
        print(redact_text(f"{type(err).__name__}: {err}"), file=sys.stderr)
        return getattr(err, "exit_code", 2)  # RunFinished: 0
    finally:
        collector.resume()  # a setup that failed before it was done (a bad config, bad data)
        leave_process_group()
    if preemption.stopped_by_signal():  # stopped early with a checkpoint: 143 (SIGTERM) or 130 (SIGINT)
        print(f"Preempted: stopped with a checkpoint by signal {preemption.signal_received()}; rerun the same "
              f"command to resume (exit status {preemption.exit_code()})", file=sys.stderr)
        return preemption.exit_code()
    return 0


if __name__ == "__main__":
    sys.exit(main())
