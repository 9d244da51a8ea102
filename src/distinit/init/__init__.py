"""Rendezvous that survives late workers and diagnoses misconfiguration in seconds."""

from distinit.init._api import init_with_retry
from distinit.init._backoff import Backoff
from distinit.init._report import AttemptRecord, InitReport
from distinit.init._setup import SetupResult, setup, teardown

__all__ = ["AttemptRecord", "Backoff", "InitReport", "SetupResult", "init_with_retry", "setup", "teardown"]
