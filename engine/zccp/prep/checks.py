"""What a request may ask of the backend serving it, checked once it is parsed (zccp.prep.flow):
a 400 naming what cannot be done, before anything is tokenized or run."""

from __future__ import annotations

from zccp.shared_types import ApiError, GenerationRequest


def check_forwardable(req: GenerationRequest) -> None:
    """What an upstream backend does not forward (a forced tool call and JSON output are
    forwarded as the upstream's tool_choice and response_format)."""
    if req.sampling.logprobs is not None:
        raise ApiError(400, "invalid_request_error", f"logprobs are not forwarded to {req.model}'s upstream",
                       param="logprobs")
    if req.n > 1:
        raise ApiError(400, "invalid_request_error", f"n > 1 is not forwarded to {req.model}'s upstream",
                       param="n")
    s = req.sampling
    for name, used in (("ignore_eos", s.ignore_eos), ("min_tokens", s.min_tokens), ("min_p", s.min_p),
                       ("repetition_penalty", s.repetition_penalty != 1.0), ("stop_token_ids", s.stop_token_ids)):
        if used:   # vLLM's extensions: an upstream API has no such field
            raise ApiError(400, "invalid_request_error", f"{name} is not forwarded to {req.model}'s upstream",
                           param=name)
    if len(req.prompts) > 1 or any(not isinstance(p, str) for p in req.prompts):
        raise ApiError(400, "invalid_request_error", f"several prompts, or token ids, are not forwarded to "
                       f"{req.model}'s upstream", param="prompt")


def check_needs_logits(req: GenerationRequest, has_logits: bool, tool_parser: str) -> None:
    """A grammar and logprobs need logits, and a forced tool call the parser that reads it."""
    c = req.sampling.constraint
    what = "logprobs" if c is None else "a forced tool call" if c.kind == "tool_call" else "structured output"
    if not has_logits:
        raise ApiError(400, "invalid_request_error",
                       f"{what} needs a model with logits; {req.model} has none (model.backend: null)")
    if c is not None and c.kind == "tool_call" and tool_parser != "hermes":
        raise ApiError(400, "invalid_request_error",
                       f"{what} needs model.tool_parser: hermes", param="tool_choice")
