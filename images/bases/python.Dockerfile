# A stand-in for `python:3.11-slim` built without any registry: Debian bookworm's own Python 3.11 from a
# debootstrap root filesystem (`images/bases/build.sh` makes rootfs.tar). Debian's pip refuses to install into the
# system Python (PEP 668), so a virtualenv at /opt/venv comes first on PATH: `python` and `pip` in the project's
# Dockerfiles then mean what they mean in the official image.
FROM scratch
ADD rootfs.tar /
RUN python3 -m venv /opt/venv
ENV PATH=/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    LANG=C.UTF-8
CMD ["python3"]
