"""The ``distinit`` rendezvous handler for torchrun: torch's dynamic rendezvous, plus the reasons it fails.

Membership, elasticity, keep-alive, re-rendezvous and the agent store are torch's ``DynamicRendezvousHandler``
over the c10d backend, unchanged. Around it: the endpoint pre-flight (``_endpoint``), each agent's card and
heart-beat on the store (``_card``), a watch of the other agents' cards while torch's join runs (a
disagreement is raised at once, the same on every agent), the translation of torch's bare timeout,
closed and connection errors into messages that name the cause (``_explain``), and restarts (``_restart``): the
failed workers published on the store, one restart count on every node, a new workers' store each round, and a
failure past ``--max-restarts`` raised on every agent.

torch's join blocks (its store reads have no bound of ours), so it runs in a daemon thread while this agent
reads the cards every :data:`POLL` s or more: the wait is the shared leaf :func:`distinit._guarded.wait_guarded`
(init's rendezvous thread waits the same way), and the handler's other waits on the store (the round's cards,
the acknowledgements of a verdict, three beats of a round too small) are :func:`distinit._guarded.poll_until`.
"""

from __future__ import annotations

import json
import logging
import socket
import threading
import time
from typing import Any, NoReturn

from torch.distributed import Store
from torch.distributed.elastic.rendezvous import (
    RendezvousClosedError,
    RendezvousConnectionError,
    RendezvousHandler,
    RendezvousInfo,
    RendezvousParameters,
    RendezvousTimeoutError,
    dynamic_rendezvous,
)
from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import C10dRendezvousBackend, create_backend

from distinit._guarded import Call, Interrupted, Stopped, poll_until, wait_guarded
from distinit._net import is_loopback
from distinit.rendezvous._card import (
    PREFIX,
    AgentCard,
    Beat,
    Disagreement,
    Status,
    claims,
    disagreements,
    launch_flags,
    local_card,
    round_cards,
)
from distinit.rendezvous._card import shared_machines as _shared_machines
from distinit.rendezvous._endpoint import DEFAULT_PORT, open_store, resolve, wait_for_store
from distinit.rendezvous._errors import AgentConfigMismatchError, AgentRoundTooSmallError
from distinit.rendezvous._explain import Snapshot, explain_closed, explain_lost, explain_timeout
from distinit.rendezvous._restart import (
    WorkerFailure,
    calling_agent,
    count_restart,
    failures_of,
    restart_count,
    restart_line,
    verdict_line,
)
from distinit.rendezvous._torch import RoundState, forget_agent_store, round_state, this_node

logger = logging.getLogger("distinit.rendezvous")

#: How often the waiting agent reads the other agents' cards (seconds).
POLL = 0.25
#: The largest agent card read (a card is about 1 KB); a larger value is skipped unparsed.
MAX_CARD_BYTES = 64 << 10
#: A heartbeat further than this in the reader's future is no heartbeat (clock skew between hosts is less).
MAX_SKEW = 60.0
#: An agent whose clock is off by more than this many seconds is named once (torch's keep-alive compares clocks).
SKEW_WARN = 5.0


#: How long a joined agent waits for the cards of the round's other participants (published before joining).
CARDS_WAIT = 10.0
#: Default of --rdzv-conf connect_timeout: how long a refused endpoint is waited on (the host agent may be late).
CONNECT_TIMEOUT = 30
#: How long an agent that found a disagreement stays up before it raises (seconds): the store may live in
#: this agent, and the other agents find the same disagreement only at their next read of the cards, at
#: least :data:`POLL` apart, so it stays for several reads. The meaning of :data:`distinit._board.LINGER`
#: (the store host staying up so that the others see a verdict), without the board: nobody publishes or
#: acknowledges a verdict here (each agent judges the cards itself), so the stay is a fixed span, not "until
#: every reader acknowledged".
LINGER = 2.0


def create(params: RendezvousParameters) -> RendezvousHandler:
    """A :class:`DistinitRendezvousHandler` for ``params`` (see :func:`distinit.rendezvous.create_handler`).

    Raises:
        AgentRendezvousConnectionError: the endpoint is unusable; the message says why.
    """
    store_host = False
    if (params.get("store_type", "tcp") or "tcp").strip().lower() != "tcp":
        backend, store = create_backend(params)  # a FileStore: nothing to probe
    else:
        store, decision = open_store(
            params.endpoint,
            configured_host=params.get_as_bool("is_host"),
            read_timeout=params.get_as_int("read_timeout", 60) or 60,
            refused_for=float(params.get_as_int("connect_timeout", CONNECT_TIMEOUT) or CONNECT_TIMEOUT),
            max_nodes=params.max_nodes,
        )
        backend = C10dRendezvousBackend(store, params.run_id)
        store_host = decision.host
    inner = dynamic_rendezvous.create_handler(store, backend, params)
    node = this_node(inner) or params.local_addr or socket.getfqdn()
    nproc, max_restarts = launch_flags()
    card = local_card(
        run_id=params.run_id,
        node=node,
        min_nodes=params.min_nodes,
        max_nodes=params.max_nodes,
        nproc_per_node=nproc,
        max_restarts=max_restarts,
        store_host=store_host,
    )
    endpoint_host = params.endpoint.rpartition(":")[0] or params.endpoint
    if params.max_nodes > 1 and not all(is_loopback(ip) for ip in resolve(endpoint_host)):
        _warn_loopback_node(node)  # an endpoint on loopback means one machine: loopback is fine there
    return DistinitRendezvousHandler(
        inner,
        store,
        card,
        endpoint=params.endpoint if ":" in params.endpoint else f"{params.endpoint}:{DEFAULT_PORT}",
        shared_endpoint=bool(params.get_as_bool("shared_endpoint", False)),
        beat_interval=float(params.get_as_int("keep_alive_interval", 5) or 5),
    )


def _warn_loopback_node(node: str) -> None:
    addresses = resolve(node)
    if addresses and all(is_loopback(ip) for ip in addresses):
        logger.warning(
            "this agent's node address %r resolves to %s (loopback): if it becomes rank 0, workers on other nodes "
            "get MASTER_ADDR=%r and connect to themselves; pass --local-addr=<an IP the other nodes reach>",
            node,
            ", ".join(addresses),
            node,
            extra={"distinit": {"event": "rendezvous.loopback_node", "node": node}},
        )


class DistinitRendezvousHandler(RendezvousHandler):
    """torch's dynamic rendezvous handler with a pre-flight, a config consensus and explained failures."""

    def __init__(
        self,
        inner: dynamic_rendezvous.DynamicRendezvousHandler,
        store: Store,
        card: AgentCard,
        *,
        endpoint: str,
        shared_endpoint: bool,
        beat_interval: float,
    ) -> None:
        self._inner = inner
        self._store = store
        self._card = card
        self._endpoint = endpoint
        self._shared_endpoint = shared_endpoint
        self._beat_interval = beat_interval
        self._index: int | None = None
        self._cards: dict[int, AgentCard] = {}
        self._too_many = False  # the card counter was past card_limit (said once)
        self._beats: dict[int, float] = {}
        self._future: set[int] = set()  # cards whose beat is beyond clock skew (never fresh, never stale)
        self._raw: dict[int, float] = {}  # each card's beat as last read (its writer's clock)
        self._skews: dict[int, float] = {}  # each card's clock minus this one, measured when its beat changed
        self._answered = False  # the store answered this agent once
        self._unanswered = 0  # store calls that failed since the last one that answered
        self._stop = threading.Event()
        self._beater: threading.Thread | None = None
        self._abandoned: threading.Thread | None = None
        self._rounds = 0
        self._previous: tuple[str, ...] = ()
        self._warned: set[str] = set()
        self._agent: Any | None = None  # torch's elastic agent calling this handler (see _restart)
        self._membership = False  # the last num_nodes_waiting() answered > 0: torch restarts uncounted
        self._uncounted = False  # ... and that restart could not be counted on this node
        self._ended: list[WorkerFailure] = []  # another agent's failures that ended the job (closed)
        self._closed_seen = False

    # -- torch's RendezvousHandler API -------------------------------------------------------------------------

    def get_backend(self) -> str:
        """``"distinit"``."""
        return "distinit"

    @property
    def use_agent_store(self) -> bool:
        """Whether workers reuse the agent's store (torch's choice, ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE``)."""
        return bool(self._inner.use_agent_store)

    def next_rendezvous(self) -> RendezvousInfo:
        """Join the next round; raise a named error at once on a disagreement, or an explained one at the end.

        Raises:
            AgentConfigMismatchError: agents disagree on a flag, a version or ``--rdzv-id``.
            AgentRendezvousTimeoutError: ``join_timeout`` passed; names who joined, who stopped, who never came.
            AgentRendezvousClosedError: another agent closed the rendezvous.
            AgentRendezvousConnectionError: the store became unreachable.
        """
        agent, result = calling_agent()
        self._agent = agent or self._agent
        ended = self._card.round
        if self._rounds and not self._membership and result is not None and result.is_failed():
            restart = restart_count(agent or self._agent)
            self._publish_failures(
                failures_of(
                    result,
                    agent=self._card.label,
                    node=self._card.node,
                    round_=ended,
                    restart=None if restart is None else restart - 1,
                )
            )
        if self._rounds:
            self._fresh_worker_store()
        self._publish("waiting")
        self._start_beats()
        start = time.monotonic()
        join = Call(self._inner.next_rendezvous, name="distinit-rendezvous-join")
        # No bound of ours: torch's join ends at its own deadline (join_timeout), with an error we explain.
        waited = wait_guarded(join, check=self._fatal_while_joining, every=self._poll_interval)
        if isinstance(waited, Interrupted):  # the agent's wait raised (a signal): torch's join runs on, a daemon
            raise waited.error
        if isinstance(waited, Stopped):
            self._abandoned = join.thread  # torch's join ends at its own deadline; this agent leaves now
            self._linger()
            raise self._mismatch(waited.reason)
        try:
            info = join.result()
        except BaseException as error:  # torch's error, explained (or raised as it is)
            self._fail(error, time.monotonic() - start)
        self._check_round()
        self._rounds += 1
        self._publish("joined")
        if self._rounds > 1:
            self._log_restart(ended)
        self._membership = self._uncounted = False
        return info

    def is_closed(self) -> bool:
        """See torch's ``RendezvousHandler.is_closed``."""
        return bool(self._inner.is_closed())

    def set_closed(self) -> None:
        """See torch's ``RendezvousHandler.set_closed``."""
        self._inner.set_closed()

    def num_nodes_waiting(self) -> int:
        """See torch's ``RendezvousHandler.num_nodes_waiting`` (called by the agent while its workers run).

        Raises:
            AgentRendezvousConnectionError: the store stopped answering (the agent hosting it went away).
        """
        try:
            waiting = int(self._inner.num_nodes_waiting())
        except RendezvousConnectionError as exc:
            raise self._lost(waiting=False) from exc
        state = self._state()
        if waiting and not self._membership:
            self._membership = True  # torch restarts this node's workers now, without counting it
            if any(node in self._previous for node in state.wait_list):
                # A participant re-joins: its workers failed. Count the restart here too, so that
                # TORCHELASTIC_RESTART_COUNT is the same on every node.
                self._uncounted = not count_restart(self._agent)
        elif not waiting and state.closed and not self._closed_seen:
            self._closed_seen = True  # the failed agent publishes its failures before it closes: read once
            self._ended = self._failures(self._card.round)
            if self._ended:  # another agent ended the job after a failure: stop this node's workers now
                self._acknowledge(self._card.round)
                self._membership = True
                return 1
        return waiting

    def get_run_id(self) -> str:
        """See torch's ``RendezvousHandler.get_run_id``."""
        return str(self._inner.get_run_id())

    def shutdown(self) -> bool:
        """Stop the heart-beat and close torch's rendezvous (not when a join was abandoned: it ends on its own).

        When this agent's workers failed with no restart left, it first publishes the failure and logs the
        verdict; after closing, it waits (at most ``CARDS_WAIT``) until the round's other agents have read it:
        the store may live in this agent, and they raise the same verdict.
        """
        self._stop.set()
        failed = self._publish_verdict()
        if self._abandoned is not None and self._abandoned.is_alive():
            return True
        closed = bool(self._inner.shutdown())
        if failed:
            self._await_acknowledgements(self._card.round)
        return closed

    def _publish_verdict(self) -> bool:
        """If torch's agent ends with failed workers (no restart left): publish them and log the verdict."""
        _, result = calling_agent()
        if result is not None and result.is_failed() and not self._ended:
            failures = failures_of(
                result,
                agent=self._card.label,
                node=self._card.node,
                round_=self._card.round,
                restart=restart_count(self._agent),
            )
            self._publish_failures(failures)
            self._publish("failed")
            logger.error(
                "%s",
                verdict_line(
                    run_id=self._card.run_id,
                    round_=self._card.round,
                    failures=failures,
                    max_restarts=self._card.max_restarts,
                ),
                extra={"distinit": {"event": "rendezvous.verdict", "round": self._card.round}},
            )
            return True
        return False

    def _acknowledge(self, round_: int) -> None:
        try:
            self._store.add(f"{PREFIX}/verdict-read/{round_}", 1)
        except (RuntimeError, ValueError) as exc:
            logger.debug("could not acknowledge the verdict of round %d: %s", round_, exc)

    def _await_acknowledgements(self, round_: int) -> None:
        """Wait (at most :data:`CARDS_WAIT` s) until the round's other agents acknowledged this agent's verdict."""
        others = len(self._previous) - 1

        def all_read() -> bool:
            return int(self._store.add(f"{PREFIX}/verdict-read/{round_}", 0)) >= others

        try:
            if not poll_until(all_read, every=POLL, until=time.monotonic() + CARDS_WAIT):
                logger.debug("%d agent(s) did not read the verdict of round %d in time", others, round_)
        except (RuntimeError, ValueError) as exc:
            logger.debug("could not wait for the verdict to be read: %s", exc)

    # -- cards and heart-beats ---------------------------------------------------------------------------------

    def _publish(self, status: Status) -> None:
        round_ = self._state().round
        self._card = self._card.with_status(status, round_)
        try:
            if self._index is None:
                self._index = int(self._store.add(f"{PREFIX}/count", 1))
            self._store.set(f"{PREFIX}/card/{self._index}", self._card.to_json())
            self._store.set(f"{PREFIX}/beat/{self._index}", str(time.time()))
        except (RuntimeError, ValueError) as exc:  # the consensus is best effort; torch's join reports the store
            self._unanswered += 1
            logger.debug("could not publish this agent's card: %s", exc)
        else:
            self._answered, self._unanswered = True, 0

    def _start_beats(self) -> None:
        if self._beater is not None or self._index is None:
            return
        key = f"{PREFIX}/beat/{self._index}"

        def beat() -> None:
            while not self._stop.wait(self._beat_interval):
                try:
                    self._store.set(key, str(time.time()))
                except (RuntimeError, ValueError) as exc:  # torch's keep-alive reports a lost store
                    self._unanswered += 1
                    logger.debug("heart-beat to the rendezvous store failed: %s", exc)

        self._beater = threading.Thread(target=beat, name="distinit-rendezvous-beat", daemon=True)
        self._beater.start()

    def _refresh(self) -> None:
        """Read every card and heart-beat on the store (JSON only; a card that does not validate is skipped).

        One ``check`` per agent not seen yet (a card, once set, stays), then one ``multi_get`` of them all.
        """
        try:
            count = int(self._store.add(f"{PREFIX}/count", 0))
            self._answered, self._unanswered = True, 0
            limit = card_limit(self._card.max_nodes)
            if count > limit and not self._too_many:
                # Something other than the job's agents counted (a store client's add(count, 10**6)): reading
                # every index would hang the agent and could exhaust its memory. Say so once, read the first.
                self._too_many = True
                logger.warning(
                    "rendezvous: the store counts %d agent cards, more than --nnodes=%d allows (%d read, the rest "
                    "ignored): another program writes to this rendezvous's store (%s)",
                    count,
                    self._card.max_nodes,
                    limit,
                    f"{PREFIX}/count",
                    extra={"distinit": {"event": "rendezvous.too_many_cards", "count": count, "limit": limit}},
                )
            new = [i for i in range(1, min(count, limit) + 1) if i != self._index and i not in self._cards]
            arrived = [i for i in new if self._store.check([f"{PREFIX}/card/{i}", f"{PREFIX}/beat/{i}"])]
            present = [*self._cards, *arrived]
            if not present:
                return
            keys = [f"{PREFIX}/card/{i}" for i in present] + [f"{PREFIX}/beat/{i}" for i in present]
            values = self._store.multi_get(keys)
        except (RuntimeError, ValueError) as exc:
            self._unanswered += 1
            logger.debug("could not read the other agents' cards: %s", exc)
            return
        for n, index in enumerate(present):
            try:
                if len(values[n]) > MAX_CARD_BYTES:  # a card is about 1 KB: never parse a bomb
                    raise ValueError(f"{len(values[n])} bytes, over {MAX_CARD_BYTES}")
                self._cards[index] = AgentCard.from_json(values[n])
                self._read_beat(index, float(values[len(present) + n]))
            except (ValueError, UnicodeDecodeError, RecursionError) as exc:
                logger.debug("skipping agent card %d on the store: %s", index, exc)

    def _read_beat(self, index: int, beat: float) -> None:
        """Record agent ``index``'s heart-beat (its own wall clock) as this agent's clock sees it.

        Clocks differ between machines, so a beat is never compared with this clock once it has changed: a
        beat that changed since the last read says the agent is alive now (``_beats`` holds this agent's time
        of the change). Only a beat first seen is taken at its word, capped at now. A static beat beyond
        :data:`MAX_SKEW` is no beat (a forged card: it would never go stale).
        """
        now = time.time()
        before = self._raw.get(index)
        self._raw[index] = beat
        changed = before is not None and beat != before
        future = beat > now + MAX_SKEW and not changed
        (self._future.add if future else self._future.discard)(index)
        if future:
            self._beats[index] = 0.0
        elif changed:
            self._beats[index] = now
            self._note_skew(index, beat - now)
        elif before is None:
            self._beats[index] = min(beat, now)

    def _note_skew(self, index: int, offset: float) -> None:
        """Warn once when agent ``index``'s clock is off by more than :data:`SKEW_WARN`.

        ``offset``: its beat minus this clock when the beat was seen to change; a beat is then at most one beat
        interval and one read old, which the lower bound allows for.
        """
        late = self._beat_interval + self._poll_interval()
        self._skews[index] = offset + late / 2  # the beat was written between 0 and ``late`` s before the read
        if -SKEW_WARN - late <= offset <= SKEW_WARN:
            return
        card = self._cards.get(index)
        label = card.label if card is not None else f"card {index}"
        way = "behind" if offset < 0 else "ahead of"
        self._warn_once(
            f"skew:{label}",
            "rendezvous %r: the clock of agent %s is about %.0f s %s this agent's (its heart-beats, read as they "
            "change). distinit does not compare clocks, but torch's rendezvous does (its keep-alive heart-beats), "
            "so it may count that agent dead and leave it out of a round; synchronise the clocks (chrony, NTP)",
            self._card.run_id,
            label,
            abs(offset),
            way,
        )

    def _poll_interval(self) -> float:
        """Seconds between reads of the cards: POLL, longer with many agents (each read fetches every card)."""
        return max(POLL, len(self._cards) / 64)

    def _fresh(self, index: int) -> bool:
        return self._beats.get(index, 0.0) >= time.time() - 3 * self._beat_interval

    def _beat(self, index: int) -> Beat:
        if index in self._future:
            return "future"
        return "fresh" if self._fresh(index) else "stale"

    def _others(self) -> list[tuple[AgentCard, Beat]]:
        return [(card, self._beat(index)) for index, card in sorted(self._cards.items())]

    def _watched(self) -> list[AgentCard]:
        """This agent, its job's live agents, and other jobs' live waiting agents (for the ``--rdzv-id`` check).

        Live: heart-beating. A dead agent's card stays on the store (an agent restarted with corrected flags
        must not be held to its predecessor's).
        """
        mine = self._card.run_id
        cards = [self._card]
        for index, card in self._cards.items():
            if self._fresh(index) and (card.run_id == mine or card.status == "waiting"):
                cards.append(card)
        return cards

    def _job_cards(self) -> list[AgentCard]:
        """This agent and the cards of its job (never one whose beat is from the future: a forged card)."""
        others = (card for i, card in self._cards.items() if card.run_id == self._card.run_id and i not in self._future)
        return [self._card, *others]

    def _report_foreign(self, foreign: list[AgentCard]) -> None:
        """Say once per card that a card on the store is no member of torch's round (it never fails the round)."""
        for card in foreign:
            key = f"foreign:{card.label}:{card.run_id}:{card.node}"
            if key in self._warned:
                continue
            self._warned.add(key)
            logger.warning(
                "rendezvous %r: a foreign card on the store: %s (node %s, --rdzv-id %r, torch %s) is no agent of "
                "torch's round, or claims one that has its own card; ignored (only the round's participants can "
                "fail it). Another program writes to this rendezvous's store (%s/card/...)",
                self._card.run_id,
                card.label,
                card.node,
                card.run_id,
                card.torch,
                PREFIX,
                extra={"distinit": {"event": "rendezvous.foreign_card", "card": card.label}},
            )

    def _fatal_while_joining(self) -> list[Disagreement] | None:
        """The check run while torch's join blocks: read the cards; the fatal disagreements, or None (wait on)."""
        self._refresh()
        return self._verdict_while_waiting() or None

    def _linger(self) -> None:
        """Stay up :data:`LINGER` s before raising a disagreement, so the others read the same cards first.

        The store may live in this agent; this card stays "waiting", so another job's agents still count it.
        A plain sleep, not a wait on the stop event: nothing sets that before this raise (torch's agent calls
        ``shutdown()`` after it), and a timed lock wait never times out under libfaketime, which the clock-skew
        test runs an agent under (measured: ``Event.wait(0.5)`` hangs there, ``time.sleep`` does not).
        """
        time.sleep(LINGER)

    def _verdict_while_waiting(self) -> list[Disagreement]:
        """The fatal disagreements among torch's participants of the round being joined; others are reported."""
        participants = self._state().participants
        members, foreign = round_cards(self._card, self._others(), participants, formed=False)
        self._report_foreign(foreign)
        fatal = [d for d in disagreements(members) if d.fatal]
        if not fatal:
            for d in disagreements(self._watched(), shared_endpoint=self._shared_endpoint):
                if d.fatal:
                    self._warn_once(
                        f"waiting:{d.field}",
                        "rendezvous %r: cards on the store disagree with this agent (%s), not fatal: not all of "
                        "these agents are in torch's round, and only its participants can fail it: %s",
                        self._card.run_id,
                        self._card.label,
                        d.describe(),
                    )
        return fatal

    def _lost(self, *, waiting: bool) -> Exception:
        """The store stopped answering: name the agent that hosted it (from the cards read while it answered)."""
        return explain_lost(self._endpoint, self._card, self._job_cards()[1:], round_=self._card.round, waiting=waiting)

    # -- verdicts ----------------------------------------------------------------------------------------------

    def _mismatch(self, found: list[Disagreement]) -> AgentConfigMismatchError:
        first = found[0]
        lines = [
            f"the agents of rendezvous {self._card.run_id!r} at {self._endpoint} disagree; this agent: "
            f"{self._card.label}."
        ]
        lines.extend(f"  {d.describe()}" for d in found[:6])
        if first.field == "--rdzv-id":
            why = "two jobs wait on one endpoint: each agent only joins agents with its own --rdzv-id"
            fix = "pass the same --rdzv-id on every node (or --rdzv-conf shared_endpoint=1 if both jobs are meant)"
        elif first.field in ("torch", "python", "distinit"):
            why = f"the nodes run different {first.field} versions (different images or environments)"
            fix = f"install the same {first.field} on every node"
        else:
            why = f"the nodes were started with different {first.field} (e.g. a per-node script or variable)"
            fix = f"pass the same {first.field} to torchrun on every node"
        exc = AgentConfigMismatchError("\n".join(lines), why=why, fix=fix, master=self._endpoint)
        exc.field = first.field
        return exc

    def _check_round(self) -> None:
        """After a round formed: every participant's card agrees with ours, the same verdict on every agent."""
        state = self._state()
        if state.known and 0 < len(state.participants) < self._card.min_nodes:
            self._publish("failed")
            raise self._too_small(state)

        def every_card_read() -> bool:
            self._refresh()
            return state.known and len(self._round_cards(state)[0]) >= len(state.participants)

        poll_until(every_card_read, every=POLL, until=time.monotonic() + CARDS_WAIT)
        cards, foreign = self._round_cards(state)
        self._report_foreign(foreign)
        found = disagreements(cards)
        fatal = [d for d in found if d.fatal]
        if fatal:
            self._publish("failed")
            raise self._mismatch(fatal)
        for d in found:
            self._warn_once(d.field, "agents of %r differ: %s", self._card.run_id, d.describe())
        for labels in _shared_machines(cards):
            self._warn_once(
                "machine",
                "agents %s run on one machine (same boot_id and network namespace) as different nodes: fine for a "
                "test, but on a cluster it usually means torchrun was started twice on one node",
                ", ".join(labels),
            )
        self._previous = state.participants

    def _round_cards(self, state: RoundState) -> tuple[list[AgentCard], list[AgentCard]]:
        """The cards of the formed round's participants, and the foreign ones among those read.

        When torch's state is not readable (another torch), every card of this job is checked: a stale agent
        may be named too, but a disagreement is never missed.
        """
        if not state.known:
            return self._job_cards(), []
        return round_cards(self._card, self._others(), state.participants, formed=True, waiting=state.wait_list)

    def _too_small(self, state: RoundState) -> AgentRoundTooSmallError:
        """Torch formed a round below ``--nnodes``' minimum: which live agents it left out, and their clocks.

        The job's cards are read for three beats first, so that each live agent's beat is seen to change
        (alive, by this agent's clock) and its clock offset is measured.
        """

        def read_on() -> bool:
            self._refresh()
            return False  # every live agent's beat must be seen to change: read for the whole span

        poll_until(read_on, every=POLL, until=time.monotonic() + 3 * self._beat_interval + POLL)
        run_id = self._card.run_id
        left = [
            (card.label, self._skews.get(index))
            for index, card in sorted(self._cards.items())
            if card.run_id == run_id and self._fresh(index) and not claims(card, state.participants)
        ]
        named = "; ".join(
            label + ("" if off is None else f" (its clock about {abs(off):.0f} s {'behind' if off < 0 else 'ahead'})")
            for label, off in left
        )
        skewed = any(off is not None and abs(off) > SKEW_WARN for _, off in left)
        exc = AgentRoundTooSmallError(
            f"torch formed round {state.round} of rendezvous {run_id!r} at {self._endpoint} with "
            f"{len(state.participants)} agent(s), fewer than the --nnodes minimum of {self._card.min_nodes}: its "
            f"workers would run a world of the wrong size. Live agents of this job left out: {named or 'none seen'}.",
            why="torch's rendezvous counts an agent dead when its keep-alive heart-beat, stamped with that agent's "
            "own wall clock, looks older than keep_alive_interval x keep_alive_max_attempt by this agent's clock"
            + (": the clocks of these machines differ" if skewed else "; an agent was dropped after it joined"),
            fix="synchronise the clocks of every node (chrony, NTP); a larger --rdzv-conf keep_alive_max_attempt "
            "only hides a skew smaller than it",
            master=self._endpoint,
        )
        exc.left_out = tuple(label for label, _ in left)
        return exc

    def _warn_once(self, key: str, message: str, *args: object) -> None:
        if key in self._warned:
            return
        self._warned.add(key)
        logger.warning(message, *args, extra={"distinit": {"event": "rendezvous.note", "about": key}})

    def _fresh_worker_store(self) -> None:
        """Give the next round's workers a new TCPStore (torch reuses the first round's for every round).

        With ``use_agent_store``, torch's handler serves the workers' store from the agent of the first round's
        rank 0 and hands the same address to every later round, keys and all. The workers' keys carry no round,
        so a restarted worker reads its peers' addresses from the dead round and gloo fails with ``Connection
        refused`` or waits on a peer that never comes. Forgetting the server makes torch start a new one for the
        new round (on its new rank 0) and publish its port under the round's prefix.
        """
        if self.use_agent_store:
            forget_agent_store(self._inner)

    def _log_restart(self, ended: int) -> None:
        count = restart_count(self._agent)
        line = restart_line(
            run_id=self._card.run_id,
            ended=ended,
            formed=self._card.round,
            nodes=len(self._previous),
            failures=self._failures(ended),
            count=count,
            max_restarts=self._card.max_restarts,
            uncounted=self._uncounted,
        )
        logger.warning(
            "%s",
            line,
            extra={"distinit": {"event": "rendezvous.restart", "round": self._card.round, "restart": count}},
        )

    def _publish_failures(self, failures: list[WorkerFailure]) -> None:
        """This agent's failed workers of a round, as JSON on the store (before it re-joins or leaves)."""
        if self._index is None or not failures:
            return
        payload = json.dumps([failure.to_object() for failure in failures])
        try:
            self._store.set(f"{PREFIX}/failure/{failures[0].round}/{self._index}", payload)
        except (RuntimeError, ValueError) as exc:
            logger.debug("could not publish this agent's failed workers: %s", exc)

    def _failures(self, round_: int) -> list[WorkerFailure]:
        """Every agent's published failures of round ``round_`` (JSON; a record that does not validate is skipped)."""
        try:
            count = int(self._store.add(f"{PREFIX}/count", 0))
            keys = [f"{PREFIX}/failure/{round_}/{i}" for i in range(1, count + 1)]
            present = [key for key in keys if self._store.check([key])]
            values = self._store.multi_get(present) if present else []
        except (RuntimeError, ValueError) as exc:
            logger.debug("could not read the failed workers of round %d: %s", round_, exc)
            return []
        found: list[WorkerFailure] = []
        for value in values:
            try:
                found.extend(WorkerFailure.from_object(item) for item in json.loads(value))
            except (ValueError, UnicodeDecodeError, TypeError, RecursionError) as exc:
                logger.debug("skipping a failure record on the store: %s", exc)
        return found

    def _state(self) -> RoundState:
        return round_state(self._inner)

    def _fail(self, error: BaseException, waited: float) -> NoReturn:
        self._refresh()
        lost = self._answered and self._unanswered > 0  # the store answered, then stopped: its host left
        if lost and isinstance(error, RendezvousTimeoutError):
            raise self._lost(waiting=True) from error
        if isinstance(error, RendezvousTimeoutError):
            self._publish("failed")
            state = self._state()
            now = time.time()
            mine = [
                (i, card)
                for i, card in self._cards.items()
                if card.run_id == self._card.run_id and i not in self._future
            ]
            cards = [self._card, *(card for _, card in mine)]
            beats = {0: now, **{n: self._beats.get(i, card.started) for n, (i, card) in enumerate(mine, start=1)}}
            snap = Snapshot(
                run_id=self._card.run_id,
                endpoint=self._endpoint,
                round=state.round,
                min_nodes=self._card.min_nodes,
                max_nodes=self._card.max_nodes,
                participants=state.participants,
                wait_list=state.wait_list,
                torch_state=state.known,
                waited=waited,
                join_timeout=self._inner.settings.timeout.join.total_seconds(),
                cards=tuple(cards),
                beats=beats,
                beat_interval=self._beat_interval,
                now=now,
            )
            raise explain_timeout(snap) from error
        if isinstance(error, RendezvousClosedError):
            failures = self._ended or self._failures(self._card.round)
            ended = (
                verdict_line(
                    run_id=self._card.run_id,
                    round_=self._card.round,
                    failures=failures,
                    max_restarts=self._card.max_restarts,
                )
                if failures
                else None
            )
            raise explain_closed(
                self._card.run_id, self._endpoint, self._state().round, self._job_cards(), ended=ended
            ) from error
        if isinstance(error, RendezvousConnectionError):
            participants = self._state().participants
            members, _ = round_cards(self._card, self._others(), participants, formed=False)
            fatal = [d for d in disagreements(members) if d.fatal]
            if fatal:  # the agent hosting the store found it first and left
                raise self._mismatch(fatal) from error
            if lost:
                raise self._lost(waiting=True) from error
            host, _, port = self._endpoint.rpartition(":")
            try:
                wait_for_store(host, int(port), resolve(host), refused_for=0.0)
            except RendezvousConnectionError as verdict:
                raise verdict from error
        raise error


def card_limit(max_nodes: int) -> int:
    """How many agent cards an agent reads at most (never what a stray ``add`` on the counter says).

    The agents of this job (a restarted agent registers again) and a few of other jobs sharing the store.
    """
    return 4 * max(1, max_nodes) + 64
