"""The grace escalation policy, driven by a fake clock: when a persisting failure becomes its specific error."""

from __future__ import annotations

import pytest

from distinit.init._policy import DNS_GRACE, PORT_GRACE, UNREACHABLE_GRACE, Grace, Persisted


@pytest.mark.parametrize(
    ("kind", "grace"),
    [
        pytest.param("dns", DNS_GRACE, id="dns-60s"),
        pytest.param("unreachable", UNREACHABLE_GRACE, id="no-route-10s"),
        pytest.param("port_busy", PORT_GRACE, id="port-busy-30s"),
        pytest.param("foreign", 7.0, id="foreign-attempt-timeout"),
    ],
)
def test_a_failure_persisting_for_its_grace_escalates(kind: str, grace: float) -> None:
    policy = Grace(foreign=7.0)
    assert policy.observe(kind, since=100.0, now=100.0) is None  # type: ignore[arg-type]
    assert policy.observe(kind, since=100.0 + grace - 1, now=100.0 + grace - 0.01) is None  # type: ignore[arg-type]
    assert policy.observe(kind, since=200.0, now=100.0 + grace) == Persisted(kind, grace)  # type: ignore[arg-type]


@pytest.mark.parametrize("kind", ["refused", "timeout", "store", "join", "init"])
def test_kinds_without_a_grace_never_escalate(kind: str) -> None:
    policy = Grace(foreign=1.0)
    policy.observe(kind, since=0.0, now=0.0)  # type: ignore[arg-type]
    assert policy.observe(kind, since=0.0, now=1e9) is None  # type: ignore[arg-type]


def test_the_grace_counts_from_the_first_sight_of_the_streak() -> None:
    policy = Grace(foreign=5.0, unreachable=10.0)
    # A probe that waited 3 s saw the failure from its start: the count begins at `since`, not `now`.
    assert policy.observe("unreachable", since=0.0, now=3.0) is None
    # Later sightings of the same kind do not restart the count, whatever their own `since`.
    assert policy.observe("unreachable", since=9.0, now=9.5) is None
    assert policy.observe("unreachable", since=10.0, now=10.0) == Persisted("unreachable", 10.0)


def test_another_kind_or_a_clear_restarts_the_count() -> None:
    policy = Grace(foreign=5.0, dns=10.0)
    policy.observe("dns", since=0.0, now=0.0)
    policy.observe("refused", since=8.0, now=8.0)  # the name resolved for a moment: a new streak
    assert policy.observe("dns", since=9.0, now=12.0) is None
    assert policy.observe("dns", since=0.0, now=19.0) == Persisted("dns", 10.0)
    policy.clear()  # a TCPStore answered
    assert policy.observe("dns", since=20.0, now=20.0) is None
