"""MASTER_ADDR and MASTER_PORT: the exported values win, then the launcher's, then what the layout proves."""

from __future__ import annotations

import ipaddress

from distinit._port import PORT_ADVICE, check_port, master_addr_fix
from distinit._text import decimal, quoted
from distinit.env._draft import Draft, Vars
from distinit.errors import MalformedEnvError


def fill_master(v: Vars, draft: Draft, *, here: str) -> None:
    """MASTER_ADDR: exported > launcher/platform host > 127.0.0.1 when the world is on this node > None.

    MASTER_PORT: exported > the launcher's or a derived port > None (noted for a world of several).

    Raises:
        MalformedEnvError: MASTER_ADDR is not a host (spaces, a scheme, a port), or MASTER_PORT is not a
            TCP port.
    """
    address = v.text("MASTER_ADDR")
    if address is not None:
        _check_address(address)
        draft.put("master_addr", address, "MASTER_ADDR")
    elif draft.master_addr is None:
        if draft.world_size == 1 or draft.local_world_size == draft.world_size or draft.num_nodes == 1:
            draft.put("master_addr", "127.0.0.1", "rule: whole world on this node")
        elif draft.world_size > 1:
            draft.note(
                "MASTER_ADDR is unknown: the launcher does not say which host runs rank 0, so export() and "
                f"distinit.setup() refuse this world; {master_addr_fix(draft.launcher)}"
            )
    port = v.integer("MASTER_PORT", minimum=None)  # check_port names the TCP range
    if port is not None:
        check_port(port, where=here)
        draft.put("master_port", port, "MASTER_PORT")
    elif draft.master_port is None and draft.world_size > 1:
        draft.note(f"MASTER_PORT is unknown: {PORT_ADVICE}")


def _check_address(address: str) -> None:
    if any(char.isspace() for char in address) or "://" in address:
        raise MalformedEnvError(
            f"MASTER_ADDR={quoted(address)} is not a host name or address.",
            variables=("MASTER_ADDR",),
            fix="export MASTER_ADDR as rank 0's host name or IP address, without scheme or spaces.",
        )
    host, sep, port = address.rpartition(":")
    if sep and decimal(port) is not None and not _is_ipv6(address):
        raise MalformedEnvError(
            f"MASTER_ADDR={quoted(address)} includes a port.",
            variables=("MASTER_ADDR", "MASTER_PORT"),
            fix=f"export MASTER_ADDR={host[:200]} and MASTER_PORT={port[:20]} separately.",
        )


def _is_ipv6(address: str) -> bool:
    try:
        return ipaddress.ip_address(address.strip("[]")).version == 6
    except ValueError:
        return False
