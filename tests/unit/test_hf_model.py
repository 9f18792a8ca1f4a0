"""The hf backend on a checkpoint made on the fly: batched decoding equals decoding alone,
chunked prefill equals one pass, prefix reuse changes no token, the detokenizer never
splits a character, and a missing file is named at start-up."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch
import yaml

from zccp.config import ConfigError, parse_config
from zccp.observe.metrics import EngineMetrics
from zccp.model.hf import HfBackend
from zccp.serving.planner import Planner
from zccp.serving.prefix_cache import PrefixCache
from zccp.shared_types import SamplingParams
from zccp.serving.scheduler import BatchLimits, BatchScheduler, Sequence


@pytest.fixture(scope="module")
def hf(hf_checkpoint):
    return HfBackend(str(hf_checkpoint), "zccp-hf-test", prefill_chunk=0)


def chat_ids(hf, text: str, system: str = "") -> torch.Tensor:
    msgs = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": text}]
    ids = hf.prompt._tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True, return_dict=False)
    return torch.tensor(ids, dtype=torch.int32)


def solo_logits(hf, ids, steps):
    state = hf.new_state()
    logits = hf.prefill_chunked(state, hf.check_prompt(ids), 0)
    batch = hf.new_batch()
    batch.join(state)
    out = [logits]
    for _ in range(steps):
        logits = batch.decode([int(logits.argmax())])[0]
        out.append(logits)
    return out


@torch.inference_mode()
def test_batched_decode_equals_decoding_alone(hf):
    prompts = [chat_ids(hf, t) for t in ("Hello world", "def add(a, b):\n    return a + b\n" * 3,
                                         "日本語のテキスト", '{"name": "get_weather"}', "Emoji 😀")]
    refs = [solo_logits(hf, p, 24) for p in prompts]
    batch, rows, last, step = hf.new_batch(), [], {}, {}
    joins = {0: [0, 1], 3: [2], 5: [3], 7: [4]}
    worst, flips, checked = 0.0, 0, 0
    for s in range(20):
        for r in joins.get(s, []):
            state = hf.new_state()
            logits = hf.prefill_chunked(state, hf.check_prompt(prompts[r]), 0)
            batch.join(state)
            rows.append(r)
            last[r], step[r] = int(logits.argmax()), 0
        if s == 6:                                   # row of prompt 1 leaves
            i = rows.index(1)
            batch.leave([j for j in range(len(rows)) if j != i])
            rows.pop(i)
        if s == 9:                                   # prompt 0 is parked and joins again
            i = rows.index(0)
            parked = batch.park(i)
            batch.leave([j for j in range(len(rows)) if j != i])
            rows.pop(i)
            batch.join(parked)
            rows.append(0)
        logits = batch.decode([last[r] for r in rows])
        for i, r in enumerate(rows):
            step[r] += 1
            ref = refs[r][step[r]]
            worst = max(worst, float((logits[i] - ref).abs().max()))
            flips += int(logits[i].argmax()) != int(ref.argmax())
            checked += 1
            last[r] = int(logits[i].argmax())
    assert checked > 60 and flips == 0
    assert worst < 1e-3                              # float noise from other shapes, nothing more


def test_chunked_prefill_equals_one_pass(hf):
    ids = chat_ids(hf, "Shared memory slots carry the request body. " * 8)
    single = hf.prefill_logits(ids)
    for chunk in (7, 16, 64):
        chunked = hf.prefill_logits(ids, chunk)
        assert int(chunked.argmax()) == int(single.argmax())
        assert float((chunked - single).abs().max()) < 1e-4


class _TokenSink:
    """A scheduler sink that keeps the tokens it is given and the prefix reuse it is told of."""
    blocked = False

    def __init__(self, toks: list[int] | None = None):
        self.toks: list[int] = [] if toks is None else toks
        self.cached: int | None = None

    def start(self, cached, plan):
        self.cached = cached

    def kept(self, n):
        pass

    def token(self, t):
        self.toks.append(t)
        return False

    def end(self, reason, n):
        return n

    def flush(self):
        return True

    def fail(self):
        raise AssertionError("failed")

    def abandoned(self, exc):
        raise AssertionError("abandoned")


def _generate(hf, prompts, prefix):
    sched = BatchScheduler(hf, BatchLimits(8, 8, 256 << 20), Planner(torch.device("cpu"), 256 << 20, 1, 32, 16),
                           prefix, EngineMetrics())
    out: dict[int, list[int]] = {}
    reused: dict[int, int] = {}
    try:
        for i, p in enumerate(prompts):          # one after the other: each can reuse the one before
            done = threading.Event()
            sink = _TokenSink()
            sched.submit(Sequence(p, p.numpy(), SamplingParams(max_tokens=24, temperature=0), sink, lambda: False,
                                  lambda v, done=done: done.set()))
            assert done.wait(60)
            out[i], reused[i] = sink.toks, sink.cached
    finally:
        sched.stop()
    return out, reused


def test_prefix_reuse_gives_token_identical_greedy_output(hf):
    system = "You are a careful assistant for the shared memory pipeline. " * 10
    prompts = [chat_ids(hf, q, system) for q in ("First question", "First question", "Another one entirely")]
    with_cache, reused = _generate(hf, prompts, PrefixCache(64 << 20, 16, hf.identity))
    without, none = _generate(hf, prompts, None)
    assert reused[0] == 0 and reused[1] >= 100 and reused[2] >= 100 and set(none.values()) == {0}
    assert with_cache == without


PREFILL_TEXTS = ("Hello world", "def add(a, b):\n    return a + b\n" * 3, "x", "日本語のテキスト",
                 '{"name": "get_weather", "arguments": {"city": "Paris"}}', "Emoji 😀 " * 5)


@torch.inference_mode()
def test_batched_prefill_equals_each_alone(hf):
    """Ragged chunks of several sequences in one forward, some on top of a past (a prefilled
    first chunk): each row's logits, and its KV (the next token's logits), are its own."""
    prompts = [hf.check_prompt(chat_ids(hf, t)) for t in PREFILL_TEXTS]
    alone, states = [], []
    for p in prompts:
        state = hf.new_state()
        alone.append(hf.prefill(state, p))
        states.append(state)
    # distinct rows: a swap or a row seeing another's tokens could not pass below
    assert min(float((a - b).abs().max()) for i, a in enumerate(alone) for b in alone[i + 1:]) > 1e-2
    for past in (0, 16):
        batched = [hf.new_state() for _ in prompts]
        for state, p in zip(batched[::2], prompts[::2], strict=False):       # every other row has a past
            hf.prefill(state, p[:past]) if past else None
        starts = [past if i % 2 == 0 else 0 for i in range(len(prompts))]
        outs = hf.prefill_many(batched, [p[s:] for p, s in zip(prompts, starts, strict=True)])
        assert [hf.state_length(s) for s in batched] == [p.numel() for p in prompts]
        for out, ref in zip(outs, alone, strict=True):
            assert int(out.argmax()) == int(ref.argmax())
            assert float((out - ref).abs().max()) < 1e-4
        for mine, ref_state, ref in zip(batched, states, alone, strict=True):   # the KV each row kept
            nxt = torch.tensor([int(ref.argmax())])
            assert float((hf.prefill(mine, nxt) - hf.prefill(hf.state_from_layers(
                [(lay.keys, lay.values) for lay in ref_state.layers]), nxt)).abs().max()) < 1e-4


def test_scheduler_prefills_arrivals_together_with_the_answers_of_each_alone(hf, monkeypatch):
    """Prompts that arrive together are prefilled in one forward (some on top of reused
    prefix blocks, some from nothing), and every greedy answer is the one it gets alone."""
    system = "You are a careful assistant for the shared memory pipeline. " * 4
    prompts = [chat_ids(hf, t, system if i % 2 else "") for i, t in enumerate(PREFILL_TEXTS)]
    expected = [list(hf.generate(p, SamplingParams(max_tokens=12, temperature=0), lambda: False)) for p in prompts]
    rows: list[int] = []
    real = hf.prefill_many
    pasts: set[int] = set()

    def prefill_many(states, chunks):
        rows.append(len(states))
        if len(states) > 1:
            pasts.update(hf.state_length(s) for s in states)
        return real(states, chunks)

    monkeypatch.setattr(hf, "prefill_many", prefill_many)
    prefix = PrefixCache(64 << 20, 16, hf.identity)
    sched = BatchScheduler(hf, BatchLimits(8, 8, 256 << 20), Planner(torch.device("cpu"), 256 << 20, 1, 256, 16),
                           prefix, EngineMetrics())
    gate = threading.Event()           # holds the model thread until every prompt is queued
    tokens: list[list[int]] = [[] for _ in prompts]
    done = threading.Semaphore(0)

    try:
        first = chat_ids(hf, "warm the prefix", system)      # alone: the odd rows reuse its system blocks
        sched.submit(Sequence(first, first.numpy(), SamplingParams(max_tokens=2, temperature=0), _TokenSink(),
                              lambda: False, lambda v: done.release()))
        assert done.acquire(timeout=60)
        for p, toks in zip(prompts, tokens, strict=True):
            sched.submit(Sequence(p, p.numpy(), SamplingParams(max_tokens=12, temperature=0), _TokenSink(toks),
                                  lambda: not gate.wait(60), lambda v: done.release()))
        gate.set()
        for _ in prompts:
            assert done.acquire(timeout=60)
    finally:
        sched.stop()
    assert tokens == expected
    assert max(rows) >= 3 and len(rows) < len(prompts) + 2   # together: fewer forwards than prompts
    assert {0, 128} <= pasts                                  # rows on reused blocks beside new ones


class TestDetokenizer:
    TEXTS = ["Emoji test 😀🎉👍🏽 done", "日本語のテキストです。中文文本，你好世界。", "Ελληνικά русский 𝄞 ∑"]

    def test_characters_are_never_split(self, hf):
        tok = hf.prompt._tok
        for text in self.TEXTS:
            ids = tok.encode(text, add_special_tokens=False)
            det = hf.prompt.detokenizer(chat_ids(hf, "hi").tolist())
            deltas = [det.step(i) for i in ids] + [det.flush()]
            assert "".join(deltas) == text
            assert not any("\ufffd" in d for d in deltas)

    def test_tool_tags_survive_other_specials_do_not(self, hf):
        tok = hf.prompt._tok
        ids = tok.encode('a<tool_call>{"name": "f"}</tool_call><|im_start|>b', add_special_tokens=False)
        det = hf.prompt.detokenizer([])
        assert "".join(det.step(i) for i in ids) + det.flush() == 'a<tool_call>{"name": "f"}</tool_call>b'

    def test_a_dangling_byte_is_flushed_as_a_replacement(self, hf):
        tok = hf.prompt._tok
        ids = tok.encode("ok 😀", add_special_tokens=False)
        det = hf.prompt.detokenizer([])
        streamed = "".join(det.step(i) for i in ids[:-1])
        assert "\ufffd" not in streamed and det.flush().endswith("\ufffd")


class TestInvalidUtf8Streams:
    """Tokens that do not form valid UTF-8 (a byte-level BPE emitting partial characters):
    a partial character is held for at most the bytes that could complete it, invalid bytes
    become U+FFFD at once, and the streamed text equals the tokenizer's own decode."""

    @staticmethod
    def byte_ids(hf) -> dict[int, int]:
        from zccp.model.hf_prompt import _byte_level_alphabet

        vocab = hf.prompt._rust.get_vocab(with_added_tokens=True)
        return {b: vocab[c] for c, b in _byte_level_alphabet().items()}

    def test_invalid_bytes_are_replaced_at_once(self, hf):
        ids = self.byte_ids(hf)
        det = hf.prompt.detokenizer([])
        assert det.step(ids[0x80]) == "\ufffd"          # a lone continuation byte: nothing to wait for
        assert det.step(ids[ord("a")]) == "a"
        assert det.step(ids[0xF0]) == ""                 # could start a 4-byte character: held
        assert det.step(ids[ord("b")]) == "\ufffdb"      # it cannot any more: replaced, not held
        assert det.flush() == ""

    def test_a_partial_character_is_held_only_until_it_completes(self, hf):
        ids = self.byte_ids(hf)
        det = hf.prompt.detokenizer([])
        assert [det.step(ids[b]) for b in "😀".encode()] == ["", "", "", "😀"]

    def test_random_ids_stream_what_a_full_decode_gives(self, hf):
        import random

        rust = hf.prompt._rust
        hidden = hf.prompt._hidden
        rng = random.Random(7)
        n = rust.get_vocab_size(with_added_tokens=True)
        for _ in range(50):
            ids = [i for i in (rng.randrange(n) for _ in range(40)) if i not in hidden]
            det = hf.prompt.detokenizer([])
            deltas = [det.step(i) for i in ids]
            assert "".join(deltas) + det.flush() == rust.decode(ids, skip_special_tokens=False)
            # nothing is held longer than a character can span (3 bytes, so at most 3 tokens)
            held = 0
            for d in deltas:
                held = 0 if d else held + 1
                assert held <= 3

    def test_other_tokenizers_hold_a_bounded_number_of_tokens(self, hf):
        from zccp.model.hf_prompt import HfDetokenizer

        ids = self.byte_ids(hf)
        det = HfDetokenizer(hf.prompt._rust, [], hf.prompt._hidden)
        seq = [ids[0xF0]] + [ids[0x80]] * 6 + [ids[ord("z")]]
        deltas = [det.step(i) for i in seq]
        assert "".join(deltas) + det.flush() == hf.prompt._rust.decode(seq)
        assert any("\ufffd" in d for d in deltas[:5])   # released before the end, not held to it


def test_hf_backend_needs_a_path():
    with pytest.raises(ConfigError, match="model.path: required"):
        parse_config({"model": {"backend": "hf"}}, "c.yaml")
    with pytest.raises(ConfigError, match="model.dtype"):
        parse_config({"model": {"backend": "hf", "path": "/x", "dtype": "int8"}}, "c.yaml")


# python -m zccp.ops.cli from this checkout, not whatever zccp the interpreter has installed.
_THIS_CHECKOUT = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2] / "engine"))


def test_a_missing_checkpoint_file_is_named(hf_checkpoint, tmp_path):
    broken = tmp_path / "ckpt"
    shutil.copytree(hf_checkpoint, broken)
    (broken / "tokenizer.json").unlink()
    cfg = tmp_path / "config.yaml"
    cfg.write_text(yaml.safe_dump({"model": {"backend": "hf", "path": str(broken)}}))
    r = subprocess.run([sys.executable, "-m", "zccp.ops.cli", "engine", "--config", str(cfg), "--check"],
                       capture_output=True, text=True, env=_THIS_CHECKOUT)
    assert r.returncode == 2
    assert "model.path" in r.stderr and str(broken / "tokenizer.json") in r.stderr
    with pytest.raises(ValueError, match="tokenizer.json: missing"):
        HfBackend(str(broken), "x")
    ok = tmp_path / "ok.yaml"
    ok.write_text(yaml.safe_dump({"model": {"backend": "hf", "path": str(hf_checkpoint)}}))
    r = subprocess.run([sys.executable, "-m", "zccp.ops.cli", "engine", "--config", str(ok), "--check"],
                       capture_output=True, text=True, env=_THIS_CHECKOUT)
    assert r.returncode == 0, r.stderr


def test_dtype_is_applied(hf_checkpoint):
    b = HfBackend(str(hf_checkpoint), "x", dtype="bfloat16")
    assert b.dtype == torch.bfloat16 and b.kv_bytes_per_token == hf_kv_bytes(hf_checkpoint) // 2


def hf_kv_bytes(path) -> int:
    return HfBackend(str(path), "x", dtype="float32").kv_bytes_per_token
