"""``Tracer``: RLinf's span API (``trace_begin``/``trace_end``/``trace_span``/``trace_func``) on rlinf's timeline.

RLinf's ``Tracer`` is a cluster manager that appends Chrome trace events to a
JSONL file when ``cluster.tracer.enable`` is set; its class methods are
no-ops until then.  Here the same calls record into the timeline every
process already keeps (``rlinf.scheduler.tracing``): a span marked in a
worker lands on that worker's track, on the thread (or ``asyncio`` task) that
marked it, next to its calls, timers and messages, in the one trace file.
They do nothing while tracing is off in the process; tracing is on with
``RLINF_TRACE=path``, inside ``with cluster.trace(path):``, or, as in RLinf,
with ``Cluster(cluster_cfg={..., "tracer": {"enable": True, "output_file":
"trace_events.jsonl"}})``, which writes RLinf's JSONL file when the driver
exits.  Any trace path ending in ``.jsonl`` is written as JSONL.

``Tracer(path)`` is RLinf's manager itself, as RLinf builds it from the
config: ``record(event)`` appends one Chrome trace event (a dict) as a line of
the JSONL file at ``path``, and ``finalize()`` closes the file and returns its
absolute path.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import os
import threading
from typing import Any, Callable, Optional

from ..tracing import recorder, spans


class Tracer:
    """RLinf's tracer: class methods marking spans on the timeline (no-ops while tracing is off)."""

    MANAGER_NAME = "Tracer"

    def __init__(self, output_file: str = "trace_events.jsonl"):
        """RLinf's tracer manager: a JSONL file of Chrome trace events, opened for appending.

        Args:
            output_file (str | os.PathLike): the file (made if missing; events are appended).

        Raises:
            TypeError: ``output_file`` is not a path.
            OSError: the file cannot be opened, or is a symbolic link (never followed: in a shared
                folder another user could point one at a file of ours).
        """
        if not isinstance(output_file, (str, os.PathLike)):
            raise TypeError(f"output_file must be a path, got {type(output_file).__name__}")
        self._path = os.path.abspath(os.fspath(output_file))
        folder = os.path.dirname(self._path)
        if folder:
            os.makedirs(folder, exist_ok=True)
        fd = os.open(self._path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        self._file = os.fdopen(fd, "a", encoding="utf-8")
        self._write_lock = threading.Lock()

    @property
    def output_file(self) -> str:
        """The JSONL file's absolute path."""
        return self._path

    def record(self, event: dict) -> None:
        """Append one Chrome trace event (``name``, ``ph``, ``ts``, ``pid``, ``tid``, ...) as a JSON line.

        Args:
            event: the event; JSON-ready values.

        Raises:
            TypeError: ``event`` is not a dict or not JSON-ready.
            RuntimeError: the tracer was finalized.
        """
        if not isinstance(event, dict):
            raise TypeError(f"event must be a dict, got {type(event).__name__}")
        line = json.dumps(event) + "\n"
        with self._write_lock:
            if self._file is None:
                raise RuntimeError(f"Tracer({self._path!r}) is finalized: it records no more events")
            self._file.write(line)

    def finalize(self) -> str:
        """Flush and close the file (again: nothing more); returns its absolute path."""
        with self._write_lock:
            if self._file is not None:
                self._file.close()
                self._file = None
        return self._path

    @classmethod
    def is_enabled(cls) -> bool:
        """Whether this process records now (spans marked now will appear in the trace)."""
        return recorder.is_on()

    @classmethod
    def trace_begin(cls, name: str, cat: str = "default", args: Optional[dict] = None) -> None:
        """Open span ``name`` (Chrome trace ``B``); nothing while tracing is off.

        Args:
            name: the span's name.
            cat: its category (``cat`` on the timeline).
            args: JSON-ready values shown with it.

        Raises:
            TypeError: a name or category that is not a str, or args that are not a dict.
        """
        spans.begin(name, cat, args)

    @classmethod
    def trace_end(cls, name: str, cat: str = "default") -> None:
        """Close the innermost open span ``name`` (Chrome trace ``E``); nothing if none is open here.

        Args:
            name: the name given to ``trace_begin``.
            cat: accepted for RLinf's signature; the span keeps the category it was opened with.
        """
        spans.end(name, cat)

    @classmethod
    @contextlib.contextmanager
    def trace_span(cls, name: str, cat: str = "default", args: Optional[dict] = None):
        """Context manager: the ``with`` block as one span, closed even if it raises.

        Args:
            name: the span's name.
            cat: its category.
            args: JSON-ready values shown with it.

        Raises:
            TypeError: a name or category that is not a str, or args that are not a dict.

        Example:
            ```python
            with Tracer.trace_span("rollout", cat="env"):
                run_episode()
            ```
        """
        spans.begin(name, cat, args)
        try:
            yield
        finally:
            spans.end(name, cat)

    @classmethod
    def trace_func(cls, func_or_cat: Any = None, cat: str = "default") -> Callable:
        """Decorator: each call of the function is a span named after it.

        ``@Tracer.trace_func``, ``@Tracer.trace_func()``, ``@Tracer.trace_func("cat")`` and
        ``@Tracer.trace_func(cat="cat")`` all work; coroutine functions are spanned until they return.

        Args:
            func_or_cat: the function (used bare), a category (a str), or None.
            cat: the category when ``func_or_cat`` is not one.
        """
        category = func_or_cat if isinstance(func_or_cat, str) else cat

        def decorate(fn: Callable) -> Callable:
            if asyncio.iscoroutinefunction(fn):

                @functools.wraps(fn)
                async def traced_async(*args, **kwargs):
                    with cls.trace_span(fn.__name__, cat=category):
                        return await fn(*args, **kwargs)

                return traced_async

            @functools.wraps(fn)
            def traced(*args, **kwargs):
                with cls.trace_span(fn.__name__, cat=category):
                    return fn(*args, **kwargs)

            return traced

        if callable(func_or_cat):
            return decorate(func_or_cat)
        return decorate
