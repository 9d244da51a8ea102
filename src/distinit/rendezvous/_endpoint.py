"""The rendezvous endpoint before torch touches it: does the name resolve, who hosts the store, can we reach it.

torch's c10d backend decides who hosts the store by comparing the endpoint with ``gethostname()`` and the
addresses that name resolves to (``_matches_machine_hostname``, read in ``_torch``): an alias, a CNAME or a
second NIC's address is no match, so nobody hosts and every agent waits 60 s for ``RendezvousConnectionError``
with no message (pytorch#64926). Here the decision also accepts any non-loopback endpoint address that
binds on this host, and says which names and addresses it compared. A client agent probes the endpoint
with init's probe first, so a refused port, a black hole, a foreign program or a name that does not resolve
is named in seconds.
"""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta

from torch.distributed import TCPStore
from torch.distributed.elastic.rendezvous.utils import parse_rendezvous_endpoint

from distinit._net import ProbeResult, binds, is_loopback, port_holder, probe
from distinit.rendezvous._errors import DOCS, AgentRendezvousConnectionError
from distinit.rendezvous._torch import matches_machine_hostname

logger = logging.getLogger("distinit.rendezvous")

#: torchrun's default rendezvous port (c10d_rendezvous_backend.DEFAULT_PORT).
DEFAULT_PORT = 29400
#: How long a black hole, an unreachable route or a failing name may last before the verdict (seconds).
VERDICT_AFTER = 4.0
#: One probe's connect timeout (seconds).
PROBE_TIMEOUT = 1.5
#: Seconds between probes of an endpoint that is not up yet: the first, then doubled up to the last. Agents start
#: together, so the host agent's store usually comes up within a few tenths of a second of a client's first
#: probe; a refused probe on a LAN costs microseconds of CPU, so starting short costs nothing.
REPROBE_FIRST = 0.05
REPROBE_MAX = 0.25


@dataclass(frozen=True)
class HostDecision:
    """Whether this agent hosts the store, and the evidence (names and addresses compared), in words."""

    host: bool
    torch_says: bool
    evidence: str


def resolve(host: str) -> tuple[str, ...]:
    """Every address ``host`` resolves to here, in getaddrinfo order; empty when it does not resolve."""
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        return ()
    return tuple(dict.fromkeys(str(info[4][0]) for info in infos))


def decide_host(
    host: str,
    addresses: tuple[str, ...],
    *,
    configured: bool | None,
    torch_match: bool,
    this_host: str,
    binds: Callable[[str], bool],
) -> HostDecision:
    """Whether this agent hosts the store for endpoint ``host`` (resolving to ``addresses``). Pure.

    ``configured`` is ``--rdzv-conf is_host``; ``torch_match`` is torch's own verdict; an endpoint address
    that is not loopback and ``binds`` here also makes this agent the host (torch would miss it).
    """
    if configured is not None:
        return HostDecision(configured, configured, f"is_host={int(configured)} from --rdzv-conf")
    compared = f"endpoint {host!r} ({', '.join(addresses) or 'no address'}) against this host {this_host!r}"
    if torch_match:
        return HostDecision(True, True, f"torch matched {compared}")
    local = [ip for ip in addresses if not is_loopback(ip) and binds(ip)]
    if local:
        return HostDecision(
            True,
            False,
            f"torch found no match comparing {compared}, but {local[0]} is an address of this host: distinit "
            f"hosts the store here (with --rdzv-backend=c10d pass --rdzv-conf is_host=1 on this node)",
        )
    return HostDecision(False, False, f"not the host: compared {compared}")


def connection_error(kind: str, what: str, *, why: str, fix: str, master: str) -> AgentRendezvousConnectionError:
    """An :class:`AgentRendezvousConnectionError` with its facts (raise it ``from`` the foreign error)."""
    exc = AgentRendezvousConnectionError(what, why=why, fix=fix, master=master)
    exc.kind = kind
    return exc


def _verdict(result: ProbeResult, host: str, port: int, addresses: tuple[str, ...], waited: float) -> Exception:
    endpoint = f"{host}:{port}"
    resolved = f" ({', '.join(addresses)})" if addresses else ""
    doctor = f"run `distinit doctor` on this node and on {host}; see {DOCS}"
    if result.kind == "dns":
        return connection_error(
            "dns",
            f"the rendezvous endpoint name {host!r} does not resolve on {socket.gethostname()}: {result.detail}.",
            why="a typo in --rdzv-endpoint, or a name known only on some nodes (/etc/hosts, a cluster-only DNS)",
            fix=f"pass a name or address every node resolves (e.g. the host agent's IP); {doctor}",
            master=endpoint,
        )
    if result.kind == "foreign":
        holder = port_holder(port) if any(binds(ip) for ip in addresses) else None
        who = f" ({holder})" if holder else ""
        return connection_error(
            "foreign",
            f"a program that is not a torch store listens on the rendezvous endpoint {endpoint}{resolved}{who}: "
            f"{result.detail}.",
            why="--rdzv-endpoint names a port another service uses (or a stale process of another job)",
            fix="pick a free --rdzv-endpoint port on the host agent's node, or stop the program holding it",
            master=endpoint,
        )
    if result.kind == "refused":
        return connection_error(
            "refused",
            f"nothing listens on the rendezvous endpoint {endpoint}{resolved} after {waited:.1f} s "
            f"(connection refused).",
            why=f"the agent that hosts the store (on {host}) has not started, exited, or listens elsewhere",
            fix=f"start torchrun on {host} with the same --rdzv-endpoint (or raise --rdzv-conf connect_timeout=S "
            f"when it starts later); {doctor}",
            master=endpoint,
        )
    if result.kind in ("timeout", "unreachable"):
        how = "packets vanish (no answer, no refusal)" if result.kind == "timeout" else result.detail
        return connection_error(
            result.kind,
            f"this agent cannot reach the rendezvous endpoint {endpoint}{resolved} from {socket.gethostname()}: "
            f"{how}, for {waited:.1f} s.",
            why="a firewall drops the port, or the endpoint's address is not routable from this node (another NIC)",
            fix=f"open TCP port {port} on {host} to this node, or pass an address of {host} this node can reach; "
            f"{doctor}",
            master=endpoint,
        )
    return connection_error(
        result.kind,
        f"the rendezvous endpoint {endpoint}{resolved} failed: {result.detail}.",
        why="an unexpected socket error",
        fix=doctor,
        master=endpoint,
    )


def wait_for_store(host: str, port: int, addresses: tuple[str, ...], *, refused_for: float) -> None:
    """Return once a TCPStore answers at ``host:port``; raise the named verdict otherwise.

    A refused port is waited on for ``refused_for`` seconds (the hosting agent may start later); a black hole,
    an unreachable route or a failing name for :data:`VERDICT_AFTER`; a foreign program fails at once. The
    endpoint is probed again after each answer that is not yet a verdict (:data:`REPROBE_FIRST` s, doubling up
    to :data:`REPROBE_MAX`), never past
    the limit of what the last probe saw (the loop is its own: that limit moves with each probe's answer,
    which :func:`distinit._guarded.poll_until`'s one bound would overshoot by up to a pause).

    Raises:
        AgentRendezvousConnectionError: with ``kind`` saying why.
    """
    start = time.monotonic()
    warned = False
    pause = REPROBE_FIRST
    while True:
        # A black hole costs a whole probe: never let the last one overshoot the verdict's limit by much.
        left = max(VERDICT_AFTER - (time.monotonic() - start), 0.5)
        result = probe(host, port, min(PROBE_TIMEOUT, left), handshake_timeout=2.0)
        waited = time.monotonic() - start
        if result.kind == "tcpstore":
            return
        if result.kind == "foreign":
            raise _verdict(result, host, port, addresses, waited)
        limit = refused_for if result.kind == "refused" else VERDICT_AFTER
        if waited >= limit:
            raise _verdict(result, host, port, addresses, waited)
        if not warned and waited >= 2.0:
            warned = True
            logger.warning(
                "rendezvous endpoint %s:%d: %s; still trying for %.0f s",
                host,
                port,
                result.detail,
                limit - waited,
                extra={"distinit": {"event": "rendezvous.endpoint_waiting", "kind": result.kind}},
            )
        time.sleep(min(pause, max(0.0, limit - waited)))  # until the next probe
        pause = min(2 * pause, REPROBE_MAX)


def open_store(
    endpoint: str, *, configured_host: bool | None, read_timeout: int, refused_for: float, max_nodes: int
) -> tuple[TCPStore, HostDecision]:
    """The rendezvous TCPStore: hosted here when this agent is the host, else connected after a probe.

    Raises:
        AgentRendezvousConnectionError: the endpoint is unusable (see :func:`wait_for_store`), or its name
            resolves to loopback on a client agent of a multi-node job (it would look for the store on itself).
    """
    host, port = parse_rendezvous_endpoint(endpoint, default_port=DEFAULT_PORT)
    addresses = resolve(host)
    if not addresses:
        raise _verdict(probe(host, port, PROBE_TIMEOUT), host, port, addresses, 0.0)
    decision = decide_host(
        host,
        addresses,
        configured=configured_host,
        torch_match=_torch_match(host),
        this_host=socket.gethostname(),
        binds=binds,
    )
    # WARNING when distinit decides otherwise than torch would: that is the fix c10d users need.
    logger.log(
        logging.WARNING if decision.host != decision.torch_says else logging.INFO,
        "rendezvous endpoint %s:%d: %s",
        host,
        port,
        decision.evidence,
        extra={"distinit": {"event": "rendezvous.host", "host": decision.host}},
    )
    timeout = timedelta(seconds=read_timeout)
    if decision.host:
        try:
            return TCPStore(host, port, is_master=True, multi_tenant=True, timeout=timeout), decision
        except (RuntimeError, ValueError, TimeoutError) as exc:
            if configured_host:
                raise connection_error(
                    "error",
                    f"this agent could not host the rendezvous store on port {port}: {exc}",
                    why="is_host=1 was passed but the port is held or the address is not this host's",
                    fix=f"free port {port} or pass another --rdzv-endpoint port",
                    master=f"{host}:{port}",
                ) from exc
            # torch's own fallback: another agent on this machine hosts it (several agents per host).
            logger.debug("port %d already served here (%s); connecting as a client", port, exc)
    elif max_nodes > 1 and all(is_loopback(ip) for ip in addresses) and not _is_loopback_literal(host):
        raise _loopback_endpoint(host, port, addresses)
    wait_for_store(host, port, addresses, refused_for=refused_for)
    try:
        return TCPStore(host, port, is_master=False, multi_tenant=True, timeout=timeout), decision
    except (RuntimeError, ValueError, TimeoutError) as exc:
        raise connection_error(
            "error",
            f"the rendezvous store at {host}:{port} answered a probe but the connection failed: {exc}",
            why="the store stopped between the probe and the connection (the host agent exited)",
            fix=f"look at the host agent's log on {host}; see {DOCS}",
            master=f"{host}:{port}",
        ) from exc


def _loopback_endpoint(host: str, port: int, addresses: tuple[str, ...]) -> AgentRendezvousConnectionError:
    """A client agent of a multi-node job whose endpoint name resolves to loopback: it would wait on itself."""
    return connection_error(
        "loopback",
        f"the rendezvous endpoint {host!r} resolves to {', '.join(addresses)} (loopback) on "
        f"{socket.gethostname()}, which is not the host agent's node: this agent would look for the store "
        f"on itself.",
        why=f"/etc/hosts on this node maps {host!r} to a loopback address (Debian's 127.0.1.1 line)",
        fix=f"pass {host}'s routable IP as --rdzv-endpoint, or fix the /etc/hosts line for {host!r}",
        master=f"{host}:{port}",
    )


def _torch_match(host: str) -> bool:
    # None: this torch has no such check; the binds test below still decides (less precisely for an alias).
    return bool(matches_machine_hostname(host))


def _is_loopback_literal(host: str) -> bool:
    return host == "localhost" or is_loopback(host)
