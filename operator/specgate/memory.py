"""Hand the heap pages a burst freed back to the kernel.

At hundreds of objects a burst (all of them created at once, their watch events decoded, their
children written) allocates tens of MB that are freed a minute later; glibc keeps most of those
pages mapped between the chunks still in use, and the process's RSS, which is what a memory limit
counts, stays at the burst's peak. malloc_trim(0) returns every whole free page of every arena.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import logging
import threading
import time

TRIM_INTERVAL_SECONDS = 60.0
log = logging.getLogger(__name__)
_TRIMMERS: list[threading.Thread] = []


@functools.cache  # find_library runs ldconfig: once per process, not once a minute
def _malloc_trim() -> ctypes._NamedFuncPointer | None:
    """glibc's malloc_trim, or None where the C library has none (musl, macOS)."""
    name = ctypes.util.find_library("c")
    try:
        return ctypes.CDLL(name).malloc_trim if name else None
    except (OSError, AttributeError):
        return None


def trim() -> bool:
    """Return the free heap pages now; False where the C library cannot."""
    malloc_trim = _malloc_trim()
    if malloc_trim is None:
        return False
    malloc_trim(0)
    return True


def trim_periodically(interval: float = TRIM_INTERVAL_SECONDS) -> None:
    """A daemon thread that trims every interval (a few ms at a few hundred MB, under the
    allocator's lock, so not on every reconcile). Once per process: kopf runs the startup handler
    that calls this again after any failure in it (a metrics port in use, say)."""
    if _TRIMMERS:
        return
    if _malloc_trim() is None:
        log.info("no malloc_trim in this C library: freed heap pages stay with the process")
        return

    def loop() -> None:
        while True:
            time.sleep(interval)
            trim()

    _TRIMMERS.append(threading.Thread(target=loop, name="malloc-trim", daemon=True))
    _TRIMMERS[0].start()
