"""A stand-in for the trainer process, running as the trainer image's uid with credentials planted on it.

As root, the stand-in is started as uid 1000 (images/trainer/Dockerfile's user) with setuid; as uid 1000 or
65534 it runs as this user; any other user skips with the reason. Its environment holds an
AWS_SECRET_ACCESS_KEY and an MLflow token, and `ALIGNFLOW_SECRET_ENV_DIRS` names a folder holding a Secret
file, as a TrainJob's pod has them; an output folder of its own stands for the stage's output.

Under `make test-images` (`ALIGNFLOW_TEST_IMAGES` lists the built images) the stand-in runs inside the built
trainer image instead, as a pod of it would (`tests/cluster/sandbox.py`: the image's filesystem, Python and
installed trainer, its user, its ENV), with a service-account token mounted where the kubelet puts it; the
planted folder is mounted into the pod at the same path, so the tests read it from here as before.
"""

from __future__ import annotations

import json
import os
import shutil
import site
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.trainer.sandbox.kernel import skip_without_the_local_sandbox
from trainer.secret_keys import SECRET_DIRS_VARIABLE

IMAGE_UID = 1000
ALLOWED_UIDS = (IMAGE_UID, 65534)
SECRET = "planted-secret-value-7f3a"
REPOSITORY = Path(__file__).parents[3]


class TrainerStandIn:
    """The stand-in process and the folders planted around it."""

    def __init__(self, process: subprocess.Popen, base: Path, uid: int, interpreter: str, image=None, pod=None):
        self.process, self.base, self.uid, self.interpreter = process, base, uid, interpreter
        self.image, self.pod = image, pod  # the built trainer image and the stand-in's pod, under make test-images
        self.secret_file = base / "secrets" / "AWS_SECRET_ACCESS_KEY"
        self.output_dir = base / "output"

    @property
    def pid(self) -> int:
        return self.process.pid  # in a pod too: its command execs its way to the stand-in (no PID namespace)

    def host_path(self, path: str) -> Path:
        """Where a path the stand-in sees lies on this machine: the same path, except the pod's own /tmp."""
        if self.pod is None or Path(path).is_relative_to(self.base):
            return Path(path)
        return self.pod.host_path(path)

    def _ask(self, request: dict) -> dict:
        self.process.stdin.write(json.dumps(request) + "\n")
        self.process.stdin.flush()
        line = self.process.stdout.readline()
        assert line, f"the stand-in died: {self.process.stderr.read()}"
        return json.loads(line)

    def run(self, code: str, **limits) -> dict:
        """The code's result in the sandbox, with the seconds the call took."""
        result = self._ask({"code": code, "limits": limits})
        assert "error" not in result, result["error"]
        return result

    def run_in(self, scratch_root: str, code: str, **limits) -> dict:
        """Like `run`, with the scratch folder made in `scratch_root` instead of the stand-in's TMPDIR."""
        result = self._ask({"code": code, "limits": limits, "scratch_root": scratch_root})
        assert "error" not in result, result["error"]
        return result

    def run_plain(self, code: str) -> dict:
        """The code's result without the sandbox, as this process (the control)."""
        return self._ask({"code": code, "plain": True})

    def run_together(self, *runs: tuple[str, dict]) -> list[dict]:
        """Several programs at once, each (code, limits), from threads of the stand-in."""
        answers = self._ask({"concurrent": [{"code": code, "limits": limits} for code, limits in runs]})["answers"]
        assert not any("error" in answer for answer in answers), answers
        return answers

    def check(self, profile_denials: dict[int, int] | None = None) -> dict:
        return self._ask({"check": True, "profile_denials": {str(k): v for k, v in (profile_denials or {}).items()}})


def _python_path() -> str:
    """This checkout first, then the site-packages this interpreter uses (pydantic for the stand-in)."""
    return ":".join([str(REPOSITORY), *site.getsitepackages()])


def _interpreter_for(uid: int) -> str | None:
    """A Python of this version that `uid` can execute and import pydantic with, or None."""
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    for candidate in (sys.executable, f"/usr/bin/python{version}", f"/usr/local/bin/python{version}"):
        if not os.path.exists(candidate):
            continue
        try:
            probe = subprocess.run([candidate, "-c", "import pydantic"], env={"PYTHONPATH": _python_path()},
                                   capture_output=True, **_as_user(uid))
        except PermissionError:
            continue  # not executable by uid (a Python under root's home)
        if probe.returncode == 0:
            return candidate
    return None


def _as_user(uid: int) -> dict:
    return {"user": uid, "group": uid, "extra_groups": []} if os.geteuid() == 0 and uid != 0 else {}


def launch_as_trainer(stand_in: TrainerStandIn, code: str) -> tuple[subprocess.Popen, Path]:
    """Another trainer process, as the stand-in's uid (in a pod of the image where the stand-in runs in one),
    running `code` in the sandbox (60 s); returns it and the folder its scratch folders go in."""
    scratch_root = stand_in.base / "tmp"
    command = ("import sys\nfrom trainer.sandbox import SandboxLimits, run_python\n"
               "run_python(sys.stdin.read(), limits=SandboxLimits(wall_seconds=60))")
    if stand_in.image is not None:
        argv, env, _ = in_image(stand_in.image, stand_in.base, ["python", "-c", command], {"TMPDIR": str(scratch_root)})
        process = subprocess.Popen(argv, stdin=subprocess.PIPE, text=True, env=env)
    else:
        process = subprocess.Popen([stand_in.interpreter, "-c", command], stdin=subprocess.PIPE, text=True,
                                   env={"PATH": "/usr/bin:/bin", "PYTHONPATH": _python_path(),
                                        "TMPDIR": str(scratch_root)},
                                   cwd=stand_in.base, **_as_user(stand_in.uid))
    process.stdin.write(code)
    process.stdin.close()
    return process, scratch_root


def built_trainer_image():
    """The trainer image `make test-images` built (an ImageRoot), or None outside it."""
    from tests.cluster.sandbox import built_images

    return next((root for name, root in built_images().items() if name.startswith("ghcr.io/alignflow/trainer")), None)


def in_image(image, base: Path, argv: list[str], env: dict[str, str]):
    """(argv, env, pod) that run `argv` in a new pod of `image` as its user, with `base` mounted at its own path
    and a service-account token where the kubelet mounts it."""
    from tests.images.real import containers

    pod_folder = Path(tempfile.mkdtemp(prefix="alignflow-escape-pod-"))
    pod, environment = containers.prepare(image, pod_folder, env, volumes={str(base): base})
    pod.mount_service_account("ml-platform", SERVICE_ACCOUNT_TOKEN, b"")
    command, outer_env = pod.command(argv, environment)
    return command, outer_env, pod


SERVICE_ACCOUNT_TOKEN = "service-account-token-3c9e"


@pytest.fixture(scope="module")
def stand_in():
    skip_without_the_local_sandbox()
    image = built_trainer_image()
    uid = image.user[0] if image is not None else IMAGE_UID if os.geteuid() == 0 else os.geteuid()
    if uid not in ALLOWED_UIDS:
        pytest.skip(f"the escape tests run as the trainer image's uid {IMAGE_UID} (or 65534): run them as root, "
                    f"which drops to it, or as that uid (this is uid {uid})")
    interpreter = "python" if image is not None else _interpreter_for(uid)
    if interpreter is None:
        pytest.skip(f"no Python {sys.version_info.major}.{sys.version_info.minor} with pydantic that uid {uid} "
                    f"can execute ({sys.executable} is not reachable by it)")
    base = Path(tempfile.mkdtemp(prefix="alignflow-escape-"))
    for folder in ("secrets", "output", "tmp"):
        (base / folder).mkdir()
    (base / "secrets" / "AWS_SECRET_ACCESS_KEY").write_text(SECRET)
    os.chmod(base, 0o755)
    if os.geteuid() == 0:
        for path in [base, *base.rglob("*")]:
            os.chown(path, uid, uid)
    planted = {"TMPDIR": str(base / "tmp"), "HOME": str(base), "AWS_SECRET_ACCESS_KEY": SECRET,
               "MLFLOW_TRACKING_TOKEN": SECRET, SECRET_DIRS_VARIABLE: str(base / "secrets")}
    pipes = {"stdin": subprocess.PIPE, "stdout": subprocess.PIPE, "stderr": subprocess.PIPE, "text": True}
    pod = None
    if image is not None:  # the image's Python and trainer, the script beside the planted folders
        script = shutil.copy(Path(__file__).with_name("trainer_stand_in.py"), base / "trainer_stand_in.py")
        os.chown(script, uid, uid)
        argv, env, pod = in_image(image, base, ["python", str(script)], planted)
        process = subprocess.Popen(argv, env=env, **pipes)
    else:
        environment = {"PATH": "/usr/bin:/bin", "PYTHONPATH": _python_path(), **planted}
        process = subprocess.Popen([interpreter, str(Path(__file__).with_name("trainer_stand_in.py"))],
                                   env=environment, cwd=base, **pipes, **_as_user(uid))
    stand_in = TrainerStandIn(process, base, uid, interpreter, image, pod)
    try:
        outcome = stand_in.check()
        if "error" in outcome:  # this kernel can hold it (checked above): a sandbox that does not start is a bug
            pytest.fail(f"the sandbox does not start as uid {uid}: {outcome['error']}")
        yield stand_in
    finally:
        process.stdin.close()
        process.wait(timeout=30)
        shutil.rmtree(base, ignore_errors=True)
        if pod is not None:  # its mounts went with its process's namespace
            shutil.rmtree(pod.base, ignore_errors=True)


TOKEN = "service-token-for-tests-0123456789"


@pytest.fixture(scope="session")
def sandbox_service():
    """The real sandbox service on loopback, as the trainer image's uid: (URL, process)."""
    skip_without_the_local_sandbox()
    uid = IMAGE_UID if os.geteuid() == 0 else os.geteuid()
    interpreter = _interpreter_for(uid) if uid in ALLOWED_UIDS else None
    if interpreter is None:
        pytest.skip(f"the sandbox service runs as the trainer image's uid {IMAGE_UID} (or 65534) with a Python it "
                    f"can execute; this is uid {os.geteuid()}")
    environment = {"PATH": "/usr/bin:/bin", "PYTHONPATH": _python_path(), "ALIGNFLOW_SANDBOX_TOKEN": TOKEN,
                   "TMPDIR": "/tmp"}
    process = subprocess.Popen([interpreter, "-m", "trainer.sandbox.server", "--host", "127.0.0.1",
                                "--port", "0", "--max-wall-seconds", "20"], stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE, text=True, env=environment, cwd="/tmp", **_as_user(uid))
    try:
        lines = []
        for line in process.stderr:
            lines.append(line)
            if "listening on" in line:
                break
        else:
            pytest.fail(f"the sandbox service did not start: {''.join(lines)[-800:]}")
        port = int(line.rsplit(":", 1)[1])
        yield f"http://127.0.0.1:{port}", process
    finally:
        process.terminate()
        process.wait(timeout=30)
