"""The operator with a memory probe, for `BENCH_MEMPROBE=1 make bench-scale`: on SIGUSR1 it writes
what holds its memory to $SPECGATE_MEMPROBE_OUT: pymalloc's arenas (Python's small objects) against
the process's RSS, the objects the collector tracks by type, and the deep size of kopf's per-object
state, its indexes and the running tasks. (tracemalloc would name allocation sites, but at 500
objects it slows the operator past keeping up.)"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import gc
import os
import re
import signal
import sys
import traceback
import types
from collections.abc import Iterable
from pathlib import Path

from specgate import cli

# Shared by everything: a deep size stops at them.
_OPAQUE = (
    type,
    types.ModuleType,
    types.FunctionType,
    types.BuiltinFunctionType,
    types.CodeType,
    types.FrameType,
)


def deep_size(roots: Iterable[object], seen: set[int]) -> int:
    """Bytes reachable from roots and not yet counted (seen is shared, so categories do not overlap)."""
    size, stack = 0, list(roots)
    while stack:
        obj = stack.pop()
        if id(obj) in seen or isinstance(obj, _OPAQUE):
            continue
        seen.add(id(obj))
        size += sys.getsizeof(obj, 0)
        stack.extend(gc.get_referents(obj))
    return size


def module_of(obj: object) -> str:
    return str(getattr(type(obj), "__module__", "") or "")


def pymalloc_stats() -> str:
    """sys._debugmallocstats writes to the C stderr: capture fd 2 in a file for the call."""
    path = Path(os.environ["SPECGATE_MEMPROBE_OUT"] + ".malloc")
    saved = os.dup(2)
    with path.open("w") as out:
        os.dup2(out.fileno(), 2)
        try:
            sys._debugmallocstats()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
    text = path.read_text()
    keep = [
        line for line in text.splitlines() if re.match(r"# arenas|Total|\d+ unused pools|# bytes in", line)
    ]
    return "\n".join(keep)


def report() -> str:
    gc.collect()
    rss = re.search(r"VmRSS:\s+(\d+) kB", Path("/proc/self/status").read_text())
    lines = [f"rss {int(rss[1]) / 1024 if rss else 0:.1f} MiB", "", "pymalloc:", pymalloc_stats(), ""]
    seen: set[int] = set()
    tracked = gc.get_objects()
    by_module: dict[str, list[object]] = collections.defaultdict(list)
    for obj in tracked:
        by_module[module_of(obj).split(".")[0]].append(obj)
    tasks = list(asyncio.all_tasks(_LOOP[0])) if _LOOP else []
    categories = {
        "kopf objects (memories, indexes, settings, ...)": by_module["kopf"],
        "asyncio tasks (one per object's timer, per watch, ...)": tasks,
        "prometheus_client metrics": by_module["prometheus_client"],
        "kubernetes client": by_module["kubernetes"],
        "specgate objects": by_module["specgate"],
    }
    lines.append("deep size by owner (in this order; what one holds is not counted again):")
    for name, roots in categories.items():
        lines.append(f"  {deep_size(roots, seen) / 2**20:8.2f} MiB from {len(roots)} roots: {name}")
    counts: collections.Counter[str] = collections.Counter()
    sizes: collections.Counter[str] = collections.Counter()
    for obj in tracked:
        name = f"{module_of(obj)}.{type(obj).__qualname__}"
        counts[name] += 1
        sizes[name] += sys.getsizeof(obj, 0)
    lines += ["", "objects the collector tracks, by type (shallow MiB, count):"]
    lines += [f"  {sizes[name] / 2**20:8.2f} {counts[name]:9d} {name}" for name, _ in sizes.most_common(30)]
    return "\n".join(lines) + "\n"


_LOOP: list[asyncio.AbstractEventLoop] = []


def _dump(_signum: int, _frame: types.FrameType | None) -> None:
    """Never raises: an exception in a signal handler would surface in kopf's loop and stop it."""
    with contextlib.suppress(RuntimeError):
        _LOOP[:] = [asyncio.get_running_loop()]
    try:
        text = report()
    except Exception:  # the probe's own failure goes in its report
        text = traceback.format_exc()
    Path(os.environ["SPECGATE_MEMPROBE_OUT"]).write_text(text)


if __name__ == "__main__":
    signal.signal(signal.SIGUSR1, _dump)
    raise SystemExit(cli.main(sys.argv[1:]))
