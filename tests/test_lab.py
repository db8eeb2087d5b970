"""make lab: JupyterLab starts wherever a user runs it (root included), answers, and lists the notebooks."""

import json
import os
import signal
import socket
import subprocess
import time
import urllib.request

from conftest import ROOT

TOKEN = "kvlab-test-token"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(url: str) -> tuple[int, bytes]:
    request = urllib.request.Request(url, headers={"Authorization": f"token {TOKEN}"})
    with urllib.request.urlopen(request, timeout=5) as response:
        return response.status, response.read()


def test_make_lab_serves_the_notebooks():
    port = free_port()
    env = {**os.environ, "JUPYTER_TOKEN": TOKEN}
    server = subprocess.Popen(
        ["make", "-s", "lab", f"LAB_PORT={port}"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 90
        listing = None
        while time.monotonic() < deadline and server.poll() is None:
            try:
                status, body = get(f"http://127.0.0.1:{port}/api/contents")
                listing = json.loads(body)
                break
            except OSError:
                time.sleep(0.5)
        assert listing is not None, f"no answer on port {port}; make lab exited with {server.poll()}"
        names = {item["name"] for item in listing["content"]}
        assert {p.name for p in (ROOT / "notebooks").glob("*.ipynb")} <= names
        status, page = get(f"http://127.0.0.1:{port}/lab")
        assert status == 200 and b"JupyterLab" in page
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        output = server.communicate(timeout=30)[0]
    assert f"http://127.0.0.1:{port}/lab" in output  # the URL to open is printed
