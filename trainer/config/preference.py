"""The algorithm sections of the preference stages: `dpo`, `kto` and `orpo` (and the pair-packing text RM shares).

The loss names are spelled out here as `Literal`s (pydantic needs them where the class is defined);
`tests/trainer/test_config.py` checks they are exactly the ones `trainer/algorithms` implements.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from trainer.config.sections import Section, resolve_packing

PAIR_PACKING_DESCRIPTION = (
    "Pack each micro-batch's 2B chosen and rejected sequences into padding-free rows of whole sequences (each row "
    "at most as long as the longest sequence) instead of padding both answers of a pair to one width; sequences "
    "never attend to each other and the loss is unchanged. Needs transformers>=4.56; null (the default) packs "
    "where the installed transformers can and pads elsewhere; true with an older transformers is an error."
)

DPOLossName = Literal["sigmoid", "hinge", "ipo", "exo_pair", "nca_pair", "robust", "bco_pair", "sppo_hard", "aot",
                      "aot_unpaired", "apo_zero", "apo_down", "discopop", "sigmoid_norm", "sft", "simpo"]
REFERENCE_FREE_DPO_LOSSES = ("simpo", "sft")
SMOOTHED_DPO_LOSSES = ("sigmoid", "robust", "exo_pair", "aot", "aot_unpaired")


class DPOAlgorithmConfig(Section):
    beta: float = Field(0.1, gt=0, description="Strength of the pull towards the reference (beta in the DPO paper). > 0.")
    loss_type: DPOLossName | list[DPOLossName] = Field(
        "sigmoid", description="Preference loss by TRL's name (sigmoid, hinge, ipo, simpo, ...; docs/stages.md lists all), or a "
        "list of them."
    )
    loss_weights: list[float] | None = Field(
        None, description="Weight of each loss of a `loss_type` list (TRL's `loss_weights`, e.g. MPO's [0.8, 0.2, 1.0] "
        "for [sigmoid, bco_pair, sft]); null weighs each 1. Needs a list of the same length."
    )
    label_smoothing: float = Field(
        0.0, ge=0, lt=0.5, description="eps of the losses that read one: `sigmoid` (conservative DPO: the assumed "
        "fraction of flipped labels), `robust` (the flip rate), `aot`, `aot_unpaired`, and `exo_pair` (its label "
        "smoothing, which must be > 0; the paper uses 1e-3). In [0, 0.5)."
    )
    simpo_gamma: float = Field(0.5, ge=0, description="Target reward margin of SimPO (gamma / beta in the paper).")
    discopop_tau: float = Field(
        0.05, gt=0, description="Temperature tau of `discopop`'s mix of logistic and exponential losses (the paper's 0.05)."
    )
    rpo_alpha: float | None = Field(
        None, ge=0, description="Weight of the chosen response's per-token NLL added to the loss (alpha of DPO+NLL, "
        "Pang et al. 2024; TRL's rpo_alpha; the paper uses 1.0); null adds none. Works with every loss_type."
    )
    reference_free: bool = Field(False, description="Use a uniform reference (log-prob 0) instead of a reference model.")
    precompute_ref_log_probs: bool = Field(
        False, description="Compute reference log-probs once before training and free the reference model."
    )
    ref_model_path: str | None = Field(None, description="Reference model directory; null uses `model.path`.")
    packing: bool | None = Field(None, validate_default=True, description=PAIR_PACKING_DESCRIPTION)
    share_prompts: bool = Field(
        True, description="Run the prompt a pair's chosen and rejected answers share once, both answers on top of "
        "its keys and values (log-probs equal up to rounding), in the policy and the live reference. With packing, "
        "each micro-batch then goes padded and shared or packed, whichever computes fewer tokens: prompts longer than "
        "their answers go shared, long answers of unequal length packed. Off under FSDP2, ColossalAI and gradient "
        "checkpointing; false runs every sequence whole, as before."
    )

    @field_validator("packing", mode="after")
    @classmethod
    def _resolve_packing(cls, packing: bool | None) -> bool:
        return resolve_packing(packing)

    @property
    def loss_types(self) -> list[str]:
        """`loss_type` as a list."""
        return [self.loss_type] if isinstance(self.loss_type, str) else list(self.loss_type)

    @property
    def needs_reference(self) -> bool:
        """Whether a reference model is loaded: some loss reads reference log-probs and `reference_free` is false."""
        return not self.reference_free and any(name not in REFERENCE_FREE_DPO_LOSSES for name in self.loss_types)

    @model_validator(mode="after")
    def _check_combinations(self) -> DPOAlgorithmConfig:
        names = self.loss_types
        if not names:
            raise ValueError("loss_type is an empty list; name at least one loss")
        if self.loss_weights is not None and len(self.loss_weights) != len(names):
            raise ValueError(f"loss_weights has {len(self.loss_weights)} weights but loss_type names {len(names)} "
                             f"losses ({names}); give one weight per loss")
        if self.label_smoothing > 0 and not set(names) & set(SMOOTHED_DPO_LOSSES):
            raise ValueError(f"label_smoothing is {self.label_smoothing} but loss_type is {self.loss_type!r}; label "
                             f"smoothing applies to {', '.join(SMOOTHED_DPO_LOSSES)}")
        if "exo_pair" in names and self.label_smoothing == 0:
            raise ValueError("loss_type exo_pair needs label_smoothing > 0 (its eps; the EXO paper uses 1e-3): "
                             "with 0 its loss is infinite")
        return self


class KTOAlgorithmConfig(Section):
    beta: float = Field(0.1, gt=0, description="Strength of the pull towards the reference (beta in the KTO paper). > 0.")
    loss_type: Literal["kto", "apo_zero_unpaired"] = Field(
        "kto", description="`kto` (against the KL reference point z0) or `apo_zero_unpaired` (no reference point)."
    )
    desirable_weight: float = Field(1.0, gt=0, description="lambda_D, the weight of a desirable row's loss (KTO eq. 8).")
    undesirable_weight: float = Field(1.0, gt=0, description="lambda_U, the weight of an undesirable row's loss.")
    ref_model_path: str | None = Field(None, description="Reference model directory; null uses `model.path`.")


class ORPOAlgorithmConfig(Section):
    beta: float = Field(
        0.1, gt=0, description="lambda, the weight of the odds-ratio term beside the chosen NLL (Hong et al. 2024). > 0."
    )
    packing: bool | None = Field(None, validate_default=True, description=PAIR_PACKING_DESCRIPTION)

    @field_validator("packing", mode="after")
    @classmethod
    def _resolve_packing(cls, packing: bool | None) -> bool:
        return resolve_packing(packing)
