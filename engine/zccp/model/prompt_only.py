"""A model backend's prompt side without its weights: what a prep process of a tiny or hf
engine needs to parse and tokenize a request into its slot (zccp.process.handoff). The
model's limits are rank 0's (ModelFacts: max_context after the KV budget shrank it), the
prompt format is the backend's own: the byte format for tiny, the checkpoint's chat
template and fast tokenizer for hf (loaded without the model)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

from zccp.config import ModelConfig
from zccp.model.prompt import BYTE_FORMAT, PromptFormat

if TYPE_CHECKING:
    from zccp.process.handoff import ModelFacts


@dataclass
class PromptOnlyBackend:
    """prepare()'s view of the model (zccp.prep.prepare): nothing here runs it."""

    name: str
    max_context: int
    vocab_size: int
    has_logits: bool
    prompt: PromptFormat


def prompt_format(m: ModelConfig) -> PromptFormat:
    """The prompt format the backend model.backend names would build."""
    if m.backend == "hf":
        if m.path is None:
            raise ValueError("model.path: required for the hf backend")
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
        from transformers import AutoTokenizer

        from zccp.model.hf_prompt import HfChatFormat

        return HfChatFormat(AutoTokenizer.from_pretrained(m.path, local_files_only=True), m.name)
    return BYTE_FORMAT


def prompt_only(m: ModelConfig, facts: ModelFacts) -> PromptOnlyBackend:
    return PromptOnlyBackend(facts.name, facts.max_context, facts.vocab_size, facts.has_logits, prompt_format(m))
