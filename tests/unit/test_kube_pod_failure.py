"""How a failing pod is described in status and the rollback's Event, from the pod objects the API
server sends (built with the kubernetes client's models, serialized as the watch delivers them)."""

from __future__ import annotations

from typing import Any

from kubernetes.client import (
    ApiClient,
    V1ContainerState,
    V1ContainerStateTerminated,
    V1ContainerStateWaiting,
    V1ContainerStatus,
    V1ObjectMeta,
    V1Pod,
    V1PodStatus,
)

from specgate import kube

BACK_OFF = "back-off 40s restarting failed container=vllm pod=m-canary-7d9-x2"


def crash_looping(last: V1ContainerStateTerminated | None) -> dict[str, Any]:
    status = V1ContainerStatus(
        name="vllm", image="vllm/vllm-openai:v0.32.0", image_id="", ready=False, restart_count=3,
        state=V1ContainerState(waiting=V1ContainerStateWaiting(reason="CrashLoopBackOff", message=BACK_OFF)),
        last_state=V1ContainerState(terminated=last) if last else V1ContainerState(),
    )  # fmt: skip
    pod = V1Pod(
        metadata=V1ObjectMeta(name="m-canary-7d9-x2"), status=V1PodStatus(container_statuses=[status])
    )
    return ApiClient().sanitize_for_serialization(pod)  # type: ignore[no-any-return,no-untyped-call]


def test_a_crash_loop_names_how_the_container_last_ended() -> None:
    oom = V1ContainerStateTerminated(exit_code=137, reason="OOMKilled")
    assert kube._pod_failure(crash_looping(oom)) == (
        f"pod m-canary-7d9-x2: CrashLoopBackOff: {BACK_OFF}; last exit 137 (OOMKilled)"
    )


def test_the_termination_message_is_kept_short_on_one_line() -> None:
    log_tail = "loading draft\nValueError: draft vocab 32000 != target vocab 128256\n" + "x" * 400
    error = V1ContainerStateTerminated(exit_code=1, reason="Error", message=log_tail)
    failure = kube._pod_failure(crash_looping(error))
    assert failure is not None
    assert failure.startswith(f"pod m-canary-7d9-x2: CrashLoopBackOff: {BACK_OFF}; last exit 1 (Error): ")
    assert "\n" not in failure and failure.endswith("x" * 300)


def test_without_a_last_state_the_waiting_reason_alone_is_given() -> None:
    assert kube._pod_failure(crash_looping(None)) == f"pod m-canary-7d9-x2: CrashLoopBackOff: {BACK_OFF}"
