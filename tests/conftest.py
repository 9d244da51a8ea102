"""Root conftest: only what must be declared at the top of the tree.

``pytester`` (used to test the distinit pytest plugin through real pytest sessions) can only be
enabled from the rootdir's conftest; declaring it in a sub-directory fails collection of the whole suite.
"""

pytest_plugins = ["pytester"]
