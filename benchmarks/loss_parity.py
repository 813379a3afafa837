"""The numerics of every loss variant TRL 1.16 has, step for step against alignflow (issue 23).

    .venv/bin/python benchmarks/loss_parity.py                      # every variant (about 10 minutes on 2 cores)
    .venv/bin/python benchmarks/loss_parity.py --variants dpo_hinge,grpo_cispo --steps 4

Each variant trains the same model (`side_by_side.py`'s 3.2M-parameter Llama, seed 0) on the same
data with the same batches, optimiser (AdamW, lr 1e-4 constant, clip 1.0), precision (fp32) and
seed, once with TRL and once with alignflow, in this process, and compares the logged loss and
gradient norm of every optimizer step:

- preference losses (DPO's list, KTO, ORPO): alignflow draws batches in TRL's order (length
  grouping off; TRL's KTO reads its data sequentially, so its file is written in alignflow's order);
- online losses (GRPO's loss types, GSPO, clip-higher, masking, Dr. GRPO, RLOO): sampling cannot
  be matched across two generate implementations, so both systems get the same completions from
  `fixed_completions` (correct, wrong, longer and truncated answers, drawn per prompt, group slot
  and step), patched into their generate calls. Each rollout is learnt from in 2 optimizer steps
  (TRL's `num_iterations: 2`; alignflow's `num_update_epochs: 2`), so the second step's ratios are
  off 1 and the clip, CISPO's cap, SAPO's gate and VESPO's weights all act.

A variant whose definition differs on purpose says so in its `note` (benchmarks/README.md, "Loss
parity", explains each). Prints one row per variant: steps, the largest absolute loss difference,
the largest relative gradient-norm difference, and the note.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import random
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.side_by_side import LR, MAX_LENGTH, NUM_THREADS, SEED, _quiet_libraries, write_workload  # noqa: E402

BATCH = 8  # pairs, rows or completions per optimizer step
NEW_TOKENS = 8  # longest fixed completion (GRPO's max_completion_length)
GENERATIONS = 4
STEPS = 8


@dataclass(frozen=True)
class Variant:
    family: str  # dpo, kto, orpo, grpo, rloo
    alignflow: dict  # the stage section's keys
    trl: dict  # TRL config keyword arguments
    note: str = ""


def dpo(loss_type, note: str = "", **options) -> Variant:
    return Variant("dpo", {"loss_type": loss_type, **options}, {"loss_type": loss_type, **options}, note)


def grpo(note: str = "", **options) -> Variant:
    return Variant("grpo", options, options, note)


VARIANTS = {
    "dpo_sigmoid": dpo("sigmoid"),
    "dpo_hinge": dpo("hinge"),
    "dpo_ipo": dpo("ipo", "IPO on summed log-probs (the paper's eq. 17); TRL averages them per token"),
    "dpo_exo_pair": dpo("exo_pair", label_smoothing=1e-3),
    "dpo_nca_pair": dpo("nca_pair"),
    "dpo_robust": dpo("robust", label_smoothing=0.1),
    "dpo_bco_pair": dpo("bco_pair"),
    "dpo_sppo_hard": dpo("sppo_hard"),
    "dpo_aot": dpo("aot"),
    "dpo_aot_unpaired": dpo("aot_unpaired"),
    "dpo_apo_zero": dpo("apo_zero"),
    "dpo_apo_down": dpo("apo_down"),
    "dpo_discopop": dpo("discopop"),
    "dpo_sigmoid_norm": dpo("sigmoid_norm"),
    "dpo_sft": dpo("sft", "the chosen NLL per response, averaged over pairs; TRL averages over the batch's tokens"),
    "dpo_mpo_list": dpo(["sigmoid", "bco_pair", "sft"], "sft term as in dpo_sft", loss_weights=[0.8, 0.2, 1.0]),
    "kto": Variant("kto", {"beta": 0.1}, {"beta": 0.1}),
    "kto_weighted": Variant("kto", {"beta": 0.1, "undesirable_weight": 1.33}, {"beta": 0.1, "undesirable_weight": 1.33}),
    "kto_apo_zero_unpaired": Variant("kto", {"loss_type": "apo_zero_unpaired"}, {"loss_type": "apo_zero_unpaired"}),
    "orpo": Variant("orpo", {"beta": 0.1}, {"beta": 0.1},
                    "NLL per chosen response token (the paper's L_SFT); TRL's covers the prompt too"),
    "grpo_dapo": grpo(loss_type="dapo"),
    "grpo_grpo": grpo(loss_type="grpo"),
    "grpo_dr_grpo": grpo(loss_type="dr_grpo", scale_rewards="none"),
    "grpo_bnpo": grpo(loss_type="bnpo"),
    "grpo_cispo": grpo(loss_type="cispo", epsilon_high=1.1),
    "grpo_sapo": grpo(loss_type="sapo"),
    "grpo_vespo": grpo(loss_type="vespo"),
    "grpo_gspo": grpo(loss_type="grpo", importance_sampling_level="sequence"),
    "grpo_luspo": grpo(loss_type="luspo", importance_sampling_level="sequence"),
    "grpo_clip_higher": grpo(loss_type="dapo", epsilon=0.1, epsilon_high=0.28),
    "grpo_batch_scale": grpo(loss_type="dapo", scale_rewards="batch"),
    "grpo_mask_truncated": grpo(loss_type="grpo", mask_truncated_completions=True,
                                note="a masked row still counts in TRL's per-response mean; alignflow leaves it out"),
    "grpo_kl": grpo(loss_type="dapo", beta=0.04, use_bias_correction_kl=False),
    "grpo_kl_bias_corrected": grpo(loss_type="dapo", beta=0.04, use_bias_correction_kl=True),
    "rloo": Variant("rloo", {"advantage_estimator": "rloo", "beta": 0.05, "loss_type": "luspo",
                             "importance_sampling_level": "sequence"}, {"beta": 0.05},
                    "TRL's RLOO loss is -mean(A) at ratio 1 (0: RLOO's A sums to 0 per group), alignflow's luspo "
                    "form -mean(len * A); the gradients are the same, so compare grad_norm"),
}


# -- fixed completions for the online variants -------------------------------------------------------


def fixed_completions(prompts: list[str], step: int, tokenizer) -> list[list[int]]:
    """The completion ids (EOS included, or exactly NEW_TOKENS ids when truncated) for each prompt row of a step.

    Rows come in groups of GENERATIONS copies of a prompt. The first copy is answered right and the second
    wrong (so every group has a learning signal); the others draw from a generator seeded by (prompt, step):
    right, wrong, a longer wrong answer, a truncated one, or a right one with a second line. The same rows
    come out whatever order the prompts are in.
    """
    from trainer.tiny.task import problems

    answers = dict(problems())
    seen: dict[str, int] = {}
    out = []
    for prompt in prompts:
        slot = seen.get(prompt, 0)
        seen[prompt] = slot + 1
        draws = random.Random(f"{prompt}|{step}")
        choice = slot if slot < 2 else [draws.randrange(5) for _ in range(slot + 1)][-1]
        answer = answers[prompt]
        text, ends = [(answer, True), (str(int(answer) + 1), True), (f"{answer} {answer}", True),
                      ("12345678"[:NEW_TOKENS], False), (f"{answer}\nok", True)][choice]
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        out.append(ids + [tokenizer.eos_token_id] if ends else ids[:NEW_TOKENS])
    return out


@contextlib.contextmanager
def alignflow_fixed_generation(tokenizer):
    """alignflow's HF engine returns `fixed_completions` (right-padded) instead of sampling."""
    import torch

    from trainer.rollout.engines import HFGenerateEngine, SampledResponses

    original, calls = HFGenerateEngine.generate, [0]

    def generate(self, prompt_ids, prompt_mask, options, *, stop_token_ids, pad_token_id):
        prompts = [tokenizer.decode(ids[mask.bool()].tolist()) for ids, mask in zip(prompt_ids, prompt_mask)]
        rows = fixed_completions(prompts, calls[0], tokenizer)
        calls[0] += 1
        width = max(len(row) for row in rows)
        return SampledResponses(torch.tensor([row + [pad_token_id] * (width - len(row)) for row in rows],
                                             device=prompt_ids.device))

    HFGenerateEngine.generate = generate
    try:
        yield
    finally:
        HFGenerateEngine.generate = original


def trl_fixed_generation(trainer, tokenizer, returns_logprobs: bool) -> None:
    """TRL's trainer (GRPO or RLOO) returns `fixed_completions` instead of sampling."""
    calls = [0]

    def generate_single_turn(prompt_ids, *args, **kwargs):
        rows = fixed_completions([tokenizer.decode(ids) for ids in prompt_ids], calls[0], tokenizer)
        calls[0] += 1
        return (rows, None) if returns_logprobs else rows

    trainer._generate_single_turn = generate_single_turn


# -- runs --------------------------------------------------------------------------------------------


def write_data(files: dict[str, Path], directory: Path) -> dict[str, Path]:
    """The preference pairs cut to STEPS batches, their unpaired rows, and 2 GRPO prompts; plus alignflow's draw order."""
    from trainer.data.sampler import ResumableSampler
    from trainer.tiny.task import unpaired_rows, write_jsonl

    pairs = [json.loads(line) for line in files["preference"].read_text().splitlines()][:STEPS * BATCH]
    unpaired = unpaired_rows(pairs)[:STEPS * BATCH]
    order = list(ResumableSampler(len(unpaired), 1, 0, shuffle=True, seed=SEED))  # alignflow's first epoch
    prompts = [json.loads(line) for line in files["prompts"].read_text().splitlines()][:2]
    return {**files, "preference": write_jsonl(pairs, directory / "pairs.jsonl"),
            "unpaired": write_jsonl(unpaired, directory / "unpaired.jsonl"),
            "unpaired_in_order": write_jsonl([unpaired[i] for i in order], directory / "unpaired-ordered.jsonl"),
            "prompts": write_jsonl(prompts, directory / "two-prompts.jsonl")}


def alignflow_config(variant: Variant, files: dict[str, Path], output_dir: Path, steps: int):
    """The validated alignflow config of one variant's run."""
    from trainer.config import build_config

    common = {"output_dir": str(output_dir), "model": {"path": str(files["model"])},
              "optimizer": {"lr": LR, "scheduler": "constant", "weight_decay": 0.0, "max_grad_norm": 1.0},
              "checkpoint": {"keep_last": 1}, "tracking": {"backend": "none"}}
    train = {"micro_batch_size": BATCH, "seed": SEED, "log_interval": 1, "mixed_precision": "no",
             "num_threads": NUM_THREADS}
    if variant.family in ("grpo", "rloo"):
        epochs = 2 if variant.family == "grpo" else 1  # TRL's num_iterations: 2 for GRPO here, RLOO's default 1
        section = {"num_episodes": steps // epochs, "rollout_batch_size": BATCH // GENERATIONS, "num_generations":
                   GENERATIONS, "mini_batch_size": BATCH, "num_update_epochs": epochs, "beta": 0.0,
                   **variant.alignflow}
        return build_config("grpo", {**common, "data": {"train_path": str(files["prompts"])}, "train": train,
                                     "generation": {"max_new_tokens": NEW_TOKENS, "temperature": 1.0},
                                     "reward": {"function": "tiny_addition"}, "grpo": section})
    data = {"train_path": str(files["unpaired" if variant.family == "kto" else "preference"]), "max_length": MAX_LENGTH}
    return build_config(variant.family, {**common, "data": data, variant.family: variant.alignflow,
                                         "train": {**train, "max_steps": steps, "group_by_length": False}})


def run_alignflow(variant: Variant, files: dict[str, Path], output_dir: Path, steps: int) -> list[dict]:
    """Train the variant with alignflow; the per-step `loss` and `grad_norm` from metrics.jsonl."""
    from trainer.online.stages import run_online_stage
    from trainer.supervised.stages import run_stage
    from trainer.tiny.model import build_tokenizer

    config = alignflow_config(variant, files, output_dir, steps)
    if variant.family in ("grpo", "rloo"):
        with alignflow_fixed_generation(build_tokenizer()):
            run_online_stage(config)
    else:
        run_stage(config)
    rows = [json.loads(line) for line in (output_dir / "metrics.jsonl").read_text().splitlines()]
    return [{"loss": row["loss"], "grad_norm": row["grad_norm"]} for row in rows if "grad_norm" in row]


def run_trl(variant: Variant, files: dict[str, Path], output_dir: Path, steps: int) -> list[dict]:
    """Train the variant with TRL's trainer for it, configured as alignflow is; the per-step loss and grad_norm."""
    import datasets
    import trl
    from transformers import AutoModelForCausalLM, AutoTokenizer

    datasets.disable_progress_bars()
    tokenizer = AutoTokenizer.from_pretrained(files["model"])
    model = AutoModelForCausalLM.from_pretrained(files["model"])
    common = dict(output_dir=str(output_dir), per_device_train_batch_size=BATCH, learning_rate=LR,
                  lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0, max_grad_norm=1.0, logging_steps=1,
                  save_strategy="no", report_to="none", bf16=False, fp16=False, gradient_checkpointing=False,
                  use_cpu=True, seed=SEED, data_seed=SEED, dataloader_num_workers=0, disable_tqdm=True,
                  max_steps=steps)
    load = lambda key: datasets.load_dataset("json", data_files=str(files[key]), split="train")  # noqa: E731
    if variant.family == "dpo":
        args = trl.DPOConfig(**common, max_length=MAX_LENGTH, beta=0.1, **variant.trl)
        trainer = trl.DPOTrainer(model=model, args=args, train_dataset=load("preference"), processing_class=tokenizer)
    elif variant.family == "kto":
        args = trl.KTOConfig(**common, max_length=MAX_LENGTH, **variant.trl)
        trainer = trl.KTOTrainer(model=model, args=args, train_dataset=load("unpaired_in_order"),
                                 processing_class=tokenizer)
    elif variant.family == "orpo":
        from trl.experimental.orpo import ORPOConfig, ORPOTrainer

        args = ORPOConfig(**common, max_length=MAX_LENGTH, **variant.trl)
        trainer = ORPOTrainer(model=model, args=args, train_dataset=load("preference"), processing_class=tokenizer)
    else:
        from trainer.tiny.task import check_answer

        def addition(prompts, completions, answer, **_):
            return [check_answer(completion, expected) for completion, expected in zip(completions, answer)]

        online = dict(num_generations=GENERATIONS, max_completion_length=NEW_TOKENS, temperature=1.0)
        if variant.family == "rloo":
            args = trl.RLOOConfig(**common, **online, **variant.trl)
            trainer = trl.RLOOTrainer(model=model, reward_funcs=[addition], args=args, train_dataset=load("prompts"),
                                      processing_class=tokenizer)
        else:
            args = trl.GRPOConfig(**common, **online, num_iterations=2, **{"beta": 0.0, **variant.trl})
            trainer = trl.GRPOTrainer(model=model, reward_funcs=[addition], args=args, train_dataset=load("prompts"),
                                      processing_class=tokenizer)
        trl_fixed_generation(trainer, tokenizer, returns_logprobs=variant.family == "grpo")
    from transformers.trainer_callback import PrinterCallback

    trainer.remove_callback(PrinterCallback)  # the per-step dicts it prints; the log history keeps them
    trainer.train()
    return [{"loss": row["loss"], "grad_norm": row["grad_norm"]} for row in trainer.state.log_history
            if "loss" in row and "grad_norm" in row]


def compare(mine: list[dict], theirs: list[dict]) -> dict[str, float]:
    """The largest absolute loss difference and relative grad-norm difference over the steps both logged.

    A gradient norm below 1e-6 counts as 1e-6 in the relative difference (a zero step against rounding noise).
    """
    pairs = list(zip(mine, theirs))
    loss = max(abs(m["loss"] - t["loss"]) for m, t in pairs)
    grad = max(abs(m["grad_norm"] - t["grad_norm"]) / max(abs(t["grad_norm"]), abs(m["grad_norm"]), 1e-6)
               for m, t in pairs)
    return {"steps": len(pairs), "max_loss_diff": loss, "max_grad_norm_rel_diff": grad}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variants", default=",".join(VARIANTS), help="Comma-separated subset of the variants.")
    parser.add_argument("--steps", type=int, default=STEPS, help="Optimizer steps per run (even: GRPO takes 2 a rollout).")
    parser.add_argument("--json", type=Path, help="Also write every run's per-step figures here.")
    args = parser.parse_args(argv)
    names = [name.strip() for name in args.variants.split(",") if name.strip()]
    if unknown := set(names) - set(VARIANTS):
        parser.error(f"unknown variants {sorted(unknown)}; expected some of {','.join(VARIANTS)}")
    import torch

    torch.set_num_threads(NUM_THREADS)
    _quiet_libraries()
    logging.getLogger("trl").setLevel(logging.ERROR)
    results = {}
    with tempfile.TemporaryDirectory(prefix="alignflow-loss-parity-") as work:
        work_dir = Path(work)
        files = write_data(write_workload(work_dir / "workload"), work_dir)
        for name in names:
            variant = VARIANTS[name]
            theirs = run_trl(variant, files, work_dir / f"trl-{name}", args.steps)
            mine = run_alignflow(variant, files, work_dir / f"alignflow-{name}", args.steps)
            results[name] = {"alignflow": mine, "trl": theirs, **compare(mine, theirs), "note": variant.note}
            row = results[name]
            print(f"{name:>22}  steps {row['steps']:2d}  loss diff {row['max_loss_diff']:.2e}  grad_norm rel diff "
                  f"{row['max_grad_norm_rel_diff']:.2e}  first losses af {mine[0]['loss']:.4f} trl "
                  f"{theirs[0]['loss']:.4f}  {variant.note}", flush=True)
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
