"""Settings and launcher counts in Unicode digits ('²', '١'): str.isdigit() accepts them, int() does not.

Each reader refuses them as malformed (its documented path), never with a bare ValueError (issue 33, item 10).
"""

from __future__ import annotations

import pytest

from distinit.broadcast._transport import shm
from distinit.env._draft import Draft, Vars
from distinit.env._resolve import _launched
from distinit.init._liveness import _gone_here


@pytest.mark.parametrize("text", ["²", "١٢", "1²"])
def test_the_shm_pool_cap_in_unicode_digits_is_malformed(monkeypatch: pytest.MonkeyPatch, text: str) -> None:
    monkeypatch.setenv(shm.POOL_ENV, text)
    assert shm.pool_cap() is None  # the call's BAD_SETTING path: named on every rank, nothing written


def test_the_shm_pool_cap_in_ascii_digits_is_read(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(shm.POOL_ENV, " 1048576 ")
    assert shm.pool_cap() == 1 << 20


@pytest.mark.parametrize("text", ["²", "٤", ""])
def test_a_launcher_count_in_unicode_digits_is_no_count(text: str) -> None:
    def count(environ: dict[str, str]) -> int | None:
        draft = Draft(launcher="env", rank=0, world_size=1)
        _launched(Vars(environ), draft)  # DistEnv.launched, as env resolves it
        return draft.launched

    assert count({"OMPI_COMM_WORLD_SIZE": text}) is None
    assert count({"OMPI_COMM_WORLD_SIZE": "4"}) == 4


def test_a_forged_pid_in_unicode_digits_is_no_process_of_this_host() -> None:
    import socket

    assert _gone_here(f"{socket.gethostname()}|²", socket.gethostname()) is False
