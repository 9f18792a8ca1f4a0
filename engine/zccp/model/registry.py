"""Build a model backend from a kind name and options (from config / the command line)."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable
from typing import Any

from zccp.config import ModelConfig
from zccp.model.base import ModelBackend


def _build_tiny(**options: Any) -> ModelBackend:
    from zccp.model.tiny import TinyConfig, TinyTransformer

    fields = {f.name for f in dataclasses.fields(TinyConfig)}
    unknown = sorted(set(options) - fields)
    if unknown:
        raise ValueError(
            f"unknown option(s) for backend 'tiny': {', '.join(unknown)} "
            f"(known: {', '.join(sorted(fields))})"
        )
    return TinyTransformer(TinyConfig(**options))


_NULL_OPTIONS = frozenset({"reply", "name", "max_context", "token_delay_ms", "fail_after"})


def _build_null(**options: Any) -> ModelBackend:
    from zccp.model.null import NullBackend

    known = _NULL_OPTIONS
    unknown = sorted(set(options) - known)
    if unknown:
        raise ValueError(
            f"unknown option(s) for backend 'null': {', '.join(unknown)} "
            f"(known: {', '.join(sorted(known))})"
        )
    return NullBackend(**options)


_HF_OPTIONS = frozenset({"path", "name", "dtype", "max_context", "prefill_chunk", "device"})


def _build_hf(**options: Any) -> ModelBackend:
    # transformers is imported only here: the default stack does not need it (extra "hf").
    try:
        from zccp.model.hf import HfBackend
    except ImportError as exc:
        raise ValueError(f"model.backend 'hf' needs transformers: pip install -e '.[hf]' ({exc})") from None
    unknown = sorted(set(options) - _HF_OPTIONS)
    if unknown:
        raise ValueError(f"unknown option(s) for backend 'hf': {', '.join(unknown)}")
    return HfBackend(**options)


def _build_upstream(**options: Any) -> ModelBackend:
    from zccp.upstream.backend import UpstreamBackend

    return UpstreamBackend(**options)


# kind -> factory(**options); a backend's module (torch, transformers) is imported
# lazily inside its factory.
_BUILDERS: dict[str, Callable[..., ModelBackend]] = {
    "tiny": _build_tiny,
    "null": _build_null,
    "hf": _build_hf,
    "upstream": _build_upstream,   # the upstream: section configures the forwarding (zccp.upstream)
}


def _tiny_options() -> frozenset[str]:
    from zccp.model.tiny import TinyConfig

    return frozenset(f.name for f in dataclasses.fields(TinyConfig))


# kind -> the option names its factory takes (read from config.yaml's model section).
_OPTIONS: dict[str, Callable[[], frozenset[str]]] = {
    "tiny": _tiny_options, "null": lambda: _NULL_OPTIONS, "hf": lambda: _HF_OPTIONS,
    "upstream": lambda: frozenset({"name"})}


def register_backend(kind: str, factory: Callable[..., ModelBackend], options: frozenset[str] = frozenset()) -> None:
    _BUILDERS[kind] = factory
    _OPTIONS[kind] = lambda: options


def backend_from_config(m: ModelConfig, device: str | None = None) -> ModelBackend:
    """The backend `model.backend` names, built from config.yaml's model section: each
    option takes the model.<option> value, or model.<kind>_<option> (model.null_reply is
    the null backend's `reply`); nothing is mapped by hand. `device` (the gpu section's
    choice) reaches backends that take a `device` option, so they load onto it."""
    names = _OPTIONS.get(m.backend, frozenset)()
    values = {f.name: getattr(m, f.name) for f in dataclasses.fields(m)}
    prefix = m.backend + "_"
    options = {k: v for k, v in values.items() if k in names}
    options.update({k[len(prefix):]: v for k, v in values.items() if k.startswith(prefix) and k[len(prefix):] in names})
    if device is not None and "device" in names:
        options["device"] = device
    return build_backend(m.backend, **options)


_MODULES = {"tiny": "zccp.model.tiny", "null": "zccp.model.null", "hf": "zccp.model.hf",
            "upstream": "zccp.upstream.backend"}


def preload_backend(kind: str) -> None:
    """Import the module of backend `kind` now (a standby engine's preparation); a missing
    one is the start's error to report, not this."""
    import importlib

    with contextlib.suppress(ImportError, KeyError):
        importlib.import_module(_MODULES[kind])


# The backends that compute nothing with torch (ModelBackend.uses_torch false): an engine
# serving one never imports it (its start is ~2 s shorter). Any other kind, registered ones
# included, is given torch's thread count and tensor views.
_TORCH_FREE = frozenset({"null", "upstream"})


def backend_uses_torch(kind: str) -> bool:
    return kind not in _TORCH_FREE


def available_kinds() -> tuple[str, ...]:
    return tuple(sorted(_BUILDERS))


def build_backend(kind: str, **options: Any) -> ModelBackend:
    """Construct the backend `kind` ("tiny", "null" or "hf") with keyword options.

    tiny: any TinyConfig field (name, d_model, n_layers, n_heads, d_ff, max_context,
    seed, prefill_chunk, tie_embeddings, eos_bias, device).
    null: reply, name, max_context, token_delay_ms, fail_after.
    hf: path, name, dtype, max_context, prefill_chunk, device.
    """
    try:
        factory = _BUILDERS[kind]
    except KeyError:
        raise ValueError(
            f"unknown model backend kind {kind!r} (available: {', '.join(available_kinds())})"
        ) from None
    return factory(**options)
