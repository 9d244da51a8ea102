"""``reach`` and ``bandwidth``: host leaders connect to other hosts' listeners, bounded per pair."""

from __future__ import annotations

import errno
import random
import socket
import struct
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

from distinit._foreign import first_line
from distinit.doctor._listener import BULK, PING, recv_exactly

#: Up to this many hosts every host tries every other; above it, the sampled plan.
FULL_MESH_HOSTS = 64
#: Random peers per host in the sampled plan, besides the ring successor.
SAMPLED_PEERS = 8
#: Connections one host opens at once.
MAX_THREADS = 64
Endpoint = tuple[str, int]


def reach_plan(
    hosts: int, *, full_mesh: int = FULL_MESH_HOSTS, peers: int = SAMPLED_PEERS, seed: int = 0
) -> list[list[int]]:
    """For each host index, the host indices it connects to.

    Up to ``full_mesh`` hosts: all others. Above: the ring successor plus ``peers`` random others, drawn
    from a generator seeded by ``seed`` and the host index, so every rank computes the same plan.
    """
    if hosts <= full_mesh:
        return [[j for j in range(hosts) if j != i] for i in range(hosts)]
    plan = []
    for i in range(hosts):
        successor = (i + 1) % hosts
        # sample() over a range is O(k), not O(hosts): the plan costs milliseconds at 4096 hosts
        drawn = random.Random(seed * 1_000_003 + i).sample(range(hosts), min(peers + 2, hosts))
        plan.append([successor, *[j for j in drawn if j not in (i, successor)][:peers]])
    return plan


def classify(exc: BaseException) -> str:
    """``refused``, ``timeout``, ``no route`` or the OS's line for a failed connect."""
    if isinstance(exc, ConnectionRefusedError):
        return "refused"
    if isinstance(exc, TimeoutError | socket.timeout):
        return "timeout"
    if isinstance(exc, OSError) and exc.errno in (errno.EHOSTUNREACH, errno.ENETUNREACH):
        return "no route"
    return first_line(exc)


def probe(endpoint: Endpoint, *, timeout: float) -> str | None:
    """None if ``endpoint`` answers a ping within ``timeout``, else why not."""
    try:
        with socket.create_connection(endpoint, timeout=timeout) as conn:
            conn.sendall(PING)
            if recv_exactly(conn, 1) != PING:
                return "wrong answer"
    except (OSError, ConnectionError) as exc:
        return classify(exc)
    return None


def probe_all(targets: Sequence[Endpoint], *, timeout: float) -> list[str | None]:
    """:func:`probe` every target concurrently; results in order."""
    if not targets:
        return []
    with ThreadPoolExecutor(max_workers=min(MAX_THREADS, len(targets))) as pool:
        return list(pool.map(lambda t: probe(t, timeout=timeout), targets))


def transfer(endpoint: Endpoint, *, size_bytes: int, timeout: float) -> float | str:
    """GB/s of sending ``size_bytes`` to ``endpoint`` and getting its acknowledgement, or why it failed."""
    payload = memoryview(bytes(min(size_bytes, 1 << 22)))
    try:
        with socket.create_connection(endpoint, timeout=timeout) as conn:
            started = time.perf_counter()
            conn.sendall(BULK + struct.pack("!Q", size_bytes))
            left = size_bytes
            while left:
                step = payload[: min(left, len(payload))]
                conn.sendall(step)
                left -= len(step)
            if recv_exactly(conn, 1) != PING:
                return "wrong answer"
            return size_bytes / (time.perf_counter() - started) / 1e9
    except (OSError, ConnectionError) as exc:
        return classify(exc)
