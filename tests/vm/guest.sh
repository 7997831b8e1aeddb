#!/usr/bin/env bash
# Runs inside the QEMU guest booted by tests/vm/runner.py (as root).
#
#   bash tests/vm/guest.sh RUN_DIR
#
# RUN_DIR is a directory shared read-write with the host (vng --rwdir). The
# runner put there:
#   env          KEY=VALUE lines: PYTHON (the host venv's python), CWD,
#                PV_SIZES (e.g. "64M,96M,128M", may be empty)
#   pytest-args  the pytest arguments, NUL-separated
# This script writes back:
#   junit.xml    pytest's JUnit XML
#   status       pytest's exit status (a number), written last
#
# It loads the device-mapper/md modules, makes LVM work without udev,
# optionally creates loop-device PVs, and runs pytest with CSILVM_IN_VM=1.
set -uo pipefail

RUN_DIR="${1:?usage: guest.sh RUN_DIR}"
STATUS_FILE="$RUN_DIR/status"

say() { printf 'guest [%6ss]: %s\n' "$(cut -d' ' -f1 /proc/uptime)" "$*"; }

report() {
    # Write the status atomically: the host takes a missing file as "no report".
    printf '%s\n' "$1" >"$STATUS_FILE.tmp" && mv -f "$STATUS_FILE.tmp" "$STATUS_FILE"
}

fail() {
    say "setup failed: $*" >&2
    printf '%s\n' "$*" >"$RUN_DIR/setup-error"
    report 3
    exit 3
}

# --- the runner's settings -------------------------------------------------
PYTHON=""
CWD=""
PV_SIZES=""
while IFS='=' read -r key value; do
    case "$key" in
        PYTHON) PYTHON="$value" ;;
        CWD) CWD="$value" ;;
        PV_SIZES) PV_SIZES="$value" ;;
        '') ;;
        *) say "ignoring unknown setting $key" ;;
    esac
done <"$RUN_DIR/env" || fail "cannot read $RUN_DIR/env"
[ -x "$PYTHON" ] || fail "python $PYTHON is not visible in the guest"

PYTEST_ARGS=()
if [ -s "$RUN_DIR/pytest-args" ]; then
    mapfile -d '' -t PYTEST_ARGS <"$RUN_DIR/pytest-args"
fi

say "kernel $(uname -r), $(nproc) cpu(s), $(awk '/MemTotal/ {print int($2/1024) " MiB"}' /proc/meminfo)"

# --- kernel modules --------------------------------------------------------
for mod in loop dm-mod dm-raid raid0 raid1 dm-thin-pool dm-snapshot; do
    modprobe "$mod" || fail "modprobe $mod failed"
done
[ -e /dev/mapper/control ] || fail "no /dev/mapper/control after modprobe dm-mod"

# --- LVM without udev ------------------------------------------------------
# /etc is a throw-away overlay in the guest (/etc/lvm even an empty tmpfs).
# A config file, unlike environment variables, reaches every lvm command,
# including those run by code that builds a minimal environment.
mkdir -p /etc/lvm || fail "cannot create /etc/lvm"
cat >/etc/lvm/lvm.conf <<'CONF' || fail "cannot write /etc/lvm/lvm.conf"
# written by tests/vm/guest.sh: no udev daemon runs in the test VM
devices {
    obtain_device_list_from_udev = 0
    external_device_info_source = "none"
    use_devicesfile = 0
}
activation {
    udev_sync = 0
    udev_rules = 0
    monitoring = 0
}
global {
    use_lvmpolld = 0
}
CONF
export LVM_SUPPRESS_FD_WARNINGS=1

# --- loop-device PVs, when asked for --------------------------------------
if [ -n "$PV_SIZES" ]; then
    mkdir -p /tmp/csilvm-pvs || fail "cannot create /tmp/csilvm-pvs"
    devices=()
    i=0
    IFS=',' read -r -a sizes <<<"$PV_SIZES"
    for size in "${sizes[@]}"; do
        i=$((i + 1))
        img="/tmp/csilvm-pvs/pv$i.img"
        truncate -s "$size" "$img" || fail "truncate -s $size $img failed"
        dev="$(losetup -f --show "$img")" || fail "losetup $img failed"
        devices+=("$dev")
        say "PV candidate $dev ($size, $img)"
    done
    CSILVM_TEST_DEVICES="$(IFS=','; printf '%s' "${devices[*]}")"
    export CSILVM_TEST_DEVICES
fi

# --- pytest ----------------------------------------------------------------
export CSILVM_IN_VM=1
export PYTHONDONTWRITEBYTECODE=1
export PYTHONUNBUFFERED=1
export HOME=/tmp/csilvm-home
export TMPDIR=/tmp
export PATH="$(dirname "$PYTHON"):/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
mkdir -p "$HOME"

cd "$CWD" || fail "cannot cd to $CWD"
say "running: $PYTHON -m pytest ${PYTEST_ARGS[*]}"
"$PYTHON" -m pytest \
    -p no:cacheprovider \
    --basetemp=/tmp/csilvm-pytest \
    --junitxml="$RUN_DIR/junit.xml" \
    "${PYTEST_ARGS[@]}"
rc=$?
say "pytest exited with $rc"
report "$rc"
exit "$rc"
