"""The verdict is a pure function of every rank's header view: table tests with named rows."""

import copy
import math
import pickle

import pytest
import torch

from distinit.broadcast import _header
from distinit.broadcast._dtypes import dtype_code
from distinit.broadcast._header import OP_OBJECT, OP_STATE_DICT, OP_TENSOR, View, fixed_words
from distinit.broadcast._mismatch import NOT_A_TENSOR, SRC_PASSED_NONE, agreed, judge, ranks_phrase
from distinit.errors import BroadcastMismatchError

F32, I32 = dtype_code(torch.float32), dtype_code(torch.int32)
CPU, META = 1, 3


def view(**kw: object) -> View:
    base: dict[str, object] = {"seq": 12, "op": OP_TENSOR, "src": 0}
    base.update(kw)
    return View.from_words(fixed_words(**base))  # type: ignore[arg-type]


def sender(shape: tuple[int, ...] = (2, 3), dtype: int = F32, **kw: object) -> View:
    nbytes = math.prod(shape) * (4 if dtype in (F32, I32) else 8)
    return view(has_buffer=True, dtype=dtype, device=CPU, shape=shape, nbytes=nbytes, **kw)


def buffer(shape: tuple[int, ...] = (2, 3), dtype: int = F32, device: int = CPU, **kw: object) -> View:
    return view(has_buffer=True, dtype=dtype, device=device, shape=shape, **kw)


ROWS = [
    pytest.param([sender(), buffer(), view()], None, (), id="ok-buffer-and-none"),
    pytest.param([sender(), buffer((3, 2))], "shape", (1,), id="same-numel-shape"),
    pytest.param([sender((6,)), buffer((4,))], "shape", (1,), id="smaller-receiver"),
    pytest.param([sender((4,)), buffer((6,))], "shape", (1,), id="larger-receiver"),
    pytest.param([sender(), buffer(dtype=I32)], "dtype", (1,), id="dtype-same-itemsize"),
    pytest.param([sender(), buffer(device=META)], "device", (1,), id="device-type"),
    pytest.param([sender(), buffer(src=1), buffer()], "src", (1,), id="src-disagreement"),
    pytest.param([sender(src=5), buffer(src=5)], "src", (0, 1), id="src-outside-group"),
    pytest.param([sender(), buffer(seq=13)], "sequence", (1,), id="skipped-call"),
    pytest.param([sender(), buffer(op=OP_OBJECT), buffer()], "call", (1,), id="other-call"),
    pytest.param([view(status=SRC_PASSED_NONE), view()], "argument", (0,), id="src-passed-none"),
    pytest.param([sender(), view(status=NOT_A_TENSOR)], "argument", (1,), id="receiver-not-a-tensor"),
]


@pytest.mark.parametrize(("views", "field", "ranks"), ROWS)
def test_judge_tensor(views: list[View], field: str | None, ranks: tuple[int, ...]) -> None:
    verdict = judge(views, my_op=OP_TENSOR, seq=12)
    if field is None:
        assert verdict is None
        return
    assert verdict is not None
    assert verdict.field == field
    assert verdict.ranks == ranks


OTHER_OPS = [
    pytest.param([view(op=OP_OBJECT, fingerprint=7)] * 3, OP_OBJECT, None, id="object-ok"),
    pytest.param([view(op=OP_OBJECT, fingerprint=7), view(op=OP_OBJECT, fingerprint=8)], OP_OBJECT, "schema",
                 id="object-schema"),
    pytest.param([view(op=OP_STATE_DICT, has_buffer=True, fingerprint=1), view(op=OP_STATE_DICT, fingerprint=0)],
                 OP_STATE_DICT, None, id="state-dict-receiver-without-one"),
    pytest.param([view(op=OP_STATE_DICT, has_buffer=True, fingerprint=1),
                  view(op=OP_STATE_DICT, has_buffer=True, fingerprint=2)], OP_STATE_DICT, "keys", id="state-dict-keys"),
]  # fmt: skip


@pytest.mark.parametrize(("views", "field", "ranks"), ROWS)
def test_fast_path_agrees_with_the_full_verdict(views: list[View], field: str | None, ranks: tuple[int, ...]) -> None:
    # `agreed` lets the happy path skip the full verdict: it must never pass a call the verdict would stop.
    assert agreed(views, OP_TENSOR) == (field is None)


@pytest.mark.parametrize(("views", "op", "field"), OTHER_OPS)
def test_fast_path_agrees_for_objects_and_state_dicts(views: list[View], op: int, field: str | None) -> None:
    assert agreed(views, op) == (field is None)
    verdict = judge(views, my_op=op, seq=12)
    assert (verdict.field if verdict is not None else None) == field


def test_fast_path_rejects_garbage() -> None:
    garbage = View.from_words([7] * _header.FIXED_WORDS)
    assert not agreed([sender(), garbage], OP_TENSOR)
    assert not agreed([garbage, garbage], OP_TENSOR)


def test_protocol_garbage_is_a_verdict_not_a_crash() -> None:
    words = fixed_words(seq=1, op=OP_TENSOR, src=0)
    garbage = View.from_words([7] * _header.FIXED_WORDS)
    verdict = judge([View.from_words(words), garbage], my_op=OP_TENSOR, seq=1)
    assert verdict is not None
    assert verdict.field == "protocol"
    assert verdict.ranks == (1,)


def test_same_numel_message_says_what_why_and_fix() -> None:
    views = [sender((1024, 768)), view(), buffer((768, 1024)), buffer((768, 1024))]
    error = judge(views, my_op=OP_TENSOR, seq=12).error()  # type: ignore[union-attr]
    text = str(error)
    assert text.startswith("broadcast_tensor call #12 (src=0, 4 ranks) disagrees on shape:")
    assert "rank 0 sends float32[1024, 768]" in text
    assert "ranks 2 and 3 passed a buffer of float32[768, 1024]" in text
    assert "silently" in error.why
    assert "torch.empty(1024, 768) on ranks 2 and 3" in error.fix
    assert (error.call, error.seq, error.field, error.src, error.ranks) == ("broadcast_tensor", 12, "shape", 0, (2, 3))


def test_smaller_receiver_mentions_sigabrt() -> None:
    error = judge([sender((6,)), buffer((4,))], my_op=OP_TENSOR, seq=1).error()  # type: ignore[union-attr]
    assert "SIGABRT" in error.why


def test_src_message_explains_group_local_src() -> None:
    error = judge([sender(), buffer(src=1)], my_op=OP_TENSOR, seq=3).error()  # type: ignore[union-attr]
    assert "rank 1 gave src=1" in str(error)
    assert "not the global rank" in error.fix


def test_object_schema_mismatch() -> None:
    views = [view(op=OP_OBJECT, fingerprint=111), view(op=OP_OBJECT, fingerprint=222)]
    verdict = judge(views, my_op=OP_OBJECT, seq=1)
    assert verdict is not None
    assert verdict.field == "schema"
    assert verdict.ranks == (1,)


def test_state_dict_fingerprints_only_checked_for_ranks_with_a_state_dict() -> None:
    views = [
        view(op=OP_STATE_DICT, has_buffer=True, fingerprint=1),
        view(op=OP_STATE_DICT, has_buffer=False, fingerprint=0),
        view(op=OP_STATE_DICT, has_buffer=True, fingerprint=2),
    ]
    verdict = judge(views, my_op=OP_STATE_DICT, seq=1)
    assert verdict is not None
    assert verdict.field == "keys"
    assert verdict.ranks == (2,)


def test_error_pickles_and_copies_with_its_facts() -> None:
    error = judge([sender(), buffer((3, 2))], my_op=OP_TENSOR, seq=4).error()  # type: ignore[union-attr]
    for clone in (pickle.loads(pickle.dumps(error)), copy.copy(error)):
        assert isinstance(clone, BroadcastMismatchError)
        assert str(clone) == str(error)
        assert (clone.field, clone.ranks, clone.views) == (error.field, error.ranks, error.views)


@pytest.mark.parametrize(
    ("ranks", "text"), [([2], "rank 2"), ([3, 2], "ranks 2 and 3"), ([5, 1, 2], "ranks 1, 2 and 5")]
)
def test_ranks_phrase(ranks: list[int], text: str) -> None:
    assert ranks_phrase(ranks) == text
