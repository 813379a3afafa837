"""Two gloo ranks, an FSDP2-sharded actor and one vLLM engine per rank: update the actor, sync, answer greedily.

Usage: torchrun --nproc_per_node=2 fsdp2_sync_driver.py MODEL_DIR PROMPTS_JSON OUT_DIR

Each rank writes `<OUT_DIR>/rank<R>.json` (its engine's greedy answers and log-probs before and after the
sync); rank 0 also saves the updated actor's full weights as an HF model in `<OUT_DIR>/updated`, which the
test loads into a fresh engine. The update is one AdamW step on the sharded parameters.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist


def main() -> None:
    from trainer.config import GenerationConfig, ModelConfig, ParallelConfig, RolloutConfig
    from trainer.modeling.models import export_model, load_causal_lm, load_tokenizer
    from trainer.parallel.booster import Booster
    from trainer.parallel.plugins import make_plugin
    from trainer.rollout.engine_registry import build_rollout_engine
    from trainer.rollout.engines import EngineSetup
    from trainer.rollout.single_turn import sample
    from trainer.runtime import read_distributed_env

    model_dir, prompts_path, out_dir = sys.argv[1:4]
    env = read_distributed_env()
    dist.init_process_group("gloo")
    plugin = make_plugin(ParallelConfig(plugin="fsdp2"), env, torch.device("cpu"))
    actor = load_causal_lm(ModelConfig(path=model_dir), plugin=plugin)  # sharded on load
    booster = Booster(plugin, "no")
    tokenizer = load_tokenizer(model_dir)
    prompts = json.loads(Path(prompts_path).read_text())
    greedy = GenerationConfig(max_new_tokens=8, temperature=0.0)
    engine = build_rollout_engine(RolloutConfig(engine="vllm"), actor, EngineSetup(model_dir))

    def answers() -> dict:
        batch, logps = sample(engine, tokenizer, prompts, greedy, torch.device("cpu"))
        return {"ids": batch["input_ids"].tolist(), "logps": logps.tolist()}

    before = answers()
    optimizer = torch.optim.AdamW(actor.parameters(), lr=1e-2)
    with torch.no_grad():
        batch, _ = sample(engine, tokenizer, prompts, greedy, torch.device("cpu"))
    logits = actor(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    loss = -torch.log_softmax(logits[:, :-1], -1).gather(-1, batch["input_ids"][:, 1:, None]).mean()
    loss.backward()
    optimizer.step()
    engine.sync_from(actor)  # every rank gathers the shards tensor by tensor, in step
    after = answers()
    state = booster.full_state_dict(actor)  # a collective; complete on rank 0
    if env.rank == 0:
        export_model(actor, state, tokenizer, Path(out_dir) / "updated")
    Path(out_dir, f"rank{env.rank}.json").write_text(json.dumps({"before": before, "after": after}))
    engine.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
