"""The transports of a verified call's payload: which one (``choose``), its bytes (``pack``), ``shm`` and ``file``.

``choose`` reads the ``via=`` option, agrees the route on every rank and moves the payload by shared memory
or a file (or leaves it to the network path); ``pack`` holds what every transport shares (wire views, staging
copies, the packed layout, status exchanges); ``creator`` tags every name the transports make with its
creating process, so ``distinit doctor`` can prove a leftover's creator gone.
"""
