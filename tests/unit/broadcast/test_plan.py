import pytest

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
