"""``python -m distinit.rendezvous``: torchrun, with the ``distinit`` rendezvous backend registered first.

``pip install distinit`` registers the backend through the ``torchrun.handlers`` entry point, but torch loads
those entry points only from torch 2.5: on torch 2.4 ``torchrun --rdzv-backend=distinit`` fails at once with
torch's "The rendezvous backend 'distinit' is not registered". This command registers the backend in the
agent's own process in torch's public ``rendezvous_handler_registry`` and then runs torchrun's ``main``
with the same arguments, so ``python -m distinit.rendezvous --rdzv-backend=distinit ... train.py`` works on
every supported torch, and on torch >= 2.5 is the same command as ``torchrun`` (the entry point registered
the same creator already; torch accepts it twice). See docs/torchrun.md and docs/compat.md.
"""

from __future__ import annotations

from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> None:
    """Register the ``distinit`` backend, then run torchrun with ``argv`` (default: this process's arguments).

    torchrun's ``main`` exits the process itself when a worker group fails (``ChildFailedError``), as the
    ``torchrun`` command does.
    """
    from torch.distributed.elastic.rendezvous import rendezvous_handler_registry
    from torch.distributed.run import main as torchrun_main

    from distinit.rendezvous._entry import create_handler

    rendezvous_handler_registry.register("distinit", create_handler)
    torchrun_main(None if argv is None else list(argv))


if __name__ == "__main__":
    main()
