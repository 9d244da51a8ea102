import pytest
import torch

from distinit.broadcast import _layout, _pipeline, _staging
from distinit.broadcast._plan import Step, plan


@pytest.mark.parametrize(
    ("sizes", "bucket", "direct", "expected"),
    [
        pytest.param([], 100, 50, [], id="empty"),
        pytest.param([10, 10, 10], 100, 50, [Step((0, 1, 2), 30, False)], id="one-bucket"),
        pytest.param([40, 40, 40], 100, 50, [Step((0, 1), 80, False), Step((2,), 40, False)], id="bucket-splits"),
        pytest.param([10, 60, 10], 100, 50, [Step((1,), 60, True), Step((0, 2), 20, False)], id="large-in-place"),
        pytest.param([0, 10, 0], 100, 50, [Step((1,), 10, False)], id="empty-tensors-skipped"),
        pytest.param([150], 100, 200, [Step((0,), 150, True)], id="larger-than-bucket-in-place"),
        pytest.param([5, 5], 1, 1, [Step((0,), 5, True), Step((1,), 5, True)], id="all-in-place"),
    ],
)
def test_plan(sizes: list[int], bucket: int, direct: int, expected: list[Step]) -> None:
    assert plan(sizes, bucket_bytes=bucket, direct_bytes=direct) == expected


def test_plan_covers_every_nonempty_tensor_once() -> None:
    sizes = [(i * 7919) % 5000 for i in range(500)]
    steps = plan(sizes, bucket_bytes=20_000, direct_bytes=4_000)
    covered = sorted(i for s in steps for i in s.indices)
    assert covered == [i for i, n in enumerate(sizes) if n]
    assert all(s.nbytes == sum(sizes[i] for i in s.indices) for s in steps)
    assert all(s.direct or s.nbytes <= 20_000 for s in steps)


# ------------------------------------------------------------------ staging buckets (pack / unpack, pure CPU)


def _tensors() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return [
        torch.randn(7, generator=g),
        torch.randn(3, 4, generator=g),
        torch.randn(5, generator=g)[::2],  # non-contiguous
        torch.randn((), generator=g),
        torch.randn(1000, generator=g).to(torch.bfloat16),
        torch.tensor([True, False, True]),
        torch.arange(9, dtype=torch.int16).view(3, 3).t(),
    ]


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().reshape(-1).view(torch.uint8)


@pytest.mark.parametrize("bucket", [1 << 20, 24], ids=["one-bucket-per-dtype", "small-buckets"])
def test_staged_pack_unpack_round_trips_bit_exactly(bucket: int) -> None:
    sources = _tensors()
    names = [f"t{i}" for i in range(len(sources))]
    staged = _staging.staged_plan(_layout.layout(names, sources), sources, bucket)
    targets = [torch.full_like(t, 0) for t in sources]
    cpu = torch.device("cpu")
    for index, step in enumerate(staged.steps):
        if step.direct:
            targets[step.indices[0]].copy_(sources[step.indices[0]])
            continue
        flat = staged.buffer(index, cpu)
        assert flat.dtype == sources[step.indices[0]].dtype and flat.numel() * flat.element_size() == step.nbytes
        _pipeline.pack([sources[i] for i in step.indices], flat, staged, index)
        _pipeline.CopyBack([targets[i] for i in step.indices], staged.views(index, cpu))()
    for source, target in zip(sources, targets, strict=True):
        assert torch.equal(_bits(source), _bits(target))
        assert target.shape == source.shape and target.dtype == source.dtype


def test_staged_plan_is_cached_with_its_buffers() -> None:
    sources = [torch.randn(10) for _ in range(4)]
    lay = _layout.layout([f"p{i}" for i in range(4)], sources)
    first = _staging.staged_plan(lay, sources, 1 << 20)
    buf = first.buffer(0, torch.device("cpu"))
    again = _staging.staged_plan(lay, sources, 1 << 20)
    assert again is first and again.buffer(0, torch.device("cpu")) is buf
    again.drop_buffers()
    assert again.buffer(0, torch.device("cpu")) is not buf


def test_staging_over_budget_is_allocated_per_call(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_staging, "STAGING_BUDGET", 16)
    sources = [torch.randn(10) for _ in range(3)]
    lay = _layout.layout(["a", "b", "c"], sources)
    first = _staging.staged_plan(lay, sources, 1 << 20)
    second = _staging.staged_plan(lay, sources, 1 << 20)
    assert first is not second  # a fresh copy each call: nothing retained past the budget
    assert first.steps == second.steps
