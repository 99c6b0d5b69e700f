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

import pydantic

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


def set_holders(tracked: list[object], mine: list[object], sample: int) -> collections.Counter[str]:
    """gc.get_referrers scans every object: a sample, not all. mine: the probe's own lists."""
    sets = [o for o in tracked if type(o) is set and len(o) >= 5]
    sets = sets[:: max(1, len(sets) // sample)][:sample]
    ours = {id(tracked), id(sets), *map(id, mine)}
    holders: collections.Counter[str] = collections.Counter()
    for one in sets:
        direct = gc.get_referrers(one)
        for holder in direct:
            if id(holder) in ours:
                continue
            above = [
                type(h).__qualname__ for h in gc.get_referrers(holder) if id(h) not in ours | {id(direct)}
            ][:2]
            holders[f"{module_of(holder)}.{type(holder).__qualname__} <- {above}"] += 1
    return holders


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
    lines += ["", "who holds the sets of 5 or more (a sample of 30: the holder's type, and its holder's):"]
    lines += [
        f"  {n:4d} {holder}" for holder, n in set_holders(tracked, list(by_module.values()), 30).most_common()
    ]
    models = collections.Counter(
        f"{module_of(o)}.{type(o).__qualname__}" for o in tracked if isinstance(o, pydantic.BaseModel)
    )
    lines += ["", f"pydantic model instances: {sum(models.values())}, by class:"]
    lines += [f"  {n:7d} {name}" for name, n in models.most_common(15)]
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
