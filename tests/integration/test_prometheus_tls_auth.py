"""The operator against the lab's Prometheus 3 serving TLS and checking basic auth itself
(--web.config.file: tls_server_config and basic_auth_users; exporter-toolkit has no bearer tokens).

With the CA and the credentials a track's figures come back; an untrusted certificate and wrong
credentials are MetricsUnavailable statuses that name the problem and the setting that fixes it.
tests/unit/test_prometheus_connection.py covers the same client against small local servers."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import bcrypt
import pytest
import requests
import yaml
from tests.conftest import last_minute
from tests.integration.engines import sim_engine, spec_args
from tests.integration.prometheus_server import prometheus_server, write_target
from tests.local_server import self_signed_cert
from tests.unit.handler_fakes import FakeKube, reconcile_step
from tests.unit.rollout_driver import Run, make_spec, ready

from specgate import prometheus
from specgate.api import MetricsSource, Phase
from specgate.prometheus import MetricsUnavailable, PrometheusClient, Selector
from specgate.rollout import Reason
from specgate_lab.calibrate import complete

USER, PASSWORD = "specgate", "pass:word"  # a colon in the password: only the first one splits
CANARY = Selector("ns", "d", "canary", MetricsSource())
TARGET_LABELS = {
    "namespace": "ns",
    "pod": "p0",
    "specgate_dev_deployment": "d",
    "specgate_dev_track": "canary",
}
SELF_DRAFT = {"method": "draft_model", "model": "specgate/tiny-llama", "num_speculative_tokens": 4}


class Secured(NamedTuple):
    url: str
    ca: Path  # the self-signed certificate Prometheus serves
    credentials: Path  # username:password, as --prometheus-basic-auth-file reads it


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Secured]:
    """Prometheus 3 requiring TLS and basic auth, scraping a simulated engine (plain HTTP) as the
    canary of ns/d every second."""
    tmp = tmp_path_factory.mktemp("secured")
    cert, key = self_signed_cert(tmp)
    hashed = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(rounds=4)).decode()  # cheapest cost
    web = tmp / "web.yml"
    web.write_text(
        yaml.safe_dump(
            {
                "tls_server_config": {"cert_file": str(cert), "key_file": str(key)},
                "basic_auth_users": {USER: hashed},
            }
        )
    )
    credentials = tmp / "credentials"
    credentials.write_text(f"{USER}:{PASSWORD}\n")

    def answers(url: str) -> bool:
        try:
            return requests.get(f"{url}/-/ready", verify=cert, auth=(USER, PASSWORD), timeout=2).ok
        except requests.RequestException:
            return False

    with (
        sim_engine(spec_args(SELF_DRAFT)) as engine,
        prometheus_server(tmp, 1.0, web_config=web, ready=answers) as (url, targets),
    ):
        complete(engine, "tiny", "one request, so that every series exists", max_tokens=8)
        write_target(targets, "p0", engine, TARGET_LABELS)
        yield Secured(url, cert, credentials)


def test_with_the_ca_and_the_credentials_the_operator_reads_the_track(
    secured: Secured, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(secured.ca))
    monkeypatch.setenv(prometheus.BASIC_AUTH_FILE_ENV, str(secured.credentials))
    deadline = time.monotonic() + 30
    while (metrics := PrometheusClient(secured.url).track_metrics(CANARY, last_minute(), 1.0)) is None:
        assert time.monotonic() < deadline, "the engine's series never reached Prometheus"
        time.sleep(0.5)
    assert metrics.load is not None and metrics.load.pods == 1
    assert metrics.scrape_interval_seconds == pytest.approx(1.0, abs=0.2)


def metrics_unavailable_status(url: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """The status message of an analysis reading this Prometheus (handlers.step with the real
    client; only Kubernetes is faked): what `kubectl describe sd` shows the user."""
    FakeKube({"llama-baseline": ready(1), "llama-canary": ready(1)}).install(monkeypatch)
    run = Run(make_spec(metrics={"prometheusUrl": url}))
    run.to_analyzing()
    status = reconcile_step(run, after=70).status
    assert (status.phase, status.reason, status.verdict) == (
        Phase.ANALYZING,
        Reason.METRICS_UNAVAILABLE,
        "MetricsUnavailable",
    )
    return status.message or ""


def test_an_untrusted_certificate_is_a_status_naming_it_and_the_ca_setting(
    secured: Secured, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("REQUESTS_CA_BUNDLE", raising=False)
    monkeypatch.delenv("CURL_CA_BUNDLE", raising=False)
    monkeypatch.setenv(prometheus.BASIC_AUTH_FILE_ENV, str(secured.credentials))
    message = metrics_unavailable_status(secured.url, monkeypatch)
    # OpenSSL's own words follow ("self-signed certificate" in OpenSSL 3, "self signed" before).
    assert f"TLS with Prometheus {secured.url} failed: CERTIFICATE_VERIFY_FAILED: self" in message
    assert message.endswith(
        "certificate; if its certificate comes from a private CA, give the operator that CA (Helm value "
        "prometheusCA.configMap, or REQUESTS_CA_BUNDLE=/path/to/ca.crt for `specgate run`)"
    ), message


def test_wrong_credentials_are_a_401_status_naming_the_options_and_a_fixed_file_is_read_again(
    secured: Secured, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(secured.ca))
    credentials = tmp_path / "credentials"
    credentials.write_text(f"{USER}:wrong\n")
    monkeypatch.setenv(prometheus.BASIC_AUTH_FILE_ENV, str(credentials))
    message = metrics_unavailable_status(secured.url, monkeypatch)
    assert message.endswith(
        f"Prometheus {secured.url} refused the query (HTTP 401): the credentials are missing, wrong or "
        "not allowed; check the Helm value prometheusAuth.basicAuthSecret or .bearerTokenSecret "
        "(--prometheus-basic-auth-file or --prometheus-bearer-token-file)"
    ), message
    monkeypatch.delenv(prometheus.BASIC_AUTH_FILE_ENV)
    with pytest.raises(MetricsUnavailable, match=r"\(HTTP 401\)"):  # no credentials at all
        PrometheusClient(secured.url).track_metrics(CANARY, last_minute(), 1.0)
    monkeypatch.setenv(prometheus.BASIC_AUTH_FILE_ENV, str(credentials))
    credentials.write_text(secured.credentials.read_text())  # the Secret rotated to the right one
    PrometheusClient(secured.url).track_metrics(CANARY, last_minute(), 1.0)  # answered
