"""specgate_lab.kube.wait_for, the poll every cluster test and the demo wait with: what a loaded
lab's API server answers (a 5xx, an answer cut off mid-body) is read again, not a failure."""

from __future__ import annotations

from http.client import IncompleteRead

import pytest
import urllib3
from kubernetes.client.exceptions import ApiException

from specgate_lab.kube import wait_for


def answers(*replies: object) -> object:
    """A predicate that raises or returns each of `replies` in turn."""
    pending = list(replies)

    def predicate() -> object:
        reply = pending.pop(0)
        if isinstance(reply, Exception):
            raise reply
        return reply

    return predicate


def test_a_cut_off_answer_and_a_504_are_read_again() -> None:
    cut = urllib3.exceptions.ProtocolError("Connection broken", IncompleteRead(b"", 10))
    assert wait_for(answers(cut, ApiException(status=504), "settled"), 5, "it", interval=0) == "settled"


def test_a_refusal_is_not_read_again() -> None:
    with pytest.raises(ApiException):
        wait_for(answers(ApiException(status=403), "settled"), 5, "it", interval=0)


def test_the_timeout_names_what_was_awaited_and_the_last_error() -> None:
    cut = urllib3.exceptions.ProtocolError("Connection broken")
    with pytest.raises(AssertionError, match=r"waiting for the rollout \(.*Connection broken"):
        wait_for(answers(*[cut] * 1000), 0.05, "the rollout", interval=0.01)
