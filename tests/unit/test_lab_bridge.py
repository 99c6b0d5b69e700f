"""The lab's bridge: where an engine listens. On its pod's own address and "http" port where this host
can bind that address (the gateway tests' pod range, routed to lo), else on a free loopback port."""

from __future__ import annotations

from pathlib import Path
from unittest.mock import MagicMock

from kubernetes import client

from specgate_lab.bridge import LOOPBACK, Bridge, _is_running
from specgate_lab.engines import engine_command

# 127.0.0.0/8 is routed to lo everywhere, as the gateway tests route 198.18.0.0/16; TEST-NET-3
# (RFC 5737) is on no host, as kwok's default 10.0.0.0/24 is on none of the lab's.
BINDABLE, ELSEWHERE = "127.0.0.2", "203.0.113.7"


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
