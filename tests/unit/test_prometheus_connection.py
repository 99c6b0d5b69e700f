"""How the operator reaches Prometheus, against real local servers: TLS verified (a certificate made
here with openssl), a bearer token or basic auth from a file and extra headers (a tenant's
X-Scope-OrgID). tests/integration/test_prometheus_tls_auth.py does TLS and basic auth against the
real Prometheus 3."""

from __future__ import annotations

import base64
import json
import ssl
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import ClassVar

import pytest
from tests.local_server import self_signed_cert, serving

from specgate import cli, prometheus
from specgate.api import MetricsSource
from specgate.observation import Window
from specgate.prometheus import MetricsUnavailable, PrometheusClient, Selector

EMPTY = json.dumps({"status": "success", "data": {"resultType": "matrix", "result": []}}).encode()


class EmptyAnswers(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(EMPTY)

    def log_message(self, *_: object) -> None:
        pass


@pytest.fixture
def https_prometheus(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """A Prometheus-shaped HTTPS endpoint with a self-signed certificate for 127.0.0.1, and the cert."""
    cert, key = self_signed_cert(tmp_path)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    with serving(EmptyAnswers, context) as url:
        yield url, cert


class TenantOnly(EmptyAnswers):
    """Answers only the tenant team-a with the token s3cret, as Mimir behind an auth proxy would."""

    def do_GET(self) -> None:
        if (
            self.headers.get("Authorization") == "Bearer s3cret"
            and self.headers.get("X-Scope-OrgID") == "team-a"
        ):
            super().do_GET()
            return
        self.send_response(401)
        self.end_headers()


@pytest.fixture
def tenant_prometheus() -> Iterator[str]:
    with serving(TenantOnly) as url:
        yield url


def test_the_token_file_and_the_headers_reach_prometheus(
    tenant_prometheus: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Set as `specgate run --prometheus-bearer-token-file F --prometheus-header 'X-Scope-OrgID: team-a'`
    sets them; without them the 401 is MetricsUnavailable; a rotated token is read again."""
    with pytest.raises(MetricsUnavailable, match="401"):
        ask(tenant_prometheus)
    token = tmp_path / "token"
    token.write_text("old\n")
    monkeypatch.setenv(prometheus.TOKEN_FILE_ENV, str(token))
    monkeypatch.setenv(prometheus.HEADERS_ENV, json.dumps({"X-Scope-OrgID": "team-a"}))
    with pytest.raises(MetricsUnavailable, match="401"):
        ask(tenant_prometheus)
    token.write_text("s3cret\n")  # rotated, as a projected ServiceAccount token or a Secret is
    assert ask(tenant_prometheus) is None


def test_an_unreadable_token_file_is_metrics_unavailable_naming_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(prometheus.TOKEN_FILE_ENV, "/nonexistent/token")
    with pytest.raises(MetricsUnavailable, match="/nonexistent/token"):
        ask("http://127.0.0.1:9")


class BasicAuthOnly(EmptyAnswers):
    """Answers only the user specgate with the password pa:ss (a colon in it), as Prometheus' own
    web config (basic_auth_users) does."""

    def do_GET(self) -> None:
        if self.headers.get("Authorization") == "Basic " + base64.b64encode(b"specgate:pa:ss").decode():
            super().do_GET()
            return
        self.send_response(401)
        self.end_headers()


def test_the_basic_auth_file_reaches_prometheus_and_is_read_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Set as `specgate run --prometheus-basic-auth-file F` sets it: wrong credentials are a 401
    naming the options to check; the corrected file is read again (a rotated Secret)."""
    credentials = tmp_path / "credentials"
    credentials.write_text("specgate:wrong\n")
    monkeypatch.setenv(prometheus.BASIC_AUTH_FILE_ENV, str(credentials))
    with serving(BasicAuthOnly) as url:
        with pytest.raises(MetricsUnavailable, match=r"\(HTTP 401\).*--prometheus-basic-auth-file"):
            ask(url)
        credentials.write_text("specgate:pa:ss\n")
        assert ask(url) is None


def test_a_basic_auth_file_without_a_user_and_a_colon_is_metrics_unavailable_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    credentials = tmp_path / "credentials"
    credentials.write_text("just-a-password\n")
    monkeypatch.setenv(prometheus.BASIC_AUTH_FILE_ENV, str(credentials))
    with pytest.raises(MetricsUnavailable, match=f"{credentials} must hold one line username:password"):
        ask("http://127.0.0.1:9")


def test_a_bearer_token_and_basic_auth_together_are_refused_naming_both(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        cli.build_parser().parse_args(
            ["run", "--prometheus-bearer-token-file", "t", "--prometheus-basic-auth-file", "b"]
        )
    assert "--prometheus-basic-auth-file: not allowed with argument --prometheus-bearer-token-file" in (
        capsys.readouterr().err
    )
    # The same through the environment `specgate run` sets: MetricsUnavailable, never a query.
    monkeypatch.setenv(prometheus.TOKEN_FILE_ENV, "t")
    monkeypatch.setenv(prometheus.BASIC_AUTH_FILE_ENV, "b")
    with pytest.raises(
        MetricsUnavailable, match="--prometheus-bearer-token-file and --prometheus-basic-auth-file"
    ):
        ask("http://127.0.0.1:9")


class KeepAlive(EmptyAnswers):
    """HTTP/1.1 with keep-alive; records the client port of every query it answers."""

    protocol_version = "HTTP/1.1"
    client_ports: ClassVar[list[int]] = []

    def do_GET(self) -> None:
        self.client_ports.append(self.client_address[1])
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(EMPTY)))
        self.end_headers()
        self.wfile.write(EMPTY)


def test_the_queries_of_every_reconcile_share_one_kept_alive_connection(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each reconcile makes a PrometheusClient; at hundreds of objects a connection (and a TLS
    handshake) per query would be most of what they cost Prometheus."""
    monkeypatch.setattr(KeepAlive, "client_ports", [])  # this run's ports only, however often it runs
    with serving(KeepAlive) as url:
        for _ in range(3):
            assert ask(url) is None
    assert len(KeepAlive.client_ports) == 3
    assert len(set(KeepAlive.client_ports)) == 1, KeepAlive.client_ports


def ask(url: str) -> object:
    now = datetime.now(UTC)
    selector = Selector("ns", "llama", "canary", MetricsSource())
    return PrometheusClient(url).track_metrics(selector, Window(now - timedelta(minutes=1), now), 15.0)


def test_an_untrusted_certificate_is_metrics_unavailable_naming_the_failure(
    https_prometheus: tuple[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("REQUESTS_CA_BUNDLE", raising=False)
    monkeypatch.delenv("CURL_CA_BUNDLE", raising=False)
    url, _ = https_prometheus
    with pytest.raises(MetricsUnavailable, match=r"CERTIFICATE_VERIFY_FAILED.*prometheusCA"):
        ask(url)


def test_a_certificate_trusted_through_requests_ca_bundle_is_answered(
    https_prometheus: tuple[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The CA bundle the operator's pod mounts, named by REQUESTS_CA_BUNDLE (what `requests` reads)."""
    url, cert = https_prometheus
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(cert))
    assert ask(url) is None  # answered: the track has no series yet
