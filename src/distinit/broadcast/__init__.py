"""Safe typed broadcast: tensors, typed objects without pickle, whole models; checked on every rank.

Every call first exchanges one small fixed-size header among all ranks of the group, so a
mismatch (src, dtype, shape, device type, schema, key set, call order) raises the same
:class:`~distinit.errors.BroadcastMismatchError` on every rank instead of hanging, corrupting
data or aborting a process. See ``docs/broadcast.md``.
"""

from distinit.broadcast._module import broadcast_module, flatten_module_
from distinit.broadcast._object import broadcast_object
from distinit.broadcast._state_dict import broadcast_state_dict
from distinit.broadcast._tensor import broadcast_tensor

__all__ = ["broadcast_module", "broadcast_object", "broadcast_state_dict", "broadcast_tensor", "flatten_module_"]
