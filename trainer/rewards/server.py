"""The reference reward server: any alignflow reward model behind the reward-service schema and a chat route.

    python -m trainer.rewards.server --model DIR [--host 0.0.0.0] [--port 8000] [--token-env NAME]

DIR is a reward model as the `rm` stage writes it (`<output_dir>/model`: backbone, value head and
tokenizer). Routes (standard library `http.server`, one thread per request, one forward at a time):

- `POST /score`: the reward-service schema of `trainer.rewards.remote` (`{"prompts", "completions",
  "answers"}` -> `{"scores"}`). A row is scored as the `rm` stage trained it: the prompt's tokens,
  then the completion's and EOS, read at the last token.
- `POST /v1/chat/completions`: OpenAI-compatible, so the server can stand in as a judge backend:
  the last user message is scored as a completion with an empty prompt, and the reply is
  `Score: S` with S = 10 * sigmoid(reward), on the default judge scale 0-10.
- `GET /health`: `{"status": "ok", "requests": {"score": n, "chat": n}}` (readiness and tests).

With `--token-env NAME` every POST must carry `Authorization: Bearer <$NAME>` (else HTTP 401); the
token is never printed. The token check, the body and the JSON answers are `trainer.http.handler`'s
(a body over 16 MiB is refused with 413). Not a production server: no TLS (put it behind the
cluster's mesh or ingress), no batching across requests.
"""

from __future__ import annotations

import argparse
import logging
import os
import threading
from http import HTTPStatus

import torch

from trainer.http.handler import JsonHandler, JsonServer

logger = logging.getLogger(__name__)
MAX_BODY_BYTES = 16 * 1024 * 1024


class RewardModelService:
    """A reward model and its tokenizer, scoring (prompt, completion) pairs in batches."""

    def __init__(self, model_dir: str, max_length: int = 1024) -> None:
        from trainer.config import ModelConfig
        from trainer.modeling.models import load_tokenizer, load_value_model

        self.tokenizer = load_tokenizer(model_dir)
        self.model = load_value_model(ModelConfig(path=model_dir), key="--model").eval()
        self.max_length = max_length
        self.lock = threading.Lock()
        self.counts = {"score": 0, "chat": 0}

    @torch.no_grad()
    def score(self, prompts: list[str], completions: list[str]) -> list[float]:
        """The reward of each completion after its prompt."""
        from trainer.algorithms.reward import last_token_values
        from trainer.data.tokenize import encode_prompt

        rows = []
        for prompt, completion in zip(prompts, completions):
            ids = encode_prompt(self.tokenizer, prompt) if prompt else []
            ids += self.tokenizer(completion + self.tokenizer.eos_token, add_special_tokens=False)["input_ids"]
            rows.append(ids[-self.max_length:])
        width = max(len(ids) for ids in rows)
        pad = self.tokenizer.pad_token_id
        input_ids = torch.tensor([ids + [pad] * (width - len(ids)) for ids in rows])  # (B, T) right-padded
        mask = torch.tensor([[1] * len(ids) + [0] * (width - len(ids)) for ids in rows])  # (B, T)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        with self.lock:
            values = self.model(input_ids=input_ids, attention_mask=mask, position_ids=positions)  # (B, T)
        return last_token_values(values, mask).float().tolist()


def check_strings(body: dict, key: str, rows: int | None = None) -> list[str]:
    """`body[key]` as a list of strings (of length `rows` when given); ValueError otherwise."""
    values = body.get(key)
    if not isinstance(values, list) or not all(isinstance(value, str) for value in values):
        raise ValueError(f"`{key}` must be a list of strings")
    if rows is not None and len(values) != rows:
        raise ValueError(f"`{key}` has {len(values)} entries, `prompts` {rows}")
    return values


def build_handler(service: RewardModelService) -> type[JsonHandler]:
    """The request handler class bound to `service`; the token check and the JSON are `JsonHandler`'s."""

    class Handler(JsonHandler):
        protocol_version = "HTTP/1.1"
        max_body_bytes = MAX_BODY_BYTES

        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            if self.path != "/health":
                return self.reply_error(HTTPStatus.NOT_FOUND, f"no route {self.path}")
            return self.reply(HTTPStatus.OK, {"status": "ok", "requests": dict(service.counts)})

        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            if not self.is_authorized():
                return None
            body = self.read_json_object()
            if body is None:
                return None
            try:
                if self.path == "/score":
                    return self.reply(HTTPStatus.OK, self.score(body))
                if self.path == "/v1/chat/completions":
                    return self.reply(HTTPStatus.OK, self.chat(body))
            except ValueError as err:
                return self.reply_error(HTTPStatus.BAD_REQUEST, str(err))
            return self.reply_error(HTTPStatus.NOT_FOUND, f"no route {self.path}")

        def score(self, body: dict) -> dict:
            prompts = check_strings(body, "prompts")
            completions = check_strings(body, "completions", len(prompts))
            service.counts["score"] += 1
            return {"scores": service.score(prompts, completions) if prompts else []}

        def chat(self, body: dict) -> dict:
            messages = body.get("messages")
            users = [m.get("content") for m in messages or [] if isinstance(m, dict) and m.get("role") == "user"]
            if not users or not isinstance(users[-1], str):
                raise ValueError("`messages` must hold a user message with string content")
            service.counts["chat"] += 1
            reward = service.score([""], [users[-1]])[0]
            text = f"Score: {10 * torch.sigmoid(torch.tensor(reward)).item():.4f}"
            return {"id": f"chatcmpl-{service.counts['chat']}", "object": "chat.completion",
                    "model": str(body.get("model", "")),
                    "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                                 "finish_reason": "stop"}]}

    return Handler


def main(argv: list[str] | None = None) -> None:
    """Parse the flags, load the model, serve until interrupted."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="reward model directory (the rm stage's <output_dir>/model)")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (0.0.0.0 in a pod)")
    parser.add_argument("--port", type=int, default=8000, help="port; 0 picks a free one (printed)")
    parser.add_argument("--token-env", help="environment variable holding the bearer token requests must carry")
    parser.add_argument("--max-length", type=int, default=1024, help="tokens kept per row (the last ones)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    token = None
    if args.token_env:
        token = os.environ.get(args.token_env, "").strip()
        if not token:
            parser.error(f"--token-env names {args.token_env}, which is not set or empty")
    service = RewardModelService(args.model, args.max_length)
    server = JsonServer((args.host, args.port), build_handler(service), token=token)
    host, port = server.server_address[:2]
    print(f"alignflow reward server on http://{host}:{port}", flush=True)  # tests and probes read the port here
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


if __name__ == "__main__":
    main()
