"""The test Prometheus servers: the flavours are the versions they claim, and a target written as
the bridge writes it is scraped at the asked interval."""

from __future__ import annotations

import json
import time
import urllib.request
from pathlib import Path

import pytest
from tests.integration.prometheus_server import prometheus_server, prometheus_version, write_target


@pytest.mark.parametrize(("flavour", "major"), [("3", "3.16."), ("2", "2.")])
def test_flavour_version(flavour: str, major: str) -> None:
    assert prometheus_version(flavour).startswith(major)


@pytest.mark.parametrize("flavour", ["3", "2"])
def test_scrapes_a_file_sd_target_at_the_interval(tmp_path: Path, flavour: str) -> None:
    with prometheus_server(tmp_path, 1.0, flavour) as (url, targets):
        write_target(targets, "self", url, {"namespace": "ns", "pod": "self"})
        deadline = time.monotonic() + 30
        while True:
            with urllib.request.urlopen(f"{url}/api/v1/targets?state=active", timeout=5) as resp:
                active = json.load(resp)["data"]["activeTargets"]
            if active and active[0]["health"] == "up":
                break
            assert time.monotonic() < deadline, f"target not scraped: {active}"
            time.sleep(0.5)
    assert active[0]["scrapeInterval"] == "1s"
    assert active[0]["labels"] | {"job": "vllm"} == {
        "instance": url.removeprefix("http://"),
        "job": "vllm",
        "namespace": "ns",
        "pod": "self",
    }
