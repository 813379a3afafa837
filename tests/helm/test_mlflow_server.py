"""The chart's MLflow server, for real: `mlflow server` from this environment started with exactly the
command, arguments and environment the Deployment renders (only the bind address and port swapped for
loopback ones), on a real PostgreSQL started in a temp dir, with artifacts proxied to a moto S3 server.

Secrets are resolved the way the kubelet would: the `uri` key of the postgres Secret is the database URI,
the S3 Secret's keys are moto's. Where `make test-images` built the chart's image (images/mlflow/Dockerfile),
the server runs in it, as its user and with its environment, instead of from this environment.
"""

from __future__ import annotations

import glob
import os
import pwd
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cluster.sandbox import built_images
from tests.helm.chart import expand_kubelet_references, one, render
from tests.integration.services import S3_ENV, free_port, start_moto, stop, wait_until_up

BIN = Path(sys.executable).parent
BUCKET = "mlflow-artifacts"


def postgres_binaries() -> Path | None:
    """The bin folder of the newest PostgreSQL installed (Debian's layout, or on PATH)."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(Path(p).parts[-3]))
    if found:
        return Path(found[-1]).parent
    initdb = shutil.which("initdb")
    return Path(initdb).parent if initdb else None


def as_unprivileged_user() -> dict:
    """Popen arguments that drop root (postgres refuses to run as root); nothing when not root."""
    if os.geteuid() != 0:
        return {}
    nobody = pwd.getpwnam("nobody")
    return {"user": nobody.pw_uid, "group": nobody.pw_gid, "extra_groups": []}


@pytest.fixture(scope="module")
def postgres() -> Iterator[tuple[str, str]]:
    """A PostgreSQL server on loopback with a `mlflow` database; yields (superuser DSN, mlflow's URI)."""
    psycopg2 = pytest.importorskip("psycopg2", reason="psycopg2-binary (dev extra) is not installed")
    binaries = postgres_binaries()
    if binaries is None:
        pytest.skip("PostgreSQL server binaries (initdb, postgres) are not installed")
    workdir = Path(tempfile.mkdtemp(prefix="alignflow-postgres-"))
    drop = as_unprivileged_user()
    superuser_password, mlflow_password = secrets.token_hex(8), f"mlflow-{secrets.token_hex(8)}"
    (workdir / "password").write_text(superuser_password)
    if drop:
        shutil.chown(workdir, drop["user"], drop["group"])
        shutil.chown(workdir / "password", drop["user"], drop["group"])
    log = (workdir / "postgres.log").open("w")
    subprocess.run([str(binaries / "initdb"), "-D", str(workdir / "data"), "-U", "postgres", "--auth=scram-sha-256",
                    f"--pwfile={workdir / 'password'}", "--encoding=UTF8", "--no-sync"],
                   cwd=workdir, stdout=log, stderr=subprocess.STDOUT, check=True, timeout=120, **drop)
    port = free_port()
    server = subprocess.Popen([str(binaries / "postgres"), "-D", str(workdir / "data"), "-h", "127.0.0.1",
                               "-p", str(port), "-k", str(workdir), "-c", "fsync=off"],
                              cwd=workdir, stdout=log, stderr=subprocess.STDOUT, **drop)
    admin = f"postgresql://postgres:{superuser_password}@127.0.0.1:{port}/postgres"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                connection = psycopg2.connect(admin)
                break
            except psycopg2.OperationalError:
                if server.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"postgres did not start:\n{(workdir / 'postgres.log').read_text()[-3000:]}")
                time.sleep(0.2)
        connection.autocommit = True
        with connection.cursor() as cursor:
            cursor.execute(f"CREATE ROLE mlflow LOGIN PASSWORD '{mlflow_password}'")
            cursor.execute("CREATE DATABASE mlflow OWNER mlflow")
        connection.close()
        yield admin, f"postgresql://mlflow:{mlflow_password}@127.0.0.1:{port}/mlflow"
    finally:
        server.send_signal(2)  # SIGINT: postgres' fast shutdown
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
        log.close()
        shutil.rmtree(workdir, ignore_errors=True)


@pytest.fixture(scope="module")
def s3_endpoint(tmp_path_factory) -> Iterator[str]:
    import boto3

    process, endpoint = start_moto(tmp_path_factory.mktemp("moto"))
    try:
        boto3.client("s3", endpoint_url=endpoint, **{key.lower(): value for key, value in S3_ENV.items()
                                                      if key != "AWS_DEFAULT_REGION"},
                     region_name=S3_ENV["AWS_DEFAULT_REGION"]).create_bucket(Bucket=BUCKET)
        yield endpoint
    finally:
        stop(process)


def rendered_server(s3_endpoint: str) -> dict:
    values = {"mlflow": {"enabled": True, "backend": {"type": "postgres", "postgresSecret": "mlflow-db"},
                         "artifactsDestination": f"s3://{BUCKET}/mlflow"},
              "s3": {"endpoint": s3_endpoint, "credentialsSecret": "s3-credentials"}}
    [container] = one(render(values), "Deployment")["spec"]["template"]["spec"]["containers"]
    return container


def command_line(container: dict, env: dict[str, str], port: int, in_image: bool = False) -> list[str]:
    """The container's argv as the kubelet expands it, with the venv's `mlflow` (unless it runs in the image) and a
    loopback address instead of 0.0.0.0:5000."""
    program, *rest = container["command"]
    program = program if in_image else str(BIN / program)
    argv = [program, *rest, *(expand_kubelet_references(arg, env) for arg in container["args"])]
    for rendered, local in (("--host=0.0.0.0", "--host=127.0.0.1"), ("--port=5000", f"--port={port}")):
        assert argv.count(rendered) == 1, argv
        argv[argv.index(rendered)] = local
    return argv


def environment(container: dict, secret_data: dict[tuple[str, str], str], home: Path) -> dict[str, str]:
    """The container's env as the kubelet builds it: values expanded, Secret references resolved."""
    env = {"PATH": os.environ["PATH"], "HOME": str(home), "LANG": "C.UTF-8"}
    for item in container["env"]:
        if "value" in item:
            env[item["name"]] = expand_kubelet_references(item["value"], env)
        else:
            reference = item["valueFrom"]["secretKeyRef"]
            env[item["name"]] = secret_data[(reference["name"], reference["key"])]
    return env


def test_rendered_mlflow_server_runs_on_postgres_with_artifacts_in_s3(postgres, s3_endpoint, tmp_path):
    import boto3
    import psutil
    import psycopg2
    from mlflow.tracking import MlflowClient

    admin_dsn, database_uri = postgres
    container = rendered_server(s3_endpoint)
    port = free_port()
    secret_data = {("mlflow-db", "uri"): database_uri,
                   ("s3-credentials", "AWS_ACCESS_KEY_ID"): S3_ENV["AWS_ACCESS_KEY_ID"],
                   ("s3-credentials", "AWS_SECRET_ACCESS_KEY"): S3_ENV["AWS_SECRET_ACCESS_KEY"]}
    log = tmp_path / "mlflow.log"
    env = environment(container, secret_data, tmp_path)
    image = built_images().get(container["image"])
    if image:  # the image brings PATH and HOME
        from tests.images.real import containers

        env = {name: value for name, value in env.items() if name not in ("PATH", "HOME")}
        server = containers.start(image, tmp_path / "pod", command_line(container, env, port, in_image=True), env,
                                  log=log)
    else:
        server = subprocess.Popen(command_line(container, env, port), cwd=tmp_path, env=env, stdout=log.open("w"),
                                  stderr=subprocess.STDOUT)
    uri = f"http://127.0.0.1:{port}"
    try:
        wait_until_up(f"{uri}/health", server, 90, log)
        # the database password is nowhere on a command line of the server's processes (what `ps` shows)
        password = database_uri.split(":")[2].split("@")[0]
        processes = [psutil.Process(server.pid), *psutil.Process(server.pid).children(recursive=True)]
        assert not [p.pid for p in processes if password in " ".join(p.cmdline())]
        # the server and its uvicorn worker, without MLflow's job runner and its consumers (the chart turns them off)
        assert [p for p in processes if "uvicorn" in p.cmdline()]
        assert not [p.cmdline() for p in processes if "mlflow.server.jobs._job_runner" in p.cmdline()]

        client = MlflowClient(tracking_uri=uri)
        run_id = client.create_run("0").info.run_id
        client.log_param(run_id, "beta", "0.1")
        client.log_metric(run_id, "loss", 0.25, step=3)
        report = tmp_path / "report.md"
        report.write_text("# chosen > rejected\n")
        client.log_artifact(run_id, str(report))
        client.set_terminated(run_id)

        [listed] = client.search_runs(["0"], filter_string="params.beta = '0.1'")
        assert listed.info.run_id == run_id and listed.data.metrics == {"loss": 0.25}
        downloaded = client.download_artifacts(run_id, "report.md", str(tmp_path / "downloaded"))
        assert Path(downloaded).read_text() == "# chosen > rejected\n"
    finally:
        stop(server)

    # the run is in PostgreSQL and the artifact in the bucket the chart named
    with psycopg2.connect(admin_dsn.rsplit("/", 1)[0] + "/mlflow") as connection, connection.cursor() as cursor:
        cursor.execute("SELECT key, value FROM params WHERE run_uuid = %s", (run_id,))
        assert cursor.fetchall() == [("beta", "0.1")]
    s3 = boto3.client("s3", endpoint_url=s3_endpoint, aws_access_key_id=S3_ENV["AWS_ACCESS_KEY_ID"],
                      aws_secret_access_key=S3_ENV["AWS_SECRET_ACCESS_KEY"], region_name=S3_ENV["AWS_DEFAULT_REGION"])
    keys = [item["Key"] for item in s3.list_objects_v2(Bucket=BUCKET, Prefix="mlflow/")["Contents"]]
    assert keys == [f"mlflow/0/{run_id}/artifacts/report.md"]
