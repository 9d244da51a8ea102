"""``distinit doctor``: find what will make a distributed job hang, in seconds, before it runs."""

from distinit.doctor._model import Check, DoctorReport, Status
from distinit.doctor._run import run

__all__ = ["Check", "DoctorReport", "Status", "run"]
