"""Environment knobs, read in one place so that every module agrees on them."""

from __future__ import annotations

import math
import os

#: seconds a blocking communication operation waits before raising TimeoutError
TIMEOUT_ENV = "RLINF_TIMEOUT"
#: seconds launch waits for workers to start and construct
LAUNCH_TIMEOUT_ENV = "RLINF_LAUNCH_TIMEOUT"
LAUNCHER_ENV = "RLINF_LAUNCHER"
TRANSPORT_ENV = "RLINF_TRANSPORT"
AUTOLOAD_ENV = "RLINF_PLUGINS_AUTOLOAD"
PLUGINS_ENV = "RLINF_PLUGINS"
#: set by core in worker processes: the plugins the driver loaded, so workers skip discovery
PLUGIN_SOURCES_ENV = "RLINF_PLUGIN_SOURCES"
#: variables core sets in each worker for that worker alone: never forwarded to the groups it launches
WORKER_ONLY_ENV = frozenset({PLUGIN_SOURCES_ENV, "RLINF_WORKER_ACCELERATOR", "RLINF_ISOLATE_GPU"})
#: seconds a launcher keeps collecting other ranks' outcomes after one rank failed,
#: so that the root cause (not its echo on a peer) is the error reported
ERROR_GRACE_ENV = "RLINF_ERROR_GRACE"
DEFAULT_ERROR_GRACE = 2.0

#: seconds a point-to-point link may stay unused before its sender closes it (reopened on the next send)
IDLE_LINK_TIMEOUT_ENV = "RLINF_IDLE_LINK_TIMEOUT"
DEFAULT_IDLE_LINK_TIMEOUT = 300.0  # 0 in the environment: never

DEFAULT_TIMEOUT = 1800.0
DEFAULT_LAUNCH_TIMEOUT = 300.0


#: CPython on POSIX: the bytes mapping behind os.environ (None elsewhere: use os.environ)
_ENVIRON_BYTES = getattr(os.environ, "_data", None) if os.name == "posix" else None
_encoded: dict = {}


def getenv(name: str):
    """``os.environ.get(name)`` for hot paths: about 25x cheaper, and it still sees later changes."""
    data = _ENVIRON_BYTES
    if data is None:
        return os.environ.get(name)
    key = _encoded.get(name)
    if key is None:
        key = _encoded[name] = os.fsencode(name)
    value = data.get(key)
    return None if value is None else os.fsdecode(value)


def _float_env(name: str, default: float) -> float:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"environment variable {name}={raw!r} is not a number of seconds") from None
    if not math.isfinite(value) or value <= 0:  # NaN compares false with everything: refuse it by name
        raise ValueError(f"environment variable {name}={raw!r} must be a positive, finite number of seconds")
    return value


def _finite_env(name: str, default: float) -> float:
    """Like ``_float_env`` but zero and negative values pass (settings where they mean "at once" or "off")."""
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"environment variable {name}={raw!r} is not a number of seconds") from None
    if not math.isfinite(value):
        raise ValueError(f"environment variable {name}={raw!r} must be a finite number of seconds")
    return value


_timeout_cache: dict = {}


def default_timeout() -> float:
    raw = getenv(TIMEOUT_ENV)
    value = _timeout_cache.get(raw)
    if value is None:
        value = _timeout_cache[raw] = _float_env(TIMEOUT_ENV, DEFAULT_TIMEOUT)
    return value


def error_grace() -> float:
    return _float_env(ERROR_GRACE_ENV, DEFAULT_ERROR_GRACE)


def idle_link_timeout() -> float:
    """Seconds before an unused link is closed; ``inf`` (never) for 0."""
    try:
        never = float(os.environ.get(IDLE_LINK_TIMEOUT_ENV, "1")) == 0.0
    except ValueError:
        never = False  # _float_env says what is wrong with it
    if never:
        return math.inf
    return _float_env(IDLE_LINK_TIMEOUT_ENV, DEFAULT_IDLE_LINK_TIMEOUT)


def launch_timeout() -> float:
    return _float_env(LAUNCH_TIMEOUT_ENV, DEFAULT_LAUNCH_TIMEOUT)


#: the longest timeout taken (about 31 years): waits built on it stay within what the OS accepts
MAX_TIMEOUT = 1e9


def check_timeout(timeout, what: str = "timeout"):
    """``None`` (no explicit timeout) or ``timeout`` as a positive, finite float.

    Raises ``TypeError`` for anything that is not a real number (``bool``
    included: ``True`` is not "one second") and ``ValueError`` for NaN,
    infinities, zero and negatives.  NaN must be refused explicitly: it
    compares false with everything, so ``nan <= 0`` lets it through and a
    deadline of ``now + nan`` never arrives, nor expires.
    """
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
        raise TypeError(f"{what} must be a number of seconds, got {timeout!r}")
    try:
        value = float(timeout)
    except OverflowError:  # an int beyond float's range
        value = math.inf
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{what} must be a positive, finite number of seconds, got {timeout!r}")
    if value > MAX_TIMEOUT:  # the OS's waits overflow past ~292 years; nobody means more than this
        raise ValueError(f"{what} must be at most {MAX_TIMEOUT:.0f} seconds, got {timeout!r}")
    return value


def resolve_timeout(timeout: float | None) -> float:
    """An explicit timeout, validated, or the configured default."""
    if timeout is None:
        return default_timeout()
    return check_timeout(timeout)


def autoload_enabled() -> bool:
    return os.environ.get(AUTOLOAD_ENV, "1").strip().lower() not in ("0", "false", "no", "off")
