#!/usr/bin/env bash
# Provisioning of the Vagrant VM (as root): installs LVM and the file system
# tools, a venv with the repo and its test extras, finds the two extra disks
# and runs the real-LVM suite (tests/vm) natively on them.
#
# Environment (set by the Vagrantfile):
#   CSILVM_REPO          repo root in the VM (default /vagrant)
#   CSILVM_VENV          venv to create (default /opt/csilvm-venv)
#   CSILVM_PV_SERIALS    disk serials to look for in /dev/disk/by-id (libvirt)
#   CSILVM_PV_SIZES_MIB  disk sizes in MiB to look for otherwise (VirtualBox)
#   CSILVM_TEST_DEVICES  comma-separated devices: skips the search. THEY ARE WIPED.
#   CSILVM_PYTEST_ARGS   extra pytest arguments (split on spaces)
set -euo pipefail

REPO="${CSILVM_REPO:-/vagrant}"
VENV="${CSILVM_VENV:-/opt/csilvm-venv}"
log() { printf 'provision: %s\n' "$*"; }

export DEBIAN_FRONTEND=noninteractive
pkgs=(lvm2 e2fsprogs xfsprogs btrfs-progs python3-venv python3-dev gcc util-linux)
missing=()
for p in "${pkgs[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
    log "apt-get install ${missing[*]}"
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

if [ ! -x "$VENV/bin/python" ]; then
    log "creating venv $VENV"
    python3 -m venv "$VENV"
    "$VENV/bin/python" -m pip install -q --upgrade pip
fi
log "pip install $REPO[test]"
"$VENV/bin/python" -m pip install -q "$REPO[test]"

# --- the extra disks -------------------------------------------------------
root_disk="$(lsblk -no PKNAME "$(findmnt -no SOURCE /)" | head -n 1)"
usable() {
    # A whole disk, not the root disk, with no partitions and nothing mounted.
    local dev="$1" name
    name="$(basename "$(readlink -f "$dev")")"
    [ -b "$dev" ] || return 1
    [ "$name" != "$root_disk" ] || return 1
    [ "$(lsblk -no TYPE "$dev" | head -n 1)" = disk ] || return 1
    [ "$(lsblk -no NAME "$dev" | wc -l)" -eq 1 ] || return 1
    ! findmnt -S "$dev" >/dev/null
}

devices=()
if [ -n "${CSILVM_TEST_DEVICES:-}" ]; then
    IFS=',' read -r -a devices <<<"$CSILVM_TEST_DEVICES"
else
    IFS=',' read -r -a serials <<<"${CSILVM_PV_SERIALS:-}"
    for s in "${serials[@]}"; do
        link="/dev/disk/by-id/virtio-$s"
        if [ -e "$link" ] && usable "$link"; then
            devices+=("$(readlink -f "$link")")
        fi
    done
    if [ "${#devices[@]}" -ne "${#serials[@]}" ]; then
        devices=()
        IFS=',' read -r -a sizes <<<"${CSILVM_PV_SIZES_MIB:-}"
        for mib in "${sizes[@]}"; do
            bytes=$((mib * 1024 * 1024))
            while read -r name size; do
                dev="/dev/$name"
                if [ "$size" = "$bytes" ] && usable "$dev" \
                    && [[ " ${devices[*]} " != *" $dev "* ]]; then
                    devices+=("$dev")
                    break
                fi
            done < <(lsblk -dbn -o NAME,SIZE)
        done
    fi
fi
if [ "${#devices[@]}" -lt 2 ]; then
    log "found ${#devices[@]} extra disk(s), need 2: ${devices[*]:-none}" >&2
    lsblk >&2
    exit 1
fi
CSILVM_TEST_DEVICES="$(IFS=','; printf '%s' "${devices[*]}")"
log "PV disks: $CSILVM_TEST_DEVICES (wiped by the tests)"

# --- the suite --------------------------------------------------------------
extra=()
if [ -n "${CSILVM_PYTEST_ARGS:-}" ]; then
    read -r -a extra <<<"$CSILVM_PYTEST_ARGS"
fi
modprobe dm-raid || true
cd "$REPO"
log "running pytest tests/vm"
CSILVM_IN_VM=1 CSILVM_TEST_DEVICES="$CSILVM_TEST_DEVICES" \
    "$VENV/bin/python" -m pytest -p no:cacheprovider \
    --junitxml=/home/vagrant/csilvm-vm-junit.xml tests/vm -v "${extra[@]}"
