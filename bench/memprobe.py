"""The operator with a memory probe, for `make bench-scale BENCH_MEMPROBE=1`: tracemalloc from the
start, and on SIGUSR1 a report of what holds memory (by file, by allocation site, by object type)
written to $SPECGATE_MEMPROBE_OUT. Tracing costs memory itself: read the shares, not the RSS."""

from __future__ import annotations

import collections
import gc
import os
import signal
import sys
import tracemalloc
from pathlib import Path
from types import FrameType

from specgate import cli

FRAMES = 12


def report() -> str:
    gc.collect()
    snapshot = tracemalloc.take_snapshot().filter_traces([tracemalloc.Filter(False, tracemalloc.__file__)])
    lines = [f"traced {sum(s.size for s in snapshot.statistics('filename')) / 2**20:.1f} MiB", "", "by file:"]
    lines += [
        f"  {s.size / 2**20:8.2f} MiB {s.count:8d} {s.traceback[0].filename}"
        for s in snapshot.statistics("filename")[:30]
    ]
    lines += ["", "by allocation site, with its callers:"]
    for stat in snapshot.statistics("traceback")[:25]:
        lines.append(f"  {stat.size / 2**20:8.2f} MiB {stat.count:8d}")
        lines += [f"      {line}" for line in stat.traceback.format(most_recent_first=True)[::2][:FRAMES]]
    types = collections.Counter(type(o).__qualname__ for o in gc.get_objects())
    lines += ["", "objects the collector tracks, by type:"]
    lines += [f"  {count:9d} {name}" for name, count in types.most_common(30)]
    return "\n".join(lines) + "\n"


def _dump(_signum: int, _frame: FrameType | None) -> None:
    Path(os.environ["SPECGATE_MEMPROBE_OUT"]).write_text(report())


if __name__ == "__main__":
    tracemalloc.start(FRAMES)
    signal.signal(signal.SIGUSR1, _dump)
    raise SystemExit(cli.main(sys.argv[1:]))
