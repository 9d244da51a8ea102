from __future__ import annotations

import types

import distinit.watchdog as watchdog


def test_all_is_the_public_face() -> None:
    public = {
        name
        for name, value in vars(watchdog).items()
        if name.isidentifier() and not name.startswith("_") and not isinstance(value, types.ModuleType)
    }
    assert set(watchdog.__all__) == public
    assert watchdog.__all__ == sorted(watchdog.__all__)


def test_every_public_name_has_a_docstring() -> None:
    for name in watchdog.__all__:
        assert getattr(watchdog, name).__doc__, name


def test_the_torch_drop_in_has_torchs_names() -> None:
    import distinit.watchdog.elastic as elastic

    public = {name for name in vars(elastic) if not name.startswith(("_", "@"))}
    assert set(elastic.__all__) == public
    assert elastic.__all__ == sorted(elastic.__all__)
    for name in elastic.__all__:
        assert getattr(elastic, name).__doc__, name
    torch_timer = __import__("pytest").importorskip("torch.distributed.elastic.timer")
    for name in ("FileTimerClient", "FileTimerRequest", "FileTimerServer", "configure", "expires"):
        assert hasattr(torch_timer, name), name
