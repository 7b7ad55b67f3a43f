"""In-tree backends, installed as `polymorph.backends.<name>`.

The registry (polymorph/pipeline/backend.py) finds each package of this folder whose `__init__.py`
binds a Backend subclass to `BACKEND`, without importing it; shared glue (gpu/) and modules
(device_probe.py, torch_bridge.py) bind none and are not backends.
"""
