"""The algorithm sections of the online stages: what `ppo` and `grpo` share, PPO's, and GRPO's with its variants.

GRPO's section chooses the advantage estimator (`trainer/algorithms/advantages.py`) and the policy
loss (`trainer/algorithms/grpo.py`); its validator refuses the combinations that make no sense. The
loss names are spelled out here as `Literal`s; `tests/trainer/test_config.py` checks they are exactly
the ones `trainer/algorithms/grpo.py` implements.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from trainer.config.sections import Section


class OnlineAlgorithmConfig(Section):
    num_episodes: int = Field(10, gt=0, description="Collect-then-learn rounds.")
    num_collect_steps: int = Field(1, gt=0, description="Prompt batches collected per episode.")
    rollout_batch_size: int = Field(16, gt=0, description="Prompts per rank per collect step.")
    num_update_epochs: int = Field(1, gt=0, description="Passes over an episode's experience (PPO epochs).")
    mini_batch_size: int = Field(16, gt=0, description="Sequences per rank per optimizer step.")


class PPOAlgorithmConfig(OnlineAlgorithmConfig):
    kl_coef: float = Field(0.05, ge=0, description="Weight of the per-token KL penalty in the reward (initial value if adaptive).")
    kl_estimator: Literal["k1", "k3"] = Field("k1", description="Per-token KL estimator in the reward.")
    target_kl: float | None = Field(None, gt=0, description="Adapt kl_coef towards this KL per sequence; null keeps it fixed.")
    kl_horizon: int = Field(10000, gt=0, description="Samples over which the adaptive controller corrects.")
    cliprange: float = Field(0.2, gt=0, description="Policy ratio clip epsilon.")
    cliprange_value: float = Field(0.2, gt=0, description="Value clip range around the old values.")
    vf_coef: float = Field(0.5, gt=0, description="Weight of the value loss.")
    gamma: float = Field(1.0, ge=0, le=1, description="Discount over response tokens.")
    lam: float = Field(0.95, ge=0, le=1, description="GAE lambda.")
    whiten_advantages: bool = Field(True, description="Normalise advantages over the batch.")
    entropy_coef: float = Field(0.0, ge=0, description="Weight of the entropy bonus.")
    ptx_coef: float = Field(0.0, ge=0, description="Weight of the pretraining (SFT) loss on `ptx_data_path`.")
    ptx_data_path: str | None = Field(None, description="SFT-schema data for the ptx loss.")
    reward_clip: float | None = Field(None, gt=0, description="Clip sequence scores to [-reward_clip, reward_clip].")
    critic_lr: float = Field(1e-5, gt=0, description="Peak learning rate of the critic.")
    critic_model_path: str | None = Field(None, description="Critic init; null uses reward.model_path, else model.path.")

    @model_validator(mode="after")
    def _check_ptx(self) -> PPOAlgorithmConfig:
        if self.ptx_coef > 0 and self.ptx_data_path is None:
            raise ValueError(f"ptx_coef is {self.ptx_coef} but ptx_data_path is not set")
        return self


class GRPOAlgorithmConfig(OnlineAlgorithmConfig):
    num_generations: int = Field(4, ge=2, description="Responses sampled per prompt (the group size).")
    advantage_estimator: Literal["grpo", "rloo", "reinforce_plus_plus"] = Field(
        "grpo", description="How a response's score becomes its advantage: `grpo` (the score minus its group's mean, "
        "scaled by `scale_rewards`; Shao et al. 2024), `rloo` (the score minus the mean of the other responses of its "
        "group; Ahmadian et al. 2024), `reinforce_plus_plus` (per-token returns of the score and a per-token KL "
        "penalty, normalised over the batch; Hu 2025). It also places `beta`'s KL: in the loss (grpo: k3 per token), "
        "or in the reward (rloo: beta times the response's summed k1, as TRL's RLOO; reinforce_plus_plus: beta "
        "times each token's k1)."
    )
    beta: float = Field(
        0.04, ge=0, description="Weight of the KL to the reference (where it goes: `advantage_estimator`); 0 loads "
        "no reference model."
    )
    scale_rewards: Literal["group", "batch", "none"] | None = Field(
        None, description="What the advantages are divided by: `group` (the group's std of the scores; grpo only), "
        "`batch` (the std over the whole batch, all ranks: of the scores for grpo, as PPO-Lite; of the advantages "
        "for rloo, TRL's normalize_advantages; of the returns for reinforce_plus_plus, its normalisation), `none` "
        "(centred only: Dr. GRPO for grpo). null: the estimator's own (grpo group, rloo none, reinforce_plus_plus "
        "batch). true and false are read as group and none (TRL's older form)."
    )
    gamma: float = Field(
        1.0, ge=0, le=1, description="Discount of REINFORCE++'s returns over response tokens (reinforce_plus_plus only)."
    )
    loss_type: Literal["grpo", "dr_grpo", "dapo", "bnpo", "cispo", "sapo", "luspo", "vespo"] = Field(
        "dapo", description="The policy loss and how its tokens are averaged (TRL's names): `grpo` (per response, then "
        "over responses), `dr_grpo` (token sum over responses x max_new_tokens), `dapo` (token mean over the global "
        "batch), `bnpo` (token mean per micro-batch), `cispo` (clipped importance weights, MiniMax-M1), `sapo` (a "
        "sigmoid gate instead of the clip), `luspo` (GSPO scaled by response length; needs sequence ratios), "
        "`vespo` (gamma-weighted sequence ratios; needs token ratios). trainer/algorithms/grpo.py gives each formula."
    )
    epsilon: float = Field(0.2, gt=0, description="Lower clip range of the ratio, 1 - epsilon (and the upper one "
                           "when `epsilon_high` is null).")
    epsilon_high: float | None = Field(
        None, gt=0, description="Upper clip range, 1 + epsilon_high (DAPO's clip-higher uses 0.28); null uses "
        "`epsilon`. With loss_type cispo it is the cap of the importance weight (MiniMax-M1's eps_max, e.g. 5) and "
        "must be set."
    )
    importance_sampling_level: Literal["token", "sequence"] = Field(
        "token", description="`token`: one ratio pi / pi_old per token; `sequence`: GSPO's one ratio per response, "
        "exp(mean of the token log-ratios), shared by its tokens (Zheng et al. 2025)."
    )
    use_bias_correction_kl: bool = Field(
        False, description="Multiply the KL term of the loss by the importance ratio pi / pi_old, which makes its "
        "gradient the unbiased reverse-KL gradient off-policy (DeepSeek-V3.2; TRL's default is true; the GRPO paper's "
        "k3 term is false). Only with the KL in the loss (the grpo estimator)."
    )
    mask_truncated_completions: bool = Field(
        False, description="Leave responses that hit `generation.max_new_tokens` without a stop token out of the loss "
        "(DAPO); counted as `episode/truncated_fraction`."
    )
    dynamic_sampling: bool = Field(
        False, description="Leave groups whose responses all score the same out of the loss and out of the batch "
        "statistics (DAPO's dynamic sampling, without resampling); counted as `episode/dropped_groups`."
    )
    overlong_buffer_length: int | None = Field(
        None, gt=0, description="DAPO's soft overlong punishment: a response longer than max_new_tokens minus this "
        "many tokens loses up to `overlong_penalty_factor` of score, linearly, reaching it at max_new_tokens; null "
        "adds none. Must be below `generation.max_new_tokens`."
    )
    overlong_penalty_factor: float = Field(1.0, ge=0, description="The largest overlong penalty (DAPO's 1).")
    sapo_temperature_pos: float = Field(1.0, gt=0, description="SAPO's gate temperature for tokens with advantage > 0.")
    sapo_temperature_neg: float = Field(1.05, gt=0, description="SAPO's gate temperature for tokens with advantage <= 0.")
    vespo_k_pos: float = Field(2.0, ge=0, description="VESPO's power k for advantages >= 0 (down-weights ratios < 1).")
    vespo_lambda_pos: float = Field(3.0, gt=0, description="VESPO's decay lambda for advantages >= 0 (down-weights "
                                    "ratios > 1).")
    vespo_k_neg: float = Field(3.0, ge=0, description="VESPO's power k for advantages < 0.")
    vespo_lambda_neg: float = Field(2.0, gt=0, description="VESPO's decay lambda for advantages < 0.")

    @model_validator(mode="before")
    @classmethod
    def _read_older_forms(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        if "loss_aggregation" in data:
            raise ValueError(f"loss_aggregation ({data['loss_aggregation']!r}) was replaced by loss_type: "
                             "token -> dapo, sequence -> grpo")
        if isinstance(data.get("scale_rewards"), bool):  # TRL's older form, and this section's before issue 23
            data = {**data, "scale_rewards": "group" if data["scale_rewards"] else "none"}
        return data

    @model_validator(mode="after")
    def _check_combinations(self) -> GRPOAlgorithmConfig:
        if self.loss_type == "luspo" and self.importance_sampling_level != "sequence":
            raise ValueError("loss_type luspo scales GSPO's sequence-level loss by length: it needs "
                             "importance_sampling_level sequence (it is token)")
        if self.loss_type == "vespo" and self.importance_sampling_level != "token":
            raise ValueError("loss_type vespo builds its own sequence weight from token ratios: it needs "
                             "importance_sampling_level token (it is sequence)")
        if self.loss_type == "cispo" and self.epsilon_high is None:
            raise ValueError("loss_type cispo caps the importance weight at epsilon_high, which is not set "
                             "(MiniMax-M1 and ScaleRL use about 5)")
        if self.scale_rewards == "group" and self.advantage_estimator != "grpo":
            raise ValueError(f"scale_rewards group divides by the group std of GRPO's advantage; advantage_estimator "
                             f"is {self.advantage_estimator!r}: use batch or none")
        if self.use_bias_correction_kl and not self.kl_in_loss:
            raise ValueError(f"use_bias_correction_kl weights the KL term of the loss, but advantage_estimator "
                             f"{self.advantage_estimator!r} puts the KL in the reward")
        if self.gamma != 1.0 and self.advantage_estimator != "reinforce_plus_plus":
            raise ValueError(f"gamma is {self.gamma} but only reinforce_plus_plus discounts returns (advantage_estimator "
                             f"is {self.advantage_estimator!r})")
        return self

    @property
    def resolved_scale_rewards(self) -> str:
        """`scale_rewards`, or the estimator's own when it is null."""
        defaults = {"grpo": "group", "rloo": "none", "reinforce_plus_plus": "batch"}
        return self.scale_rewards or defaults[self.advantage_estimator]

    @property
    def kl_in_loss(self) -> bool:
        """Whether `beta`'s KL is a term of the loss (the grpo estimator) rather than a penalty in the reward."""
        return self.advantage_estimator == "grpo"
