"""Plug-ins that hand distinit's resolved world to training frameworks.

Each framework lives in its own module and imports that framework only when the module itself is
imported, so ``import distinit`` and ``import distinit.integrations`` stay free of Lightning and torch:

- :mod:`distinit.integrations.lightning`: ``DistinitEnvironment``, a Lightning ``ClusterEnvironment``.
"""
