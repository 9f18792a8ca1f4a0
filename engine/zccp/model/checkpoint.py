"""What an hf checkpoint directory must hold, checked without loading anything. The
engine runs it at start-up (check_model_files: `zccp-engine --check` names a
missing file); nginx's host is not asked, it need not see the model."""

from __future__ import annotations

import json
from pathlib import Path

from zccp.config import Config, ConfigError

_REQUIRED = ("config.json", "tokenizer.json", "tokenizer_config.json")


def checkpoint_problems(path: str) -> list[str]:
    """What keeps `path` from loading as an hf checkpoint (nothing is imported or read
    beyond tokenizer_config.json)."""
    p = Path(path)
    if not p.is_dir():
        return [f"{path}: no such directory"]
    problems = [f"{p / name}: missing" for name in _REQUIRED if not (p / name).is_file()]
    if not any(p.glob("*.safetensors")):
        problems.append(f"{p}/*.safetensors: no weights (only safetensors checkpoints are loaded)")
    if (p / "tokenizer_config.json").is_file() and not (p / "chat_template.jinja").is_file():
        try:
            has = "chat_template" in json.loads((p / "tokenizer_config.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            has = False
        if not has and not (p / "chat_template.json").is_file():
            problems.append(f"{p}: no chat template (tokenizer_config.json 'chat_template' or chat_template.jinja)")
    return problems


def check_model_files(cfg: Config) -> None:
    """The engine's own start-up check (not nginx's: its host need not see the model):
    the hf checkpoint directory holds what loading needs, else a ConfigError naming it."""
    if cfg.model.backend != "hf" or cfg.model.path is None:
        return
    problems = checkpoint_problems(cfg.model.path)
    if problems:
        raise ConfigError(f"{cfg.path}: model.path: " + "; ".join(problems))
