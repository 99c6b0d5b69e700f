"""The lab's bridge: where an engine listens. On its pod's own address and "http" port where this host
can bind that address (the gateway tests' pod range, routed to lo), else on a free loopback port."""

from __future__ import annotations

import json
import time
from pathlib import Path
from unittest.mock import MagicMock

from kubernetes import client
from tests.conftest import tiny

from specgate import api, render
from specgate.render import Owner, Track
from specgate_lab.bridge import LOOPBACK, Bridge, _is_running, _pre_stop_seconds
from specgate_lab.engines import engine_command

# 127.0.0.0/8 is routed to lo everywhere, as the gateway tests route 198.18.0.0/16; TEST-NET-3
# (RFC 5737) is on no host, as kwok's default 10.0.0.0/24 is on none of the lab's.
BINDABLE, ELSEWHERE = "127.0.0.2", "203.0.113.7"


OWNER = Owner(name="gone", namespace="ns", uid="u-1")


def bridge(tmp_path: Path) -> Bridge:
    return Bridge(MagicMock(), MagicMock(), tmp_path, "sim", "http://127.0.0.1:18080")


def engine_container(port_name: str = "http") -> client.V1Container:
    return client.V1Container(
        name="vllm", ports=[client.V1ContainerPort(name=port_name, container_port=8000)]
    )


def test_an_engine_listens_on_its_pods_address_and_port_where_this_host_can_bind_it(tmp_path: Path) -> None:
    assert bridge(tmp_path)._engine_address(BINDABLE, engine_container()) == (BINDABLE, 8000)


def test_other_engines_listen_on_a_free_loopback_port(tmp_path: Path) -> None:
    for pod_ip, container in ((ELSEWHERE, engine_container()), (BINDABLE, engine_container("metrics"))):
        host, port = bridge(tmp_path)._engine_address(pod_ip, container)
        assert host == LOOPBACK and 20000 <= port < 32768


def test_an_engine_starts_once_its_pod_has_an_address() -> None:
    def pod(pod_ip: str | None) -> client.V1Pod:
        return client.V1Pod(
            metadata=client.V1ObjectMeta(), status=client.V1PodStatus(phase="Running", pod_ip=pod_ip)
        )

    assert not _is_running(pod(None))
    assert _is_running(pod(BINDABLE))


def test_the_engine_command_binds_the_address_given() -> None:
    for kind in ("sim", "vllm"):
        argv, _ = engine_command(kind, ["specgate/tiny-llama", "--host", "0.0.0.0"], 8000, {}, "198.18.7.9")
        assert argv[argv.index("--host") + 1 :][:3] == ["198.18.7.9", "--port", "8000"]
        assert argv.count("--host") == 1


def test_a_gone_pods_engine_serves_through_its_prestop_sleep_and_keeps_its_address(tmp_path: Path) -> None:
    """As a kubelet runs the preStop hook before SIGTERM: the rendered pods sleep PRE_STOP_SECONDS,
    and a new pod that kwok gave the same address at once waits for the old engine to stop."""
    template = render.deployment(api.parse_spec(tiny("gone")["spec"]), OWNER, Track.CANARY, 1)["spec"][
        "template"
    ]
    rendered = client.ApiClient().deserialize(
        json.dumps(template["spec"]["containers"][0]), "V1Container", "application/json"
    )
    seconds = _pre_stop_seconds(rendered)
    assert seconds == render.PRE_STOP_SECONDS > 0
    assert _pre_stop_seconds(engine_container()) == 0.0
    lab = bridge(tmp_path)
    old = MagicMock(address=f"{BINDABLE}:8000", pre_stop_seconds=0.2)
    lab._remove(old)
    assert lab.draining == {f"{BINDABLE}:8000": old}
    old.stop.assert_not_called()
    pod = client.V1Pod(
        metadata=client.V1ObjectMeta(name="new", namespace="ns", uid="u2"),
        spec=client.V1PodSpec(containers=[engine_container()]),
        status=client.V1PodStatus(phase="Running", pod_ip=BINDABLE),
    )
    assert lab._add(pod) is None  # the address is the old engine's until it stops
    time.sleep(0.5)
    old.stop.assert_called_once()
    assert lab.draining == {}


def test_a_ready_engine_turns_unready_only_after_failure_threshold_probes_each_given_its_timeout(
    tmp_path: Path,
) -> None:
    """As a kubelet reads the rendered readinessProbe: an answer slower than 1 s but within
    timeoutSeconds keeps the pod Ready (a busy machine answers slowly); failureThreshold failed probes
    in a row, one a period, make it unready."""
    import asyncio

    import aiohttp
    from aiohttp import web

    from specgate_lab.bridge import Engine, ReadinessProbe

    rendered = client.ApiClient().deserialize(
        json.dumps(
            render.deployment(api.parse_spec(tiny("slow")["spec"]), OWNER, Track.BASELINE, 1)["spec"][
                "template"
            ]["spec"]["containers"][0]
        ),
        "V1Container",
        "application/json",
    )
    probe = ReadinessProbe.of(rendered)
    assert (probe.period, probe.timeout, probe.failures) == (5.0, 5.0, 3)

    async def scenario() -> list[bool]:
        delay = {"seconds": 1.2}

        async def health(_: web.Request) -> web.Response:
            await asyncio.sleep(delay["seconds"])
            return web.Response(text="ok")

        app = web.Application()
        app.router.add_get("/health", health)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, LOOPBACK, 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        engine = Engine("ns", "p", "u", {}, LOOPBACK, port, [], {}, tmp_path / "p.log")
        engine.probe = ReadinessProbe(period=0.0, timeout=1.6, failures=3)
        engine.ship_log = lambda partial=False: None  # type: ignore[method-assign]
        engine.prioritize = lambda starting: None  # type: ignore[method-assign]
        seen = []
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=1)) as session:
            await bridge(tmp_path)._check(engine, session)  # 1.2 s: slow, within the 1.6 s timeout
            seen.append(engine.ready)
            delay["seconds"] = 2.5  # past the timeout from now on
            for _ in range(3):
                await bridge(tmp_path)._check(engine, session)
                seen.append(engine.ready)
        await runner.cleanup()
        return seen

    assert asyncio.run(scenario()) == [True, True, True, False]
