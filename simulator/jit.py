"""numba, loaded when a compiled loop first runs, and its start paid once per process.

The simulator's inner loops (a FCFS station's heap, the compiled batch scheduler, the front
end's event loop, the timeline's pass over the records) are written in Python and compiled
by numba. Importing numba takes about 0.2 s and its first call loads its CPU target (its
registries, and the scipy BLAS that numba checks for), about 0.35 s more on the machines of
``benchmarks/README.md``; the loops themselves load from numba's cache (:func:`cache_dir`).

- :func:`njit` marks a loop for compiling without importing numba: the module that holds it
  imports in a few ms, and numba comes in when the loop first runs (:class:`Compiled`). A
  run that compiles nothing (an LLM scenario's replicas are Python) never pays for numba.
- :func:`load` pays numba's start up front, so that a run's wall time is the simulation's
  and the start is reported beside it (``servesim run``: "numba started in …").
- :func:`cache_dir` is where numba keeps the compiled loops: a folder named by a hash of
  every source file of the simulator. numba checks only the file that holds a function
  before it loads it from its cache, not the loops it calls from other modules: a change to
  ``compiled.rate_factor`` left the event loop's kernel, in ``loop_kernel.py``, running the
  old one. Any change to the simulator's sources now compiles every loop again, once.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import os
import shutil
import time
from pathlib import Path

AVAILABLE = importlib.util.find_spec("numba") is not None  # numba is a core dependency; a bare numpy runs without
_started = False
_PACKAGE = Path(__file__).resolve().parent
_USER_DIR = os.environ.get("NUMBA_CACHE_DIR")  # a folder the user chose is kept
_cache: str | None = None


def source_hash(root: Path) -> str:
    """A hash of every ``.py`` file under ``root``, by path and content (16 hex digits)."""
    h = hashlib.sha256()
    for f in sorted(root.rglob("*.py")):
        h.update(f.relative_to(root).as_posix().encode())
        h.update(b"\0")
        h.update(f.read_bytes())
    return h.hexdigest()[:16]


def cache_dir() -> str:
    """The folder numba caches the compiled loops in (the user's ``NUMBA_CACHE_DIR`` where
    set): ``__pycache__/numba-HASH`` in the simulator's package, HASH over every one of its
    source files, or the same under ``~/.cache/servesim`` where the package is read-only.
    Made on the first call, the folders of other hashes beside it removed."""
    global _cache
    if _cache is not None:
        return _cache
    if _USER_DIR:
        _cache = _USER_DIR
        return _cache
    name = f"numba-{source_hash(_PACKAGE)}"
    for parent in (_PACKAGE / "__pycache__", Path.home() / ".cache" / "servesim"):
        try:
            (parent / name).mkdir(parents=True, exist_ok=True)
        except OSError:
            continue
        if os.access(parent / name, os.W_OK):
            for old in parent.glob("numba-*"):  # caches of sources since changed
                if old.name != name:
                    shutil.rmtree(old, ignore_errors=True)
            _cache = str(parent / name)
            return _cache
    _cache = ""  # nowhere to write: numba's own choice
    return _cache


def _numba():
    """numba, imported with its cache in :func:`cache_dir`."""
    where = cache_dir()
    if where:
        os.environ["NUMBA_CACHE_DIR"] = where  # read as numba starts
    import numba

    if where:
        numba.config.CACHE_DIR = where  # and where it had started before
    return numba


def _noop(x: int) -> int:
    return x + 1


def started() -> bool:
    """Whether numba has started in this process (:func:`load`, or a compiled loop ran)."""
    return _started


class Compiled:
    """``py_func`` as ``numba.njit(**options)`` compiles it, made on the first call.

    On that call numba is imported and every :class:`Compiled` among the module globals of
    ``py_func`` is replaced there by its numba dispatcher, so that compiled loops calling
    each other (by their module names) see numba's functions when numba types them."""

    def __init__(self, py_func, options: dict):
        functools.update_wrapper(self, py_func)
        self.py_func, self.options = py_func, options
        self._dispatcher = None

    def dispatcher(self):
        """numba's dispatcher for the function (numba imported on the first call)."""
        if self._dispatcher is None:
            self._dispatcher = _numba().njit(**self.options)(self.py_func)
            g = self.py_func.__globals__
            for name, value in list(g.items()):
                if isinstance(value, Compiled):
                    g[name] = value.dispatcher()
        return self._dispatcher

    def __call__(self, *args):
        global _started
        out = (self._dispatcher or self.dispatcher())(*args)
        _started = True
        return out


def njit(**options):
    """A decorator: the function compiled by numba with ``options`` when first called
    (:class:`Compiled`); without numba installed, the function itself."""

    def wrap(py_func):
        return Compiled(py_func, options) if AVAILABLE else py_func

    return wrap


def load() -> float:
    """Start numba's CPU target, once per process; the seconds it took (0.0 after the
    first call, or without numba)."""
    global _started
    if _started:
        return 0.0
    t = time.perf_counter()
    if AVAILABLE:
        njit(cache=True)(_noop)(1)
    _started = True
    return time.perf_counter() - t
