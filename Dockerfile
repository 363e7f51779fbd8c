# syntax=docker/dockerfile:1
#
# halo-shell for NVIDIA GPUs: the pure-Go binary on NVIDIA's CUDA base image, plus the three
# CUDA libraries it loads at run time (NVRTC, cuBLASLt, NCCL) and nothing else of the CUDA
# toolkit. The driver (libcuda.so.1) is not in the image: the NVIDIA container toolkit mounts
# the host's into /usr/lib/x86_64-linux-gnu when the container starts with GPUs.
#
#   docker build -t halo-shell .                          # about 1.1 GB (an estimate: README)
#   docker build -t halo-shell:jupyter --build-arg JUPYTER=true .
#   docker run --rm --gpus all halo-shell run cuda-info
#   docker run --rm -it --gpus all -v "$PWD/out:/home/halo/out" halo-shell \
#       launch sft /opt/halo-shell/examples/quickstart.yaml
#
# internal/dockerfile's test checks this file against the library searches in the code
# (engine/backend/cuda, engine/comm/nccl): every library is copied under a name those
# searches try, into a folder they search.

ARG GO_VERSION=1.26
ARG CUDA_VERSION=13.0.2
ARG UBUNTU=ubuntu24.04

# The binary, built as CI builds it (scripts/build-static.sh: CGO_ENABLED=0, -trimpath,
# -ldflags='-s -w'; it needs only glibc, for dlopen).
FROM golang:${GO_VERSION}-bookworm AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN scripts/build-static.sh /out/halo-shell

# NVIDIA's runtime image holds every CUDA library; only the ones halo-shell loads leave it.
FROM nvidia/cuda:${CUDA_VERSION}-runtime-${UBUNTU} AS cudalibs

FROM nvidia/cuda:${CUDA_VERSION}-base-${UBUNTU}
# JUPYTER=true adds Debian's Jupyter notebook server (the kernelspec is installed either way,
# for a Jupyter that a derived image or a mounted environment brings).
ARG JUPYTER=false

# Each library under the file name the loader tries first, into the folder where the driver
# is mounted too (searched by both the CUDA backend and NCCL, and by the dynamic loader).
COPY --from=cudalibs /usr/local/cuda/lib64/libnvrtc.so.13 /usr/lib/x86_64-linux-gnu/libnvrtc.so.13
COPY --from=cudalibs /usr/local/cuda/lib64/libnvrtc-builtins.so.13.0 /usr/lib/x86_64-linux-gnu/libnvrtc-builtins.so.13.0
COPY --from=cudalibs /usr/local/cuda/lib64/libcublasLt.so.13 /usr/lib/x86_64-linux-gnu/libcublasLt.so.13
COPY --from=cudalibs /usr/lib/x86_64-linux-gnu/libnccl.so.2 /usr/lib/x86_64-linux-gnu/libnccl.so.2

COPY --from=build /out/halo-shell /usr/local/bin/halo-shell
COPY examples /opt/halo-shell/examples
COPY notebooks /opt/halo-shell/notebooks

RUN set -eux; \
	if [ "$JUPYTER" = true ]; then \
		apt-get update; \
		apt-get install -y --no-install-recommends jupyter-notebook; \
		rm -rf /var/lib/apt/lists/*; \
	fi; \
	halo-shell kernel install --prefix /usr/local; \
	useradd --create-home --user-group --shell /bin/bash halo

USER halo
WORKDIR /home/halo
ENTRYPOINT ["halo-shell"]
