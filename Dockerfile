# csilvm in a container.  Run it privileged with /dev and the kubelet/Mesos mount dirs shared, e.g.
#   docker run --privileged -v /dev:/dev -v /run/csi:/run/csi -v /var/lib/kubelet:/var/lib/kubelet:rshared \
#     csilvm serve --backend lvm --volume-group vg0 --endpoint unix:///run/csi/csi.sock
# BASE may be any Debian-based image with Python 3.11+ (where no registry is reachable, a local one).
ARG BASE=python:3.11-slim
FROM ${BASE}

RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      lvm2 e2fsprogs xfsprogs btrfs-progs util-linux mount python3 python3-venv \
 && rm -rf /var/lib/apt/lists/* \
 # Containers have no udev: let LVM create its device nodes itself.
 && sed -i 's/^\(\s*\)# \?udev_sync = 1/\1udev_sync = 0/; s/^\(\s*\)# \?udev_rules = 1/\1udev_rules = 0/' /etc/lvm/lvm.conf

WORKDIR /src
COPY pyproject.toml README.md ./
COPY plugin plugin
COPY lvm lvm
COPY mount mount
COPY protos protos
# A proxy with its own CA can be passed as the build secret "pipcert"; elsewhere it is absent.
RUN --mount=type=secret,id=pipcert \
    python3 -m venv /opt/csilvm \
 && if [ -s /run/secrets/pipcert ]; then cert="--cert /run/secrets/pipcert"; else cert=""; fi \
 && /opt/csilvm/bin/pip install --no-cache-dir $cert /src

ENV PATH=/opt/csilvm/bin:$PATH
ENTRYPOINT ["csilvm"]
CMD ["serve", "--help"]
