"""``clock``: each host's wall-clock offset from rank 0's host, NTP-style over rank 0's listener."""

from __future__ import annotations

import socket
import struct
import time
from collections.abc import Mapping

from distinit.doctor._listener import TIME, recv_exactly
from distinit.doctor._model import Check
from distinit.doctor._reach import Endpoint, classify

#: Round trips per host; the one with the shortest round trip gives the offset (NTP's clock filter).
SAMPLES = 5
WARN_S = 1.0
FAIL_S = 30.0


def offset_from(t0: float, server: float, t3: float) -> tuple[float, float]:
    """(offset, error) of a client clock that read ``t0`` before and ``t3`` after a server read ``server``.

    offset = client - server, taken at the round trip's midpoint; error = half the round trip.
    """
    return (t0 + t3) / 2 - server, (t3 - t0) / 2


def measure(endpoint: Endpoint, *, timeout: float, samples: int = SAMPLES) -> tuple[float, float] | str:
    """(offset, error) of this host's clock against ``endpoint``'s, or why it could not be measured."""
    best: tuple[float, float] | None = None
    try:
        with socket.create_connection(endpoint, timeout=timeout) as conn:
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            for _ in range(samples):
                t0 = time.time()
                conn.sendall(TIME)
                server = struct.unpack("!d", recv_exactly(conn, 8))[0]
                sample = offset_from(t0, server, time.time())
                if best is None or sample[1] < best[1]:
                    best = sample
    except (OSError, ConnectionError) as exc:
        return classify(exc)
    assert best is not None  # samples >= 1
    return best


def verdict(offsets: Mapping[str, object], *, ranks_of: Mapping[str, tuple[int, ...]], reference: str) -> Check:
    """The ``clock`` check over ``offsets`` (host label -> [offset, error] or a failure string)."""
    failed = {h: v for h, v in offsets.items() if isinstance(v, str)}
    measured = {h: v for h, v in offsets.items() if isinstance(v, list | tuple)}
    worst = {h: abs(float(v[0])) - float(v[1]) for h, v in measured.items()}
    bad = sorted(h for h, w in worst.items() if w > FAIL_S)
    slow = sorted(h for h, w in worst.items() if WARN_S < w <= FAIL_S)
    evidence = {"reference": reference, "offsets": dict(offsets)}

    def shown(host: str) -> str:
        off, err = measured[host]
        return f"{host} {off:+.3f} s (± {err:.3f})"

    if bad or failed:
        named = [shown(h) for h in bad] + [f"{h}: {why}" for h, why in sorted(failed.items())]
        hosts = tuple(bad) + tuple(sorted(failed))
        return Check(
            id="clock",
            status="fail",
            summary=f"clock offset from {reference} over {FAIL_S:.0f} s or unmeasured: {'; '.join(named)}",
            fix="run an NTP client (chrony/ntpd, `timedatectl set-ntp true`) on every host; TLS, Kerberos, "
            "logs and timeouts all depend on it",
            ranks=tuple(r for h in hosts for r in ranks_of.get(h, ())),
            hosts=hosts,
            evidence=evidence,
        )
    if slow:
        return Check(
            id="clock",
            status="warn",
            summary=f"clock offset from {reference} over {WARN_S:.0f} s: {'; '.join(shown(h) for h in slow)}",
            fix="run an NTP client (chrony/ntpd) on every host",
            ranks=tuple(r for h in slow for r in ranks_of.get(h, ())),
            hosts=tuple(slow),
            evidence=evidence,
        )
    largest = max(worst.values(), default=0.0)
    return Check(
        id="clock",
        status="pass",
        summary=f"{len(measured)} host(s) within {max(largest, 0.0):.3f} s of {reference}",
        evidence=evidence,
    )
