"""The plugin's settings: validated once, with where each came from; pytest-timeout's limit read publicly.

That importing the plugin registers no exit hook is checked in a fresh interpreter, in
``tests/integration/testing/test_options_process.py``.
"""

from __future__ import annotations

from datetime import timedelta
from types import SimpleNamespace
from typing import Any

import pytest

from distinit.testing._deadline import outer_timeout_of
from distinit.testing._options import INI_DEFAULTS, DistributedOptions, IniDefaults, options_for, read_ini


class _Stash(dict[Any, Any]):
    """Enough of ``pytest.Stash`` for ``options_for``."""


def _config(ini: dict[str, object], *, options: dict[str, object] | None = None, timeout_plugin: bool = True) -> Any:
    def getini(name: str) -> object:
        return ini.get(name)

    def getoption(name: str, default: object = None) -> object:
        return (options or {}).get(name, default)

    return SimpleNamespace(
        getini=getini,
        getoption=getoption,
        stash=_Stash(),
        pluginmanager=SimpleNamespace(hasplugin=lambda name: timeout_plugin and name == "timeout"),
    )


def _item(config: Any, *marks: pytest.Mark) -> Any:
    def get_closest_marker(name: str) -> pytest.Mark | None:
        return next((m for m in marks if m.name == name), None)

    return SimpleNamespace(config=config, nodeid="test_x.py::test_x", get_closest_marker=get_closest_marker)


def _distributed(*args: object, **kwargs: object) -> pytest.Mark:
    return pytest.mark.distributed(*args, **kwargs).mark


def test_defaults_come_from_nowhere_and_say_so() -> None:
    options = options_for(_item(_config({}), _distributed()))
    assert options is not None
    assert options == DistributedOptions(sources=options.sources)  # every value the default
    assert options.source("timeout") == "default"
    assert options.source("reuse") == "default"
    assert options.source("world_size") == "default"


def test_each_value_records_where_it_came_from() -> None:
    config = _config({"distributed_timeout": "12.5", "distributed_reuse": True})
    options = options_for(_item(config, _distributed(3, backend="gloo")))
    assert options is not None
    assert (options.world_size, options.timeout, options.reuse) == (3, 12.5, True)
    assert options.source("world_size") == "marker"
    assert options.source("backend") == "marker"
    assert options.source("timeout") == "ini distributed_timeout"
    assert options.source("reuse") == "ini distributed_reuse"
    marked = options_for(_item(config, _distributed(timeout=timedelta(seconds=4), reuse=False)))
    assert marked is not None
    assert (marked.timeout, marked.reuse) == (4.0, False)
    assert marked.source("timeout") == "marker"


def test_the_ini_is_read_once_when_configured() -> None:
    config = _config({"distributed_timeout": "not used"})
    config.stash[INI_DEFAULTS] = IniDefaults(timeout=7.0, timeout_source="ini distributed_timeout")
    options = options_for(_item(config, _distributed()))
    assert options is not None
    assert options.timeout == 7.0


@pytest.mark.parametrize("value", ["abc", "0", "-3", "nan", "inf", "60s"])
def test_a_bad_ini_timeout_is_a_usage_error_naming_the_key_and_value(value: str) -> None:
    with pytest.raises(pytest.UsageError, match=rf"distributed_timeout = '{value}'"):
        read_ini(_config({"distributed_timeout": value}))


@pytest.mark.parametrize("value", [0, -1, "30", True, float("nan"), float("inf")])
def test_a_bad_marker_timeout_is_a_usage_error_naming_the_argument_and_value(value: object) -> None:
    with pytest.raises(pytest.UsageError, match=r"test_x\.py::test_x: distributed\(timeout=\.\.\.\) must be seconds"):
        options_for(_item(_config({}), _distributed(timeout=value)))


@pytest.mark.parametrize(
    ("mark", "message"),
    [
        (_distributed(0), r"world_size=\.\.\.\) must be an int >= 1, got 0"),
        (_distributed(gpus_per_rank=-1), r"gpus_per_rank=\.\.\.\) must be an int >= 0, got -1"),
        (_distributed(env={"A": 1}), r"env=\.\.\.\) must be a dict of str to str"),
        (_distributed(world_sise=2), r"unknown @pytest.mark.distributed argument\(s\) \['world_sise'\]"),
        (_distributed(1, 2), r"at most one positional argument"),
    ],
)
def test_bad_marker_arguments_are_usage_errors(mark: pytest.Mark, message: str) -> None:
    with pytest.raises(pytest.UsageError, match=message):
        options_for(_item(_config({}), mark))


def _timeout_mark(*args: object, **kwargs: object) -> pytest.Mark:
    return pytest.mark.timeout(*args, **kwargs).mark


@pytest.mark.parametrize(
    ("marks", "option", "env", "ini", "expected"),
    [
        pytest.param((_timeout_mark(9),), 8.0, "7", "6", 9.0, id="marker-first"),
        pytest.param((_timeout_mark(timeout=9),), 8.0, "7", "6", 9.0, id="marker-keyword"),
        pytest.param((_timeout_mark(method="thread"),), 8.0, "7", "6", 8.0, id="marker-without-timeout"),
        pytest.param((), 8.0, "7", "6", 8.0, id="option-then"),
        pytest.param((), None, "7", "6", 7.0, id="env-then"),
        pytest.param((), None, None, "6", 6.0, id="ini-last"),
        pytest.param((_timeout_mark(0),), 8.0, None, None, None, id="zero-is-off"),
        pytest.param((), None, None, None, None, id="unset"),
    ],
)
def test_pytest_timeout_precedence_is_marker_option_env_ini(
    monkeypatch: pytest.MonkeyPatch,
    marks: tuple[pytest.Mark, ...],
    option: float | None,
    env: str | None,
    ini: str | None,
    expected: float | None,
) -> None:
    if env is None:
        monkeypatch.delenv("PYTEST_TIMEOUT", raising=False)
    else:
        monkeypatch.setenv("PYTEST_TIMEOUT", env)
    config = _config({"timeout": ini or ""}, options={"timeout": option})
    assert outer_timeout_of(_item(config, *marks)) == expected


def test_no_pytest_timeout_plugin_means_no_outer_limit() -> None:
    config = _config({"timeout": "5"}, timeout_plugin=False)
    assert outer_timeout_of(_item(config, _timeout_mark(3))) is None
