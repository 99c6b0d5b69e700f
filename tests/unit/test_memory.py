"""memory.trim against glibc itself: the pages of a freed burst come back only when trimmed."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from specgate import memory

BURST = textwrap.dedent(
    """
    import json, re
    from specgate import memory

    def rss_mb():
        return int(re.search(r"VmRSS:\\s+(\\d+) kB", open("/proc/self/status").read())[1]) / 1024

    # 120 MB of 2 KB blocks (malloc'd, not pymalloc'd), freed but every 64th: the survivors pin
    # the heap, as a burst's few long-lived objects do.
    blocks = [bytes(2048 + i % 7) for i in range(60000)]
    survivors = blocks[::64]
    del blocks
    freed = rss_mb()
    trimmed = memory.trim()
    print(json.dumps({"freed": freed, "after_trim": rss_mb(), "trimmed": trimmed}))
    """
)


# kopf reran the startup handler after a failure; each run asks for the trimmer again.
TWO_STARTUPS = textwrap.dedent(
    """
    import threading
    from specgate import memory

    memory.trim_periodically(3600)
    memory.trim_periodically(3600)
    print([t.name for t in threading.enumerate()].count("malloc-trim"))
    """
)


@pytest.mark.skipif(memory._malloc_trim() is None, reason="the C library has no malloc_trim")
def test_trim_returns_a_freed_bursts_pages_that_glibc_keeps() -> None:
    out = subprocess.run([sys.executable, "-c", BURST], check=True, capture_output=True, text=True).stdout
    figures = json.loads(out)
    assert figures["trimmed"]
    assert figures["freed"] > 100, figures  # glibc kept them: without the trim RSS stays this high
    assert figures["freed"] - figures["after_trim"] > 80, figures


@pytest.mark.skipif(memory._malloc_trim() is None, reason="the C library has no malloc_trim")
def test_one_trimmer_however_often_startup_runs() -> None:
    """kopf reruns a startup handler that failed after starting the trimmer (seen: a metrics port
    in use made it run twice)."""
    out = subprocess.run([sys.executable, "-c", TWO_STARTUPS], check=True, capture_output=True, text=True)
    assert out.stdout.split() == ["1"]  # the hour-long trimmer ends with that process, not with pytest's
