import torch

from zccp.serving.text_assembly import generate_text
from zccp.model.prompt import BYTE_FORMAT
from zccp.model.null import DEFAULT_REPLY, NullBackend
from zccp.model.tiny import TinyTransformer
from zccp.model.tokenizer import encode_chat
from zccp.shared_types import ChatMessage, GenerationResult, SamplingParams, TextDelta

PROMPT = torch.zeros(7, dtype=torch.int32)


class FakeBackend:
    """Yields the given byte ids, then ends (like EOS): what generate_text() needs of a backend."""

    name = "fake"
    max_context = 1000
    prompt = BYTE_FORMAT

    def __init__(self, ids):
        self.ids = list(ids)
        self.pulled = 0
        self.closed = False

    def generate(self, input_ids, params, cancelled):
        try:
            for t in self.ids:
                self.pulled += 1
                yield t
        finally:
            self.closed = True


def collect(backend, max_tokens=100, stop=(), cancelled=lambda: False):
    items = list(generate_text(backend, PROMPT, SamplingParams(max_tokens=max_tokens, stop=tuple(stop)), cancelled))
    deltas = [i.text for i in items if isinstance(i, TextDelta)]
    results = [i for i in items if isinstance(i, GenerationResult)]
    return deltas, results


def result_of(backend, **kw):
    deltas, results = collect(backend, **kw)
    assert len(results) == 1
    r = results[0]
    assert "".join(deltas) == r.text
    assert all(deltas)
    return deltas, r


def test_plain_end_turn():
    deltas, r = result_of(FakeBackend(b"hello"))
    assert deltas == list("hello")
    assert (r.text, r.stop_reason, r.stop_sequence, r.input_tokens, r.output_tokens) == ("hello", "end_turn", None, 7,
                                                                                         5)


def test_max_tokens_stops_pulling():
    b = FakeBackend(b"hello world")
    _, r = result_of(b, max_tokens=4)
    assert (r.text, r.stop_reason, r.output_tokens) == ("hell", "max_tokens", 4)
    assert b.pulled == 4 and b.closed


def test_exhausted_exactly_at_max_tokens_is_max_tokens():
    _, r = result_of(FakeBackend(b"abc"), max_tokens=3)
    assert r.stop_reason == "max_tokens"


def test_utf8_split_never_emitted_half():
    text = "aé€𝄞b"
    deltas, r = result_of(FakeBackend(text.encode()))
    assert deltas == ["a", "é", "€", "𝄞", "b"]
    assert r.text == text and r.output_tokens == len(text.encode())


def test_invalid_bytes_become_replacement():
    deltas, r = result_of(FakeBackend([0x61, 0xFF, 0x62, 0xE2, 0x82]))
    assert r.text == "a\ufffdb\ufffd"
    assert r.stop_reason == "end_turn"


def test_special_ids_produce_no_text_but_count():
    _, r = result_of(FakeBackend([0x68, 256, 0x69]))
    assert r.text == "hi" and r.output_tokens == 3


def test_stop_sequence_split_across_tokens():
    b = FakeBackend(b"Hello END world")
    deltas, r = result_of(b, stop=["END"])
    assert r.text == "Hello "
    assert (r.stop_reason, r.stop_sequence) == ("stop_sequence", "END")
    assert r.output_tokens == len(b"Hello END")
    assert b.closed
    assert "E" not in "".join(deltas)


def test_earliest_stop_wins():
    _, r = result_of(FakeBackend(b"xx BB AA"), stop=["AA", "BB"])
    assert (r.text, r.stop_sequence) == ("xx ", "BB")
    _, r = result_of(FakeBackend(b"xabcd"), stop=["abcd", "bc"])
    assert (r.text, r.stop_sequence) == ("xa", "bc")


def test_held_back_then_released_when_not_a_stop():
    deltas, r = result_of(FakeBackend(b"aENx"), stop=["END"])
    assert r.text == "aENx" and r.stop_reason == "end_turn"
    assert deltas == ["a", "ENx"]


def test_held_back_text_released_at_end():
    deltas, r = result_of(FakeBackend(b"abcEN"), stop=["END"])
    assert r.text == "abcEN" and r.stop_reason == "end_turn"
    assert deltas[-1] == "EN"
    deltas, r = result_of(FakeBackend(b"abcEN"), stop=["END"], max_tokens=5)
    assert r.text == "abcEN" and r.stop_reason == "max_tokens"


def test_overlapping_prefix_hold():
    _, r = result_of(FakeBackend(b"aaab"), stop=["aab"])
    assert (r.text, r.stop_sequence) == ("a", "aab")


def test_multibyte_stop_sequence():
    _, r = result_of(FakeBackend("x€y".encode()), stop=["€"])
    assert (r.text, r.stop_reason) == ("x", "stop_sequence")


def test_stop_at_first_token_and_empty_stop_ignored():
    deltas, r = result_of(FakeBackend(b"Zrest"), stop=["", "Z"])
    assert deltas == [] and r.text == "" and r.stop_sequence == "Z"


def test_cancel_stops_promptly_without_result():
    b = FakeBackend(b"abcdefghij" * 10)
    state = {"n": 0}
    it = generate_text(b, PROMPT, SamplingParams(max_tokens=100), lambda: state["n"] >= 3)
    items = []
    for item in it:
        items.append(item)
        state["n"] += 1
    assert [i.text for i in items] == ["a", "b", "c"]
    assert b.pulled == 3 and b.closed


def test_null_backend_through_loop():
    _, r = result_of(NullBackend(), max_tokens=1000)
    assert (r.text, r.stop_reason, r.output_tokens) == (DEFAULT_REPLY, "end_turn", len(DEFAULT_REPLY))
    _, r = result_of(NullBackend(), max_tokens=5)
    assert (r.text, r.stop_reason) == (DEFAULT_REPLY[:5], "max_tokens")


def test_tiny_through_loop():
    m = TinyTransformer()
    ids = encode_chat("", [ChatMessage("user", "Hello")])
    items = list(generate_text(m, ids, SamplingParams(max_tokens=20, temperature=0), lambda: False))
    r = items[-1]
    assert isinstance(r, GenerationResult)
    assert r.input_tokens == len(ids) and 1 <= r.output_tokens <= 20
    assert "".join(i.text for i in items[:-1]) == r.text
    assert r.text.encode() == bytes(m.generate(ids, SamplingParams(max_tokens=20, temperature=0), lambda: False))


class _TokenByToken(NullBackend):
    """The null backend without its whole-answer shortcut: the token loop's reference."""

    def fixed_reply(self, params):
        return None


def test_a_fixed_reply_gives_what_the_token_loop_gives():
    reply = "héllo wörld, 中文 ok"          # multi-byte characters, cut by small max_tokens
    for max_tokens in (1, 2, 3, 7, len(reply.encode()) - 1, len(reply.encode()), len(reply.encode()) + 5):
        p = SamplingParams(max_tokens=max_tokens)
        fast = list(generate_text(NullBackend(reply=reply), PROMPT, p, lambda: False))
        slow = list(generate_text(_TokenByToken(reply=reply), PROMPT, p, lambda: False))
        assert fast[-1] == slow[-1], max_tokens
        assert "".join(e.text for e in fast[:-1]) == "".join(e.text for e in slow[:-1])


def test_stops_tools_and_delays_take_the_token_loop():
    b = NullBackend(reply="abc STOP def")
    assert b.fixed_reply(SamplingParams(max_tokens=50)) is not None
    _, r = result_of(b, max_tokens=50, stop=["STOP"])
    assert r.stop_sequence == "STOP" and r.text == "abc "
    assert NullBackend(token_delay_ms=1).fixed_reply(SamplingParams(max_tokens=5)) is None
    assert NullBackend(fail_after=2).fixed_reply(SamplingParams(max_tokens=5)) is None


# --------------------------------------------------------------------------- logit_bias and penalties


def _draws(params, logits, n):
    from zccp.model.sampling import Sampler, sample_rows

    s = Sampler(params, torch.device("cpu"))
    return [sample_rows(logits.unsqueeze(0), [s])[0] for _ in range(n)]


def test_logit_bias_forces_and_bans_tokens():
    from zccp.shared_types import SamplingParams

    logits = torch.zeros(50)
    logits[3] = 5.0
    assert set(_draws(SamplingParams(8, temperature=1.0, seed=1, logit_bias=((7, 100.0),)), logits, 20)) == {7}
    assert 3 not in _draws(SamplingParams(8, temperature=0.0, logit_bias=((3, -100.0),)), logits, 5)
    # an id outside the vocabulary is ignored, not an error
    assert _draws(SamplingParams(8, temperature=0.0, logit_bias=((999, 100.0),)), logits, 2) == [3, 3]


def test_frequency_and_presence_penalties_follow_openai():
    from zccp.shared_types import SamplingParams

    logits = torch.zeros(50)
    logits[3], logits[4] = 2.0, 1.5
    assert _draws(SamplingParams(8, temperature=0.0), logits, 4) == [3, 3, 3, 3]
    # presence: 3 loses 1.0 once it appeared (1.0 < 1.5): then 4, which loses 1.0 too (0.5 < 1.0): 3 again
    assert _draws(SamplingParams(8, temperature=0.0, presence_penalty=1.0), logits, 3) == [3, 4, 3]
    # frequency: each use costs 0.4: 3 (2.0), 3 (1.6), 4 (1.5 > 1.2), 3 (1.2 > 1.1), ...
    assert _draws(SamplingParams(8, temperature=0.0, frequency_penalty=0.4), logits, 4) == [3, 3, 4, 3]


def test_repetition_penalty_is_vllms():
    """A token seen in the prompt or the output: a positive logit divided by the penalty, a
    negative one multiplied by it; the others untouched."""
    from zccp.model.sampling import Sampler

    s = Sampler(SamplingParams(max_tokens=4, temperature=0, repetition_penalty=2.0), torch.device("cpu"),
                prompt=torch.tensor([0, 1]))
    assert not s.plain and s.extra is not None
    logits = torch.tensor([2.0, -2.0, 1.5, 0.5])
    assert s.extra.adjust(logits).tolist() == [1.0, -4.0, 1.5, 0.5]
    assert s(logits) == 2                       # the prompt's id 0 fell below it
    assert s.extra.adjust(logits).tolist() == [1.0, -4.0, 0.75, 0.5]   # id 2 drawn: seen now


def test_ignore_eos_and_min_tokens_mask_eos():
    from zccp.model.sampling import Sampler

    eos = frozenset({3})
    logits = torch.tensor([0.0, 0.0, 0.0, 9.0])
    assert Sampler(SamplingParams(max_tokens=4, temperature=0), torch.device("cpu"), eos=eos).extra is None
    s = Sampler(SamplingParams(max_tokens=4, temperature=0, ignore_eos=True), torch.device("cpu"), eos=eos)
    assert [s(logits) for _ in range(3)] == [0, 0, 0]
    s = Sampler(SamplingParams(max_tokens=4, temperature=0, min_tokens=2, stop_token_ids=(1,)),
                torch.device("cpu"), eos=eos)
    held = torch.tensor([0.0, 5.0, 0.0, 9.0])
    assert [s(held) for _ in range(3)] == [0, 0, 3]
