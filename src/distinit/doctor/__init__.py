"""``distinit doctor``: find what will make a distributed job hang, in seconds, before it runs.

``run_from_args``, ``gather_json`` and ``destroy_world`` are exported for ``distinit.cli`` (the doctor's
command-line face and ``distinit env --check``); they are not part of the public surface (``__all__``).
"""

from distinit.doctor._cli import run_from_args as run_from_args
from distinit.doctor._exchange import destroy_world as destroy_world
from distinit.doctor._exchange import gather_json as gather_json
from distinit.doctor._model import Check, DoctorReport, Status
from distinit.doctor._run import run

__all__ = ["Check", "DoctorReport", "Status", "run"]
