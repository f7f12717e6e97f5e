"""A minimal PEP 517 build backend (standard library only) for this example package.

Builds a pure-Python wheel of the package folder named in [project], with its entry points, so that
`pip install --no-build-isolation` works in a venv that has no `wheel` package.
"""

from __future__ import annotations

import base64
import hashlib
import io
import tarfile
import tomllib
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent


def _project() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def _names() -> tuple[str, str, str]:
    project = _project()
    return project["name"], project["name"].replace("-", "_"), project["version"]


def _metadata() -> str:
    project = _project()
    lines = [
        "Metadata-Version: 2.1",
        f"Name: {project['name']}",
        f"Version: {project['version']}",
        f"Summary: {project.get('description', '')}",
        f"Requires-Python: {project.get('requires-python', '')}",
    ]
    lines += [f"Requires-Dist: {dep}" for dep in project.get("dependencies", [])]
    return "\n".join(lines) + "\n"


def _entry_points() -> str:
    groups = _project().get("entry-points", {})
    return "".join(
        f"[{group}]\n" + "".join(f"{k} = {v}\n" for k, v in eps.items()) + "\n" for group, eps in groups.items()
    )


def get_requires_for_build_wheel(config_settings=None):
    return []


def get_requires_for_build_sdist(config_settings=None):
    return []


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    name, dist, version = _names()
    info = f"{dist}-{version}.dist-info"
    files = {str(p.relative_to(ROOT)): p.read_bytes() for p in sorted((ROOT / dist).rglob("*.py"))}
    files[f"{info}/METADATA"] = _metadata().encode()
    files[f"{info}/WHEEL"] = b"Wheel-Version: 1.0\nGenerator: wheel_backend\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    files[f"{info}/entry_points.txt"] = _entry_points().encode()
    record = []
    for path, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(data)}")
    files[f"{info}/RECORD"] = ("\n".join([*record, f"{info}/RECORD,,"]) + "\n").encode()
    filename = f"{dist}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(Path(wheel_directory) / filename, "w", zipfile.ZIP_DEFLATED) as whl:
        for path, data in files.items():
            whl.writestr(path, data)
    return filename


def build_sdist(sdist_directory, config_settings=None):
    _, dist, version = _names()
    filename = f"{dist}-{version}.tar.gz"
    with tarfile.open(Path(sdist_directory) / filename, "w:gz") as tar:
        for path in [
            "pyproject.toml",
            "wheel_backend.py",
            *(str(p.relative_to(ROOT)) for p in sorted((ROOT / dist).rglob("*.py"))),
        ]:
            data = (ROOT / path).read_bytes()
            member = tarfile.TarInfo(f"{dist}-{version}/{path}")
            member.size = len(data)
            tar.addfile(member, io.BytesIO(data))
    return filename
