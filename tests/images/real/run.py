"""`make test-images`: build the images here without any registry, run each as the cluster would, print a table.

1. Registry-free bases (`images/bases/build.sh`: debootstrap's Python 3.11, and it with the local CPU torch wheel).
2. The three images from their real Dockerfiles (`images/build.sh`), only BASE_IMAGE changed, pip going through
   this machine's proxy with its CA bundle as a build secret.
3. In a network namespace with only loopback (`unshare --net`): the standalone checks and the pytest scenarios of
   `checks.py`, with the images mounted (`built.py`) so that the emulated cluster's pods run on them.

Needs root, buildah (`apt-get install buildah debootstrap`) and util-linux. About 9 minutes on 2 cores, half of it
pip inside the builds. Options: --skip-build (use the images already built), --keep (leave them mounted).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tests.images.real import built

ROOT = Path(__file__).parents[3]
PYTHON_BASE, TORCH_BASE = "localhost/alignflow-base-python:bookworm", "localhost/alignflow-base-torch-cpu:2.13.0"
HOST_CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")  # Debian's bundle, with any local (proxy) CA in it


def images() -> dict[str, str]:
    """image folder -> the tag images/build.sh gives it."""
    lines = subprocess.run([str(ROOT / "images" / "build.sh")], env={**os.environ, "DRY_RUN": "1"},
                           capture_output=True, text=True, check=True).stdout.splitlines()
    return {line.split("-f images/")[1].split("/")[0]: line.split(" -t ")[1].split()[0] for line in lines}


def preflight() -> None:
    missing = [tool for tool in ("buildah", "debootstrap", "unshare", "ip", "setpriv") if shutil.which(tool) is None]
    if os.geteuid() != 0 or missing:
        sys.exit(f"make test-images needs root and {', '.join(missing) or 'nothing more'} "
                 "(apt-get install buildah debootstrap iproute2)")


def timed(command: list[str], env: dict[str, str], log: Path) -> tuple[bool, float]:
    started = time.monotonic()
    with log.open("a") as out:
        done = subprocess.run(command, cwd=ROOT, env={**os.environ, **env}, stdout=out, stderr=subprocess.STDOUT)
    return done.returncode == 0, time.monotonic() - started


def build_all(workdir: Path) -> list[dict]:
    ca = {"PIP_CA_BUNDLE": str(HOST_CA_BUNDLE)} if HOST_CA_BUNDLE.is_file() else {}
    rows = []
    ok, seconds = timed([str(ROOT / "images" / "bases" / "build.sh")], ca, workdir / "build.log")
    rows.append({"image": "bases", "tag": f"{PYTHON_BASE}, {TORCH_BASE}", "build_s": seconds, "ok": ok,
                 "ran": "debootstrap bookworm + the local torch wheel"})
    for name, tag in images().items():
        if not ok:
            break
        env = {**ca, "ONLY": name, "BASE_IMAGE": PYTHON_BASE, "TRAINER_BASE_IMAGE": TORCH_BASE}
        ok, seconds = timed([str(ROOT / "images" / "build.sh")], env, workdir / "build.log")
        rows.append({"image": name, "tag": tag, "build_s": seconds, "ok": ok, "ran": f"built {tag}"})
    return rows


def run_checks(listing: Path, workdir: Path) -> list[dict]:
    results = workdir / "results.json"
    inner = (f"ip link set lo up && exec {sys.executable} -m tests.images.real.checks --images {listing} "
             f"--results {results} --workdir {workdir / 'checks'}")
    (workdir / "checks").mkdir(exist_ok=True)
    subprocess.run(["unshare", "--net", "sh", "-c", inner], cwd=ROOT)
    return json.loads(results.read_text()) if results.is_file() else [
        {"image": "all", "ran": "the checks", "ok": False, "error": "no results: see the output above"}]


def print_table(builds: list[dict], sizes: dict[str, str], checks: list[dict]) -> None:
    print("\n| image | size | build | what ran | result |\n|---|---|---|---|---|")
    for row in builds:
        size = ", ".join(sizes.get(tag.strip(), "?") for tag in row["tag"].split(","))
        minutes = "" if row["build_s"] is None else f"{row['build_s'] / 60:.1f} min"
        print(f"| {row['image']} | {size} | {minutes} | {row['ran']} | "
              f"{'ok' if row['ok'] else 'FAILED (build.log)'} |")
    for row in checks:
        result = f"ok ({row['seconds']} s)" if row["ok"] else f"FAILED: {row.get('error', '')[:300]}"
        print(f"| {row['image']} | | | {row['ran']} | {result} |")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--skip-build", action="store_true", help="use the images built earlier")
    parser.add_argument("--keep", action="store_true", help="leave the images mounted and the work folder")
    options = parser.parse_args()
    preflight()
    workdir = Path(tempfile.mkdtemp(prefix="alignflow-images-"))
    print(f"make test-images: logs in {workdir}", flush=True)
    tags = images()
    builds = [{"image": name, "tag": tag, "build_s": None, "ok": True, "ran": f"built earlier: {tag}"}
              for name, tag in tags.items()] if options.skip_build else build_all(workdir)
    if not all(row["ok"] for row in builds):
        print_table(builds, {}, [])
        return 1
    sizes = built.image_sizes()
    mounted = {tag: built.mount(tag) for tag in tags.values()}
    try:
        listing = built.write_listing({tag: root for tag, (_, root) in mounted.items()}, workdir / "images.json")
        checks = run_checks(listing, workdir)
    finally:
        if not options.keep:
            for container, _ in mounted.values():
                built.unmount(container)
    print_table(builds, sizes, checks)
    failed = [row for row in checks if not row["ok"]]
    if not failed and not options.keep:
        shutil.rmtree(workdir, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
