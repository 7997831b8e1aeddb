#!/usr/bin/env bash
# Idempotent installer of what the LVM-in-a-VM tests need.
#
#   bash tests/vm/install.sh [VENV_PYTHON]
#
# apt: qemu-system-x86, busybox-static, lvm2, thin-provisioning-tools (thin_check for thin pools), a Debian kernel (linux-image-amd64),
#      e2fsprogs, xfsprogs, btrfs-progs.
# pip: virtme-ng (command `vng`) into the venv of VENV_PYTHON (default: the
#      python3 on PATH, or $VIRTUAL_ENV/bin/python when set).
# When everything is present it only checks and returns in well under a second.
set -euo pipefail

PY="${1:-${VIRTUAL_ENV:+$VIRTUAL_ENV/bin/python}}"
PY="${PY:-python3}"

log() { printf 'tests/vm/install.sh: %s\n' "$*"; }

SUDO=()
if [ "$(id -u)" -ne 0 ]; then
    SUDO=(sudo)
fi

apt_pkgs=(qemu-system-x86 busybox-static lvm2 thin-provisioning-tools e2fsprogs xfsprogs btrfs-progs)
missing=()
for p in "${apt_pkgs[@]}"; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
        missing+=("$p")
    fi
done

# A kernel image for the guest: any /boot/vmlinuz-* with its modules tree.
have_kernel=0
for k in /boot/vmlinuz-*; do
    [ -e "$k" ] || continue
    ver="${k#/boot/vmlinuz-}"
    if [ -d "/lib/modules/$ver/kernel" ]; then
        have_kernel=1
        break
    fi
done

updated=0
apt_update() {
    if [ "$updated" -eq 0 ]; then
        log "apt-get update"
        "${SUDO[@]}" apt-get update -qq
        updated=1
    fi
}

if [ "$have_kernel" -eq 0 ]; then
    apt_update
    if apt-cache show linux-image-amd64 >/dev/null 2>&1; then
        missing+=(linux-image-amd64)
    else
        # No metapackage: take the newest linux-image-<ver>-amd64 there is.
        newest="$(apt-cache search --names-only '^linux-image-[0-9.]+-[0-9]+-amd64$' \
            | awk '{print $1}' | sort -V | tail -n 1)"
        if [ -z "$newest" ]; then
            log "no linux-image-*-amd64 package found in apt" >&2
            exit 1
        fi
        missing+=("$newest")
    fi
fi

if [ "${#missing[@]}" -gt 0 ]; then
    apt_update
    log "apt-get install ${missing[*]}"
    DEBIAN_FRONTEND=noninteractive "${SUDO[@]}" apt-get install -y -qq \
        --no-install-recommends "${missing[@]}"
else
    log "apt packages present: ${apt_pkgs[*]} + kernel"
fi

VNG="$(dirname "$("$PY" -c 'import sys; print(sys.executable)')")/vng"
if "$PY" -c 'import importlib.metadata as m; m.version("virtme-ng")' >/dev/null 2>&1 && [ -x "$VNG" ]; then
    log "virtme-ng present in $("$PY" -c 'import sys; print(sys.prefix)')"
else
    log "pip install virtme-ng into $("$PY" -c 'import sys; print(sys.prefix)')"
    "$PY" -m pip install -q virtme-ng
fi

for k in /boot/vmlinuz-*; do
    [ -e "$k" ] && log "kernel: $k"
done
log "ready"
