"""The reward sections of the online stages: weighted reward sources, services, the judge, and rollout correction.

`reward.sources` lists where scores come from, each with a weight; the score of a response is the
weighted sum (`trainer.rewards.weighted`). The older one-source forms (`reward.function`,
`reward.model_path`) are read as a one-source list (`RewardSourceConfig.resolved_sources`).
One flat `RewardSourceSpec` per source (rather than a union per kind) keeps every error's location
a real dotted key: `reward.sources.1.service.url`, not a key with the union's tag inside it.
"""

from __future__ import annotations

import re
import string
from typing import Literal
from urllib.parse import urlsplit

from pydantic import Field, field_validator, model_validator

from trainer.config.sandbox import SandboxConfig
from trainer.config.sections import Section

RewardKind = Literal["function", "model", "remote", "judge", "math", "exact_match", "format", "code_tests"]
# The fields only some kinds use, and which kinds those are: anything else set on a source is an error.
KIND_FIELDS: dict[str, tuple[str, ...]] = {
    "path": ("model",), "pattern": ("format",), "normalize": ("exact_match",), "service": ("remote", "judge"),
    "judge": ("judge",), "sandbox": ("code_tests",),
}
REQUIRED_FIELDS: dict[str, tuple[str, ...]] = {
    "function": ("name",), "model": ("path",), "format": ("pattern",), "remote": ("service",),
    "judge": ("service", "judge"),
}
RUBRIC_FIELDS = {"prompt", "response", "answer"}
DEFAULT_RUBRIC = (
    "You grade a response to a task.\n\nTask:\n{prompt}\n\nReference answer (may be empty):\n{answer}\n\n"
    "Response:\n{response}\n\nRate the response from 0 (wrong or unhelpful) to 10 (correct and clear). "
    "End your reply with a line `Score: N`."
)


def check_service_url(url: str) -> str:
    """`url` if a request can be sent to it; ValueError saying what is wrong otherwise.

    Parsed in full here, so that a bad URL stops the run when the config loads rather than at the
    first scoring, after the model has loaded.
    """
    bad = next((index for index, char in enumerate(url) if not " " < char < "\x7f"), None)
    if bad is not None:
        raise ValueError(f"a URL of printable ASCII without spaces; found {url[bad]!r} at character {bad + 1} "
                         "(percent-encode it)")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as err:  # a port that is no number or out of range, unbalanced brackets
        raise ValueError(f"a well-formed URL ({err})") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError("a URL with its scheme and host, like http://reward-server:8000/score "
                         "(scheme http or https)")
    if port == 0:
        raise ValueError("a URL whose port is 1-65535")
    if "@" in parts.netloc:
        raise ValueError("a URL without user info (put credentials in token_env or token_file)")
    return url


class ServiceConfig(Section):
    url: str = Field(description="The service's URL with its scheme: the scoring route of a reward service "
                     "(`http://rm:8000/score`), or a judge's OpenAI-compatible base URL (`http://judge:8000/v1`).")
    timeout_seconds: float = Field(30.0, gt=0, allow_inf_nan=False, description="Seconds one HTTP request may take.")
    max_retries: int = Field(8, ge=0, description="Retries of a request that could not connect, broke off, timed out "
                             "or got HTTP 408/429/5xx, after the first try. With the default waits (0.5, 1, 2, 4, 8, "
                             "10, 10, 10 s) a request rides out an outage of about 45 s, such as a reward pod restart.")
    backoff_seconds: float = Field(0.5, ge=0, allow_inf_nan=False, description="Wait before the first retry; doubled "
                                   "before each next one, up to max_backoff_seconds (plus up to 25% random jitter).")
    max_backoff_seconds: float = Field(10.0, ge=0, allow_inf_nan=False, description="The longest wait between two "
                                       "tries of a request.")
    max_concurrency: int = Field(4, ge=1, description="Requests in flight at once.")
    batch_size: int = Field(32, ge=1, description="Rows per request to a reward service (a judge sends one row per "
                            "request).")
    token_env: str | None = Field(None, description="Environment variable holding the bearer token (a Kubernetes "
                                  "Secret mapped into the pod's env); null sends no Authorization header.")
    token_file: str | None = Field(None, description="File holding the bearer token (a Kubernetes Secret mounted as "
                                   "a volume); null: none. At most one of token_env and token_file.")
    on_failure: Literal["fail", "zero"] = Field(
        "fail", description="When a request still fails after the retries (no connection, an answer cut short or "
        "not HTTP, a timeout, HTTP 408/429/5xx): `fail` the run, or score the step's unanswered rows 0 and count "
        "them (`rewards/<name>/failed_rows`). A malformed answer, another HTTP error, or a service that does not "
        "answer when the stage starts always fails the run.")

    @field_validator("url")
    @classmethod
    def _full_url(cls, url: str) -> str:
        return check_service_url(url)

    @model_validator(mode="after")
    def _one_token_source(self) -> ServiceConfig:
        if self.token_env is not None and self.token_file is not None:
            raise ValueError("set at most one of token_env and token_file")
        return self


class JudgeConfig(Section):
    model: str = Field(description="The `model` named in each chat-completions request (what the endpoint serves).")
    rubric: str = Field(DEFAULT_RUBRIC, description="The user message sent to the judge: a template with the "
                        "placeholders {prompt}, {response} and {answer} (double braces for literal ones).")
    system_prompt: str | None = Field(None, description="An optional system message before the rubric.")
    score_pattern: str = Field(r"(?i)score\s*[:=]\s*(-?\d+(?:\.\d+)?)", description="Regular expression whose "
                               "first group is the score; the last match in the reply counts.")
    min_score: float = Field(0.0, allow_inf_nan=False, description="The lowest score the rubric allows; it maps to "
                             "reward 0.")
    max_score: float = Field(10.0, allow_inf_nan=False, description="The highest score the rubric allows; it maps to "
                             "reward 1.")
    max_tokens: int = Field(256, gt=0, description="The judge's reply length limit (`max_tokens`).")
    on_unparsed: Literal["fail", "zero"] = Field(
        "fail", description="A reply with no score in [min_score, max_score]: `fail` the run naming the row, or "
        "score it 0 and count it (`rewards/<name>/unparsed`).")

    @field_validator("rubric")
    @classmethod
    def _known_placeholders(cls, rubric: str) -> str:
        try:
            names = {name for _, name, _, _ in string.Formatter().parse(rubric) if name is not None}
        except ValueError as err:
            raise ValueError(f"a template whose braces pair up ({err})") from None
        unknown = names - RUBRIC_FIELDS
        if unknown or "response" not in names:
            raise ValueError(f"a template using {{response}} and only {sorted(RUBRIC_FIELDS)}; found {sorted(names)}")
        return rubric

    @field_validator("score_pattern")
    @classmethod
    def _one_group(cls, pattern: str) -> str:
        try:
            groups = re.compile(pattern).groups
        except re.error as err:
            raise ValueError(f"a regular expression ({err})") from None
        if groups < 1:
            raise ValueError("a regular expression with a group around the number")
        return pattern

    @model_validator(mode="after")
    def _ordered_range(self) -> JudgeConfig:
        if self.max_score <= self.min_score:
            raise ValueError(f"max_score ({self.max_score}) above min_score ({self.min_score})")
        return self


class RewardSourceSpec(Section):
    kind: RewardKind = Field(description="`function` (an allowed reward function, by `name`), `model` (a reward "
                             "model directory, `path`), `remote` (a reward service, `service`), `judge` (an LLM judge "
                             "on an OpenAI-compatible endpoint, `service` and `judge`), `math` (math-verify answer "
                             "equivalence to the row's `answer`), `exact_match` (the response equals the answer), "
                             "`format` (the response matches the regular expression `pattern`), `code_tests` (the "
                             "response's program passes the row's test cases in the sandbox, `sandbox`).")
    name: str | None = Field(None, description="kind function: the allowed function's name (as `reward.function`). "
                             "Other kinds: the label in metrics (`rewards/<name>/mean`); null uses the kind.")
    weight: float = Field(1.0, allow_inf_nan=False, description="The source's weight in the summed score, a finite "
                          "number; negative weights penalise.")
    path: str | None = Field(None, description="kind model: the reward model directory (the `rm` stage's "
                             "`<output_dir>/model`).")
    pattern: str | None = Field(None, description="kind format: a regular expression the whole response must match "
                                "(re.fullmatch, DOTALL) for reward 1, else 0.")
    normalize: bool = Field(True, description="kind exact_match: compare after lower-casing, trimming, collapsing "
                            "spaces and dropping a final period; false compares the exact strings.")
    service: ServiceConfig | None = Field(None, description="kinds remote and judge: the HTTP endpoint.")
    judge: JudgeConfig | None = Field(None, description="kind judge: the rubric and how the reply is read.")
    sandbox: SandboxConfig | None = Field(None, description="kind code_tests: where the programs run (`backend` "
                                          "local or remote, `limits` of each run); null: this pod's sandbox with the "
                                          "default limits.")

    @field_validator("pattern")
    @classmethod
    def _compiles(cls, pattern: str | None) -> str | None:
        if pattern is not None:
            try:
                re.compile(pattern)
            except re.error as err:
                raise ValueError(f"a regular expression ({err})") from None
        return pattern

    @model_validator(mode="after")
    def _fields_of_kind(self) -> RewardSourceSpec:
        for field, kinds in KIND_FIELDS.items():
            if field in self.model_fields_set and self.kind not in kinds:
                raise ValueError(f"{field} is set but kind is {self.kind}; {field} belongs to kind {' or '.join(kinds)}")
        missing = [field for field in REQUIRED_FIELDS.get(self.kind, ()) if getattr(self, field) is None]
        if missing:
            raise ValueError(f"kind {self.kind} needs {' and '.join(missing)}")
        return self

    @property
    def label(self) -> str:
        """The name in metrics and errors: `name`, else the kind."""
        return self.name or self.kind


class RolloutCorrectionConfig(Section):
    enabled: bool | None = Field(
        None, description="Weight each token's loss by the importance ratio pi_trainer / pi_engine of the tokens the "
        "engine sampled (TRL's vllm_importance_sampling_correction). null: on with rollout.engine vllm (or auto "
        "choosing it), off with hf (there the engine is the trainer's own forward and every weight is 1).")
    mode: Literal["token_truncate", "token_mask", "sequence_truncate", "sequence_mask"] = Field(
        "sequence_mask", description="TRL's vllm_importance_sampling_mode: a ratio per token or one per response "
        "(exp of the summed token log-ratios); outside [clip_min, clip_max] it is clipped to the bound (`truncate`, "
        "TIS) or set to 0 (`mask`, MIS).")
    clip_max: float = Field(3.0, gt=0, description="C_max, the upper bound of the ratio (TRL's "
                            "vllm_importance_sampling_clip_max, formerly _cap).")
    clip_min: float | None = Field(None, ge=0, description="C_min, the lower bound; null: none.")

    @model_validator(mode="after")
    def _ordered_bounds(self) -> RolloutCorrectionConfig:
        if self.clip_min is not None and self.clip_min >= self.clip_max:
            raise ValueError(f"clip_min ({self.clip_min}) below clip_max ({self.clip_max})")
        return self


def check_sources(sources: list[RewardSourceSpec]) -> list[RewardSourceSpec]:
    """ValueError unless the list is non-empty, its labels are distinct and some weight is not 0."""
    if not sources:
        raise ValueError("at least one source")
    labels = [source.label for source in sources]
    repeated = sorted({label for label in labels if labels.count(label) > 1})
    if repeated:
        raise ValueError(f"sources with distinct names; {', '.join(repeated)} repeats (set `name` on each)")
    if all(source.weight == 0 for source in sources):
        raise ValueError("at least one source with a non-zero weight; every weight is 0, so every score would be 0")
    return sources
