"""The colocated loop's rollout correction: importance weights between the engine's and the trainer's log-probs.

The engine's log-probs of the tokens it sampled (`ScoredRollout.engine_logps`, kept as the batch's
`behaviour_logps`) and the trainer's (`old_logps`) of the same tokens give each response token a
weight, bounded as `rollout.correction` says (`trainer.algorithms.rollout_correction` has the
formulas, shared with the asynchronous mode's staleness weights); the policy loss multiplies each
token's term by it (`importance_weights`, as `trainer.algorithms.grpo` and `ppo` read it). When the
update is exactly on-policy (one optimizer step on the whole episode, no reference model), the loop
leaves the trainer's log-probs to the update's own forward (`CorrectionInUpdate`): the same weights
without a forward of their own, which on the 96M model was 13% of a step.

The `hf` engine samples with the trainer's own weights and gives no log-probs of its own: with the
correction forced on, its behaviour log-probs are the trainer's, every weight is 1, and the run is
the uncorrected one (the test that the correction changes nothing when engine and trainer agree).

Logged metrics (each collect step, or each update step when taken in the update; rank 0's rows):
`rollout_correction/kl`, `rollout_correction/clipped_fraction`, `rollout_correction/ratio_min`,
`rollout_correction/ratio_max`, `rollout_correction/weight_mean`.
"""

from __future__ import annotations

from dataclasses import replace

from trainer.algorithms.rollout_correction import importance_weights
from trainer.config.rewards import RolloutCorrectionConfig
from trainer.rollout.experience import Experience

METRIC_PREFIX = "rollout_correction/"


def correct_rollout(experience: Experience, options: RolloutCorrectionConfig) -> tuple[Experience, dict[str, float]]:
    """`experience` with `importance_weights` set from its `behaviour_logps` and `old_logps`, and the metrics.

    A batch without behaviour log-probs comes back unchanged, with no metrics.
    """
    if experience.behaviour_logps is None or experience.old_logps is None:
        return experience, {}
    weights, statistics = importance_weights(experience.old_logps, experience.behaviour_logps,
                                             experience.action_mask, mode=options.mode, clip_max=options.clip_max,
                                             clip_min=options.clip_min)
    metrics = {METRIC_PREFIX + name: value.item() for name, value in statistics.items()}
    return replace(experience, importance_weights=weights), metrics
