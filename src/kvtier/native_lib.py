"""Loading kvtier's optional C extensions (built by ``pip install``, used through ctypes).

Each extension has a Python fallback; this module decides, in one place, whether the
native library is used: not when its environment switch is ``0``, nor when it was not
built (no compiler at install time) or cannot be loaded.
"""

from __future__ import annotations

import ctypes
import importlib.util
import logging
import os

log = logging.getLogger("kvtier")


def load_native(module: str, switch: str, fallback: str) -> ctypes.CDLL | None:
    """The shared library of the extension ``module`` (e.g. ``"kvtier._keychain"``), or
    None: ``switch`` (an environment variable) is ``"0"``, the extension is not built
    (logged at info level), or it does not load (a warning). ``fallback`` names what runs
    instead, for those log lines. Never raises."""
    if os.environ.get(switch, "1") == "0":
        return None
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None:
        log.info("kvtier: %s not built; using %s", module, fallback)
        return None
    try:
        return ctypes.CDLL(spec.origin)
    except OSError:
        log.warning("kvtier: cannot load %s; using %s", spec.origin, fallback)
        return None
