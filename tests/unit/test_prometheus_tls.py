"""The Prometheus client verifies TLS: a real HTTPS server on 127.0.0.1 with a certificate made here."""

from __future__ import annotations

import json
import ssl
import subprocess
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from specgate.api import MetricsSource
from specgate.prometheus import MetricsUnavailable, PrometheusClient, Selector
from specgate.rollout import Window

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
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert),
         "-days", "1", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
        check=True, capture_output=True,
    )  # fmt: skip
    server = ThreadingHTTPServer(("127.0.0.1", 0), EmptyAnswers)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"https://127.0.0.1:{server.server_address[1]}", cert
    finally:
        server.shutdown()
        server.server_close()


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
    with pytest.raises(MetricsUnavailable, match="CERTIFICATE_VERIFY_FAILED"):
        ask(url)


def test_a_certificate_trusted_through_requests_ca_bundle_is_answered(
    https_prometheus: tuple[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The CA bundle the operator's pod mounts, named by REQUESTS_CA_BUNDLE (what `requests` reads)."""
    url, cert = https_prometheus
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(cert))
    assert ask(url) is None  # answered: the track has no series yet
