"""Rendezvous that survives late workers and diagnoses misconfiguration in seconds."""

from distinit.init._api import SetupResult, init_with_retry, setup, teardown

# For distinit's other packages (the doctor, the Lightning integration), not for users: not in __all__.
from distinit.init._api import lost_peer as lost_peer
from distinit.init._loopback import check_advertised_address as check_advertised_address
from distinit.init._policy import AttemptFailed as AttemptFailed
from distinit.init._policy import Backoff
from distinit.init._policy import Unsupported as Unsupported
from distinit.init._report import AttemptRecord, InitReport
from distinit.init._store import connect_store as connect_store
from distinit.init._store import host_store as host_store

__all__ = ["AttemptRecord", "Backoff", "InitReport", "SetupResult", "init_with_retry", "setup", "teardown"]
