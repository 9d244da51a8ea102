"""Object and state-dict codecs: JSON only, validated, hostile input rejected (pure, no process group)."""

import dataclasses

import pydantic
import pytest
import torch
from typing_extensions import TypedDict

from distinit.broadcast._codec import TENSOR_MARK, decode, encode, schema_fingerprint
from distinit.broadcast._layout import decode_meta, diff_metadata
from distinit.broadcast._module import module_tensors

EMPTY = torch.empty(0, dtype=torch.uint8)
CPU = torch.device("cpu")


class Optim(pydantic.BaseModel):
    lr: float
    betas: tuple[float, float] = (0.9, 0.999)


class Config(pydantic.BaseModel):
    name: str
    optim: Optim
    layers: list[int] = []


class ConfigV2(pydantic.BaseModel):
    name: str
    optim: Optim
    layers: list[int] = []
    dropout: float = 0.0


@dataclasses.dataclass
class Point:
    x: int
    y: float


class Shape(TypedDict):
    dims: list[int]


class Holder(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(arbitrary_types_allowed=True)
    weight: torch.Tensor
    name: str


@pytest.mark.parametrize(
    ("value", "tp"),
    [
        pytest.param(Config(name="a", optim=Optim(lr=0.1), layers=[1, 2]), Config, id="nested-model"),
        pytest.param([Config(name="a", optim=Optim(lr=1))], list[Config], id="list-of-models"),
        pytest.param({"k": Point(1, 2.5)}, dict[str, Point], id="dict-of-dataclasses"),
        pytest.param({"dims": [1, 2]}, Shape, id="typeddict"),
        pytest.param(3.5, float, id="scalar"),
    ],
)
def test_round_trip(value: object, tp: object) -> None:
    payload, tensors = encode(value, tp)
    assert tensors == []
    assert decode(payload, EMPTY, count=0, tp=tp, device=CPU) == value


def test_fingerprint_tells_versions_apart_and_is_stable() -> None:
    assert schema_fingerprint(Config) == schema_fingerprint(Config)
    assert schema_fingerprint(Config) != schema_fingerprint(ConfigV2)
    assert schema_fingerprint(list[Config]) != schema_fingerprint(Config)
    assert 0 <= schema_fingerprint(Holder) < 1 << 63  # arbitrary types still fingerprint


def test_tensors_become_markers_and_come_back() -> None:
    weight = torch.arange(6, dtype=torch.bfloat16).reshape(2, 3)
    payload, tensors = encode(Holder(weight=weight, name="w"), Holder)
    assert TENSOR_MARK.encode() in payload
    assert tensors == [weight]
    got = decode(payload, weight.reshape(-1).view(torch.uint8).clone(), count=1, tp=Holder, device=CPU)
    assert torch.equal(got.weight, weight)
    assert got.weight.dtype == torch.bfloat16


def test_wrong_object_type_does_not_serialise() -> None:
    with pytest.raises(Exception, match=r"Expected|serializ"):
        encode("not a config", Config)


HOSTILE = [
    pytest.param(b'{"name": 1', id="truncated"),
    pytest.param(b'{"name": "a", "optim": {"lr": "fast"}}', id="wrong-type"),
    pytest.param(b'{"__class__": "os.system", "args": ["rm -rf /"]}', id="pickle-like-garbage"),
    pytest.param(b"\x80\x04\x95cos\nsystem\n", id="pickle-bytes"),
    pytest.param(b"[" * 100_000 + b"]" * 100_000, id="deep-nesting"),
]


@pytest.mark.parametrize("payload", HOSTILE)
def test_hostile_payload_is_a_validation_error(payload: bytes) -> None:
    with pytest.raises((pydantic.ValidationError, ValueError)):
        decode(payload, EMPTY, count=0, tp=Config, device=CPU)


@pytest.mark.parametrize(
    "payload",
    [
        pytest.param(b'{"weight": {"__distinit_tensor__": 3, "dtype": 1, "shape": [2]}, "name": "x"}', id="bad-index"),
        pytest.param(
            b'{"weight": {"__distinit_tensor__": 0, "dtype": 999, "shape": [2]}, "name": "x"}', id="bad-dtype"
        ),
        pytest.param(b'{"weight": {"__distinit_tensor__": 0, "dtype": 1, "shape": [-2]}, "name": "x"}', id="bad-shape"),
        pytest.param(
            b'{"weight": {"__distinit_tensor__": 0, "dtype": 1, "shape": [99]}, "name": "x"}', id="too-many-bytes"
        ),
    ],
)
def test_hostile_tensor_markers(payload: bytes) -> None:
    with pytest.raises(ValueError, match=r"marker|bytes"):
        decode(payload, torch.zeros(8, dtype=torch.uint8), count=1, tp=Holder, device=CPU)


def test_decode_meta_rejects_malformed() -> None:
    assert decode_meta(b'[["a", 1, [2, 3]]]') == [("a", 1, (2, 3))]
    for bad in (b"{}", b'[["a", 1]]', b'[["a", 1, [-1]]]', b"[[1, 1, [1]]]"):
        with pytest.raises(ValueError, match=r"metadata|shape"):
            decode_meta(bad)


def test_diff_metadata_names_keys_and_shapes() -> None:
    src = [("a", 1, (3, 4)), ("b", 1, (2,))]
    other = [("a", 1, (4, 3)), ("c", 1, (1,))]
    field, faulty, views, _ = diff_metadata([src, other, None, src], 0)
    assert field == "keys"
    assert faulty == [1]
    assert "lacks 'b'" in views[1]
    assert "unexpected 'c'" in views[1]
    assert "'a' as float32[4, 3] where src has float32[3, 4]" in views[1]
    field, _, _, _ = diff_metadata([src, [("a", 1, (3, 4)), ("b", 2, (2,))]], 0)
    assert field == "metadata"


def test_module_tensors_lists_tied_parameters_once() -> None:
    model = torch.nn.Sequential(torch.nn.Embedding(10, 4), torch.nn.Linear(4, 10, bias=False), torch.nn.BatchNorm1d(4))
    model[1].weight = model[0].weight
    names, tensors = module_tensors(model)
    assert names.count("0.weight") == 1
    assert "1.weight" not in names
    assert {"2.running_mean", "2.running_var", "2.num_batches_tracked"} <= set(names)
    assert tensors[names.index("0.weight")] is model[0].weight  # the parameter itself: written under no_grad
