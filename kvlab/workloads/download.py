"""Download the public request traces that data/traces.toml lists, checking each file's sha256 (make traces)."""

from __future__ import annotations

import hashlib
import os
import tempfile
import urllib.request
from pathlib import Path

from kvlab.core import validate
from kvlab.workloads.traces import MANIFEST_PATH, read_manifest


def sha256_of(path: str | os.PathLike) -> str:
    """The sha256 (hex) of a whole file."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _fetch(url: str, dest: Path) -> None:
    with urllib.request.urlopen(url, timeout=60) as response, open(dest, "wb") as out:
        while chunk := response.read(1 << 20):
            out.write(chunk)


def download(
    dest: str | os.PathLike, manifest: str | os.PathLike = MANIFEST_PATH, names: list[str] | None = None, fetch=_fetch
) -> list[str]:
    """Fetch the manifest's traces into dest and check their sha256; a file already there with the right hash is kept.

    Returns one status line per trace. A hash mismatch leaves no file behind and raises a one-line ValueError.
    """
    entries = read_manifest(manifest)
    for name in names or []:
        validate.one_of("trace", name, entries)
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    report = []
    for name, entry in entries.items():
        if names and name not in names:
            continue
        target = dest / entry["file"]
        if target.is_file() and sha256_of(target) == entry["sha256"]:
            report.append(f"{name}: {target} already present, sha256 ok")
            continue
        fd, tmp = tempfile.mkstemp(dir=dest, prefix=f".{entry['file']}.")
        os.close(fd)
        try:
            fetch(entry["url"], Path(tmp))
            got = sha256_of(tmp)
            if got != entry["sha256"]:
                raise ValueError(
                    f"{entry['url']}: sha256 {got} is not the manifest's {entry['sha256']} "
                    f"for {name}; nothing was written"
                )
            os.replace(tmp, target)
        finally:
            if os.path.exists(tmp):
                os.remove(tmp)
        report.append(f"{name}: downloaded {target} ({target.stat().st_size:,} bytes), sha256 ok")
    return report
