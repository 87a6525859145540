# The GreyRelease controller: `greyrelease run` as a non-root user on python:3.11-slim.
#   make image            (docker or podman; IMAGE=greyrelease:0.1.0 by default)
# Dependencies are the pinned runtime set of requirements.txt, installed from wheels only, so no
# compiler is needed to build the image and none is left in it.
# BASE is any image with Python 3.11 as `python3` (with its venv module) and groupadd/useradd, e.g.
# Debian bookworm's own python3: image/build.sh makes one where no registry can be reached.

ARG BASE=python:3.11-slim

FROM ${BASE} AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
RUN python3 -m venv /opt/greyrelease
WORKDIR /src
COPY requirements.txt ./
RUN /opt/greyrelease/bin/pip install --only-binary=:all: --no-deps --require-virtualenv -r requirements.txt
COPY pyproject.toml README.md ./
COPY greyrelease ./greyrelease
# The project itself, without resolving anything again: its dependencies are exactly the pins above.
RUN /opt/greyrelease/bin/pip install --no-deps . \
 && /opt/greyrelease/bin/pip check \
 && /opt/greyrelease/bin/pip uninstall --yes pip setuptools

FROM ${BASE}
LABEL org.opencontainers.image.title="greyrelease" \
      org.opencontainers.image.description="Progressive canary and batch releases for Kubernetes Deployments" \
      org.opencontainers.image.licenses="Apache-2.0"
RUN groupadd --system --gid 65532 greyrelease \
 && useradd --system --uid 65532 --gid 65532 --home-dir /nonexistent --no-create-home \
      --shell /usr/sbin/nologin greyrelease
COPY --from=build /opt/greyrelease /opt/greyrelease
# Bytecode was compiled at install time; the root filesystem is read-only at run time.
ENV PATH=/opt/greyrelease/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
USER 65532:65532
EXPOSE 8080
ENTRYPOINT ["greyrelease", "run"]
