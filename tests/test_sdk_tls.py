"""A service behind a TLS proxy whose certificate a company's own authority signed: certifi's
bundle (httpx's default) lacks that authority, and the SDK, the CLI and the workers said only
"certificate verify failed". They now say how to trust it (SSL_CERT_FILE or SSL_CERT_DIR, the
OpenSSL variables httpx reads), and with it set, they reach the service."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import certifi
import pytest
from service_support import live_server

from pipetune.clients.sdk import Client, ServiceUnavailableError
from pipetune.clients.sdk.http import CERT_VARIABLES
from pipetune.service.migrate import upgrade
from pipetune.service.settings import sqlite_url


@pytest.fixture
def certificate(tmp_path: Path) -> tuple[Path, Path]:
    """A self-signed certificate for localhost (its own authority) and its key."""
    openssl = shutil.which("openssl")
    assert openssl, "these tests make their certificate with the openssl command: install it"
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        [
            *(openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2"),
            *("-keyout", str(key), "-out", str(cert), "-subj", "/CN=localhost"),
            *("-addext", "subjectAltName=DNS:localhost"),
        ],
        check=True,
        capture_output=True,
    )
    return cert, key


@pytest.fixture
def service(tmp_path: Path, certificate: tuple[Path, Path]) -> Iterator[str]:
    url = sqlite_url(tmp_path / "tls.db")
    upgrade(url)
    with live_server(url, tls=certificate) as base:
        yield base


@pytest.fixture(autouse=True)
def no_ambient_authorities(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in CERT_VARIABLES:
        monkeypatch.delenv(name, raising=False)


def test_a_refused_certificate_says_how_to_trust_its_authority(service: str):
    with Client(service) as client, pytest.raises(ServiceUnavailableError) as caught:
        client.tasks()
    said = str(caught.value)
    assert "certificate verify failed" in said
    assert "set SSL_CERT_FILE to its certificates (a PEM file) or SSL_CERT_DIR" in said


def test_a_bundle_named_that_lacks_the_authority_is_named(
    service: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    other = tmp_path / "other.pem"
    other.write_text(Path(certifi.where()).read_text(encoding="utf-8"))
    monkeypatch.setenv("SSL_CERT_FILE", str(other))
    monkeypatch.setenv("SSL_CERT_DIR", str(tmp_path))  # (httpx reads only the first)
    with Client(service) as client, pytest.raises(ServiceUnavailableError) as caught:
        client.tasks()
    assert f"SSL_CERT_FILE={other} does not hold the authority that signed it" in str(caught.value)


def test_with_its_authority_named_the_service_is_reached(
    service: str, certificate: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setenv("SSL_CERT_FILE", str(certificate[0]))
    with Client(service) as client:
        assert client.tasks() == []
        assert client.healthz()["status"] == "ok"


def test_any_other_failure_gets_no_certificate_hint(tmp_path: Path):
    with Client("http://127.0.0.1:9") as client, pytest.raises(ServiceUnavailableError) as caught:
        client.tasks()
    assert "SSL_CERT" not in str(caught.value)
