"""`watch --listen`: /metrics for Prometheus and /ready?url=URL for load balancers, through the real command,
while it polls a pool of stub engines; and the server's bounds (many clients, silent clients, bad paths)."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest

from conftest import refused_url, vllm_page
from stallprobe.watch.serve import CLIENT_TIMEOUT, MAX_CLIENTS
from stubengine import StubEngine

WAIT = 60.0  # the bound on any wait for an eventual state


class Watching:
    """`stallprobe watch --listen 127.0.0.1:0 ...` in the background; where it serves."""

    def __init__(self, *urls: str) -> None:
        command = [sys.executable, "-m", "stallprobe", "watch", "--json", "--listen", "127.0.0.1:0"]
        command += ["--interval", "0.3", "--window", "0.6", "--drain-after", "0.3", "--timeout", "1", *urls]
        self.process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        assert self.process.stderr is not None
        line = self.process.stderr.readline()
        assert line.startswith("stallprobe watch: serving http://127.0.0.1:"), line
        self.base = line.split()[3].removesuffix("/metrics")

    def get(self, path: str, method: str = "GET") -> tuple[int, str]:
        request = urllib.request.Request(self.base + path, method=method)
        try:
            with urllib.request.urlopen(request, timeout=10) as answer:
                return answer.status, answer.read().decode()
        except urllib.error.HTTPError as error:
            return error.code, error.read().decode()

    def polls(self) -> int:
        _, text = self.get("/metrics")
        line = next(line for line in text.splitlines() if line.startswith("stallprobe_polls_total "))
        return int(line.split()[1])

    def until(self, what: str, check: object) -> None:
        deadline = time.monotonic() + WAIT
        while not callable(check) or not check():
            assert time.monotonic() < deadline, f"never: {what}"
            time.sleep(0.05)  # bounded poll of an eventual state, not time made to pass

    def close(self) -> None:
        self.process.terminate()
        self.process.wait(10)


@pytest.fixture
def pool(served: StubEngine) -> Iterator[tuple[Watching, str, str, str]]:
    served.route("/idle/metrics", vllm_page(0, 10, 10))
    served.route("/wedged/metrics", vllm_page(4, 10, 10))
    served.route("/health", b"")
    idle, wedged, dead = (served.base + "/idle/metrics"), (served.base + "/wedged/metrics"), refused_url()
    watching = Watching(idle, wedged, dead)
    try:
        watching.until("three polls", lambda: watching.polls() >= 3)
        yield watching, idle, wedged, dead
    finally:
        watching.close()


def test_ready_answers_per_endpoint_for_a_load_balancer(pool: tuple[Watching, str, str, str]) -> None:
    watching, idle, wedged, dead = pool
    watching.until("the wedged engine drained", lambda: watching.get(f"/ready?url={wedged}")[0] == 503)
    code, body = watching.get(f"/ready?url={wedged}")
    assert (code, body.split(";")[0]) == (503, "not ready: stalled: 4 running, 0 waiting")
    assert "(window 0.3 s)" in body  # judged under --drain-after, not the liveness window
    assert watching.get(f"/ready?url={idle}") == (200, "ready: idle: 0 running, 0 waiting\n")
    code, body = watching.get(f"/ready?url={dead}")
    assert (code, body.split(":")[:2]) == (503, ["not ready", " unreachable"])
    assert watching.get("/ready?url=http://10.9.9.9:1/metrics")[0] == 404
    assert watching.get("/ready")[0] == 400
    assert watching.get("/nothing")[0] == 404
    assert watching.get("/metrics", method="POST")[0] == 405


@pytest.mark.needs("promtool")
def test_metrics_follow_prometheus_conventions_and_tell_each_verdict(pool: tuple[Watching, str, str, str]) -> None:
    watching, idle, wedged, dead = pool
    watching.until("the wedged engine stalled", lambda: "stalled" in watching.get(f"/ready?url={wedged}")[1])
    watching.until(
        "the liveness window passed",
        lambda: (
            f'stallprobe_engine_verdict{{url="{wedged}",engine="0",verdict="stalled"}} 1' in watching.get("/metrics")[1]
        ),
    )
    code, text = watching.get("/metrics")
    assert code == 200
    assert f'stallprobe_engine_verdict{{url="{wedged}",engine="0",verdict="stalled"}} 1' in text
    assert f'stallprobe_engine_verdict{{url="{wedged}",engine="0",verdict="idle"}} 0' in text
    assert f'stallprobe_engine_verdict{{url="{idle}",engine="0",verdict="idle"}} 1' in text
    assert f'stallprobe_engine_running_requests{{url="{wedged}",engine="0"}} 4' in text
    assert f'stallprobe_engine_ready{{url="{wedged}",engine="0"}} 0' in text
    assert f'stallprobe_engine_ready{{url="{idle}",engine="0"}} 1' in text
    assert f'stallprobe_engine_verdict{{url="{dead}",engine="",verdict="unreachable"}} 1' in text
    errors = next(
        line for line in text.splitlines() if line.startswith(f'stallprobe_scrape_errors_total{{url="{dead}"}}')
    )
    assert int(errors.split()[1]) >= 3
    checked = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True, text=True, check=False)
    assert (checked.returncode, checked.stdout + checked.stderr) == (0, "")


def test_many_clients_at_once_get_answers_and_the_polling_goes_on(pool: tuple[Watching, str, str, str]) -> None:
    watching, idle, _, _ = pool
    before = watching.polls()
    with ThreadPoolExecutor(32) as clients:
        codes = list(clients.map(lambda _: watching.get(f"/ready?url={idle}")[0], range(200)))
    # Over MAX_CLIENTS at once, a client is told 503 at once rather than queued behind the others.
    assert set(codes) <= {200, 503}
    assert codes.count(200) >= len(codes) // 2
    watching.until("two more polls", lambda: watching.polls() >= before + 2)


def test_silent_clients_are_dropped_and_do_not_block_the_others(pool: tuple[Watching, str, str, str]) -> None:
    watching, idle, _, _ = pool
    host, port = watching.base.removeprefix("http://").rsplit(":", 1)
    silent = [socket.create_connection((host, int(port))) for _ in range(MAX_CLIENTS // 2)]
    try:
        assert watching.get(f"/ready?url={idle}")[0] == 200  # served beside them
        for sock in silent:
            sock.settimeout(CLIENT_TIMEOUT + WAIT)
        dropped = threading.Event()

        def drained() -> None:
            if all(sock.recv(1) == b"" for sock in silent):
                dropped.set()

        threading.Thread(target=drained, daemon=True).start()
        assert dropped.wait(CLIENT_TIMEOUT + WAIT), "a silent client was never dropped"
    finally:
        for sock in silent:
            sock.close()


def test_a_bad_listen_address_is_a_usage_error(served: StubEngine) -> None:
    served.route("/metrics", vllm_page(0, 1, 1))
    for address, words in (("nowhere", "--listen must be HOST:PORT (got 'nowhere')"), ("127.0.0.1:99999", "HOST:PORT")):
        done = subprocess.run(
            [sys.executable, "-m", "stallprobe", "watch", "--listen", address, served.url],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        assert (done.returncode, done.stdout.count("\n")) == (2, 1)
        assert words in done.stdout
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "stallprobe",
                "watch",
                "--listen",
                f"127.0.0.1:{port}",
                served.url,
            ],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        assert done.returncode == 2
        assert done.stdout.startswith(f"error: --listen 127.0.0.1:{port}: ")
