"""The opt-in ``nccl`` check's decisions, from each rank's device (pure).

Rank 0's lines as the checks complete (``on_check``) and the ``nccl`` check in a real one-rank world are tested
in ``tests/integration/doctor/test_doctor_progress_live.py``.
"""

from __future__ import annotations

from distinit.doctor._nccl import why_not


def test_nccl_is_skipped_without_gpus_and_fails_naming_ranks_without_one() -> None:
    skipped = why_not({0: None, 1: None})
    assert skipped is not None and skipped.status == "skip" and "CUDA" in skipped.summary
    partial = why_not({0: 0, 1: None, 2: 1, 3: None})
    assert partial is not None and partial.status == "fail" and partial.ranks == (1, 3)
    assert "ranks [1, 3]" in partial.summary
    assert why_not({0: 0, 1: 1}) is None
