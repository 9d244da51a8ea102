"""Pure tests of :func:`distinit.init._policy.nature`: which foreign errors a retry may cure (issue 35)."""

from __future__ import annotations

import errno

import pytest
import torch.distributed as dist

from distinit.errors import MalformedEnvError, RendezvousError
from distinit.init import _messages
from distinit.init._policy import Unsupported, nature

LIBUV = (
    "The libuv TCPStore backend does not support initialization with an listen fd. Please switch to the legacy "
    'TCPStore by setting environment variable USE_LIBUV to "0".'
)


@pytest.mark.parametrize(
    "exc",
    [
        ConnectionRefusedError(errno.ECONNREFUSED, "Connection refused"),
        ConnectionResetError(errno.ECONNRESET, "Connection reset by peer"),
        TimeoutError("timed out"),
        OSError(errno.EADDRINUSE, "Address already in use"),
        RuntimeError("Socket Timeout"),
        dist.DistError("the store went away"),
        dist.DistNetworkError("Connection reset by peer"),
        RuntimeError("something torch said that we do not know"),  # unknown: retried, as before
        KeyError("state"),
    ],
    ids=repr,
)
def test_transient_failures_are_retried(exc: BaseException) -> None:
    assert nature(exc) == "transient"


@pytest.mark.parametrize(
    "exc",
    [
        NotImplementedError(LIBUV),  # a RuntimeError: tested before the transient families
        TypeError("__init__(): incompatible constructor arguments"),
        AttributeError("module 'torch.distributed' has no attribute 'DistError'"),
        ImportError("cannot import name 'default_pg_nccl_timeout'"),
        ValueError("Invalid backend: 'glo'"),
        PermissionError(errno.EACCES, "Permission denied"),
        OSError(errno.EPERM, "Operation not permitted"),
    ],
    ids=repr,
)
def test_deterministic_failures_end_the_call(exc: BaseException) -> None:
    assert nature(exc) == "deterministic"


def test_our_own_errors_are_never_foreign() -> None:
    # MalformedEnvError is a ValueError, but it is a verdict of ours, raised as it is.
    assert nature(MalformedEnvError("bad", variables=("X",))) == "transient"
    assert nature(RendezvousError("bad")) == "transient"


def test_unsupported_names_the_step_and_the_cause() -> None:
    failure = Unsupported("host the store on port 29500", NotImplementedError(LIBUV))
    assert str(failure).startswith("cannot host the store on port 29500: NotImplementedError: The libuv")
    verdict = _messages.unsupported(step=failure.step, master="127.0.0.1:29500", cause="NotImplementedError: x", rank=0)
    assert isinstance(verdict, RendezvousError)
    assert verdict.rank == 0 and verdict.master == "127.0.0.1:29500"
    assert "rank 0 cannot host the store on port 29500" in verdict.what and "Not retried" in verdict.what
    assert verdict.why and verdict.fix
    # it travels the store as a verdict, the same on every rank
    again = _messages.verdict_from_json(_messages.verdict_to_json(verdict), rank=1)
    assert type(again) is RendezvousError and again.what == verdict.what and again.rank == 1
