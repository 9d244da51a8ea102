"""flatten_module_: re-homing keeps identities, values, ties and training working (no process group needed)."""

from __future__ import annotations

import pytest
import torch

from distinit.broadcast import _flat, flatten_module_


class Tied(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(10, 4)
        self.norm = torch.nn.BatchNorm1d(4)  # float buffers and an int64 counter
        self.head = torch.nn.Linear(4, 10, bias=True)
        self.head.weight = self.embed.weight  # tied
        self.register_buffer("empty", torch.zeros(0))
        self.half_proj = torch.nn.Linear(4, 4).to(torch.float16)


def test_identities_values_and_ties_survive() -> None:
    torch.manual_seed(0)
    model = Tied()
    params = dict(model.named_parameters())
    before = {k: v.detach().clone() for k, v in model.state_dict().items()}
    flats = flatten_module_(model)
    assert dict(model.named_parameters()) == params  # same Parameter objects (identity)
    assert all(p.requires_grad for p in model.parameters())
    assert model.head.weight is model.embed.weight
    for key, value in model.state_dict().items():
        assert torch.equal(value, before[key]), key
    assert sorted(str(f.dtype) for f in flats) == ["torch.float16", "torch.float32", "torch.int64"]
    fp32 = next(f for f in flats if f.dtype == torch.float32)
    # Every float32 tensor (the tied weight once) now lives in the flat buffer, back to back.
    float_tensors = [t for t in [*model.parameters(), *model.buffers()] if t.dtype == torch.float32 and t.numel()]
    assert sum(t.numel() for t in float_tensors) == fp32.numel()
    assert all(t.untyped_storage().data_ptr() == fp32.untyped_storage().data_ptr() for t in float_tensors)
    with torch.no_grad():
        fp32.zero_()
    assert float(model.embed.weight.detach().abs().sum()) == 0.0  # the parameters are views of it


def test_training_still_works_after_flattening() -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    reference = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    reference.load_state_dict(model.state_dict())
    optimizer = torch.optim.Adam(model.parameters(), lr=0.1)  # created before: holds the same objects
    flatten_module_(model)
    ref_optimizer = torch.optim.Adam(reference.parameters(), lr=0.1)
    x = torch.randn(32, 8)
    for _ in range(3):
        for m, opt in ((model, optimizer), (reference, ref_optimizer)):
            opt.zero_grad()
            m(x).pow(2).mean().backward()
            opt.step()
    for a, b in zip(model.parameters(), reference.parameters(), strict=True):
        assert torch.allclose(a, b)
    flat = _flat.registered(model)
    assert flat is not None
    assert all(v.data_ptr() == p.data_ptr() for v, p in zip(flat.buffers[0].views, model.parameters(), strict=True))


def test_tensor_subclasses_are_refused_and_nothing_moves() -> None:
    class Marked(torch.Tensor):
        pass

    model = torch.nn.Linear(2, 2)
    weight_ptr = model.weight.data_ptr()
    model.register_buffer("marked", torch.zeros(3).as_subclass(Marked))
    with pytest.raises(TypeError, match="'marked' is a Marked"):
        flatten_module_(model)
    assert model.weight.data_ptr() == weight_ptr
    assert _flat.registered(model) is None
