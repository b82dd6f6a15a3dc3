"""OpenAI's embeddings and legacy text-completions shapes as the simulator writes them: checks and bodies.

Pure functions of their arguments, like :mod:`simulator.openai_format`.

* Embeddings are deterministic: the same model and input give the same unit vector, of the requested
  ``dimensions`` (else :data:`DEFAULT_DIMENSIONS`), as floats or as base64 of little-endian float32
  (what OpenAI sends, and what the ``openai`` SDK asks for by default and decodes).
* A legacy completion (bodies in :mod:`simulator.openai_format`) answers its last prompt with one
  choice (``text``), as ``text_completion``, or streamed as ``text_completion`` chunks.
"""

from __future__ import annotations

import base64
import hashlib
import math
import random
import struct
from typing import Any

import orjson

from simulator import openai_format as fmt

DEFAULT_DIMENSIONS = 256
# The largest text-embedding-3 model's size: a larger ``dimensions`` is refused as OpenAI refuses it.
MAX_DIMENSIONS = 3072
MAX_INPUTS = 2048


def _inputs(value: Any, name: str) -> tuple[list[Any], str]:
    """The request's inputs as a list (a string is one), or why they are refused."""
    if isinstance(value, str):
        return [value], ""
    if not isinstance(value, list) or not value:
        return [], f"'{name}' must be a string or a non-empty list"
    if len(value) > MAX_INPUTS:
        return [], f"'{name}' holds more than {MAX_INPUTS} items"
    if all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        return [value], ""  # one prompt of token ids
    if all(isinstance(v, str | list) for v in value):
        return value, ""
    return [], f"'{name}' must hold strings or token-id lists"


def check_embeddings(request: Any) -> str:
    """Why an embeddings request is refused with 400, or '' when it is acceptable."""
    if not isinstance(request, dict):
        return "request body must be a JSON object"
    if not isinstance(request.get("model"), str):
        return "'model' must be a string"
    inputs, problem = _inputs(request.get("input"), "input")
    if problem:
        return problem
    if any(item == "" for item in inputs):
        return "'input' must not contain empty strings"
    dimensions = request.get("dimensions")
    if dimensions is not None and (
        isinstance(dimensions, bool)
        or not isinstance(dimensions, int)
        or not 1 <= dimensions <= MAX_DIMENSIONS
    ):
        return f"'dimensions' must be an integer between 1 and {MAX_DIMENSIONS}, got {dimensions!r}"
    if request.get("encoding_format", "float") not in ("float", "base64"):
        return "'encoding_format' must be 'float' or 'base64'"
    if "stream" in request:
        return "embeddings do not stream"
    return fmt.check_sim_field(request)


def check_completions(request: Any) -> str:
    """Why a legacy completions request is refused with 400, or '' when it is acceptable."""
    if not isinstance(request, dict):
        return "request body must be a JSON object"
    if "prompt" not in request:
        return "'prompt' is required"
    _, problem = _inputs(request.get("prompt"), "prompt")
    return problem or fmt.check_stream_fields(request) or fmt.check_sim_field(request)


def input_tokens(item: Any) -> int:
    """Tokens of one input: chars/4 (at least 1) for text, its length for token ids."""
    if isinstance(item, str):
        return max(1, len(item) // fmt.CHARS_PER_TOKEN)
    return len(item) if isinstance(item, list) else 1


def prompt_of(request: dict[str, Any]) -> tuple[int, str]:
    """A completions request's prompt tokens, and the text of its last prompt (the reply echoes it)."""
    inputs, _ = _inputs(request.get("prompt"), "prompt")
    last = inputs[-1] if inputs else ""
    return sum(input_tokens(i) for i in inputs), last if isinstance(last, str) else ""


def vector(model: str, item: Any, dimensions: int) -> list[float]:
    """A unit vector that depends only on the model, the input and the size."""
    seed = hashlib.sha256(orjson.dumps([model, item, dimensions])).digest()
    rng = random.Random(seed)
    values = [rng.gauss(0.0, 1.0) for _ in range(dimensions)]
    norm = math.sqrt(sum(v * v for v in values)) or 1.0
    return [v / norm for v in values]


def embeddings_body(request: dict[str, Any], default_model: str) -> tuple[bytes, int]:
    """The ``list`` of embeddings answering a checked request, and its prompt tokens."""
    model = request.get("model") or default_model
    dimensions = request.get("dimensions") or DEFAULT_DIMENSIONS
    as_base64 = request.get("encoding_format") == "base64"
    inputs, _ = _inputs(request.get("input"), "input")
    data = []
    for index, item in enumerate(inputs):
        values = vector(model, item, dimensions)
        embedding: Any = (
            base64.b64encode(struct.pack(f"<{dimensions}f", *values)).decode() if as_base64 else values
        )
        data.append({"object": "embedding", "index": index, "embedding": embedding})
    tokens = sum(input_tokens(i) for i in inputs)
    body = {
        "object": "list",
        "data": data,
        "model": model,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }
    return orjson.dumps(body), tokens
