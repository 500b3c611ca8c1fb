# syntax=docker/dockerfile:1
# One image for both kube-vgpu services: `vgpu-scheduler` (extender + admission webhook) and
# `vgpu-device-plugin`. Build from the repository root:
#
#   docker build -t kube-vgpu:0.1.0 .
#
# The image runs as a non-root user (65532) by default, which is what the scheduler uses. The
# device plugin cannot run as that user: it serves a socket in kubelet's root-owned
# /var/lib/kubelet/device-plugins and writes HAMi-core's per-container directories under
# <hookPath>/vgpu on the host, so the chart's DaemonSet sets runAsUser: 0 for it (with every
# capability dropped and no privilege escalation). See docs/install.md.
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

# Stage 1: build the wheel and install it with its dependencies into a self-contained venv.
FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/kube-vgpu
WORKDIR /src
COPY pyproject.toml README.md ./
COPY libs ./libs
COPY services ./services
RUN /opt/kube-vgpu/bin/pip install . \
    && /opt/kube-vgpu/bin/vgpu-scheduler --help > /dev/null \
    && /opt/kube-vgpu/bin/vgpu-device-plugin --help > /dev/null \
    && /opt/kube-vgpu/bin/vgpu-monitor --help > /dev/null

# Stage 2: the runtime: the same Python base, the venv, no sources, no build tools.
FROM ${PYTHON_IMAGE} AS runtime
LABEL org.opencontainers.image.title="kube-vgpu" \
      org.opencontainers.image.description="GPU sharing for Kubernetes (HAMi-compatible scheduler extender, webhook and device plugin)" \
      org.opencontainers.image.licenses="Apache-2.0"
ENV PATH=/opt/kube-vgpu/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1
COPY --from=build /opt/kube-vgpu /opt/kube-vgpu
RUN groupadd --system --gid 65532 vgpu \
    && useradd --system --uid 65532 --gid 65532 --no-create-home --home-dir /nonexistent \
       --shell /usr/sbin/nologin vgpu
USER 65532:65532
# The scheduler by default; the chart names the program in each container's command.
ENTRYPOINT ["vgpu-scheduler"]
