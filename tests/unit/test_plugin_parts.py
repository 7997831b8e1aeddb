"""Pure parts of the plugin layer: sizes, names, profiles, ranges, pagination, validation, errors."""

from __future__ import annotations

import grpc
import pytest
from hypothesis import given
from hypothesis import strategies as st

from lvm import errors as storage
from lvm.backend import SizeRange, choose_size
from lvm.names import is_valid_lv_name, lv_name_for, name_from_tags, name_tag
from lvm.profiles import Layout, Profile, parse_profile
from lvm.units import GiB, MiB, format_size, parse_size
from mount import errors as mounting
from plugin import validation
from plugin.errors import RequestInvalid, status_for
from plugin.interceptors import redacted
from plugin.pagination import BadToken, decode_token, encode_token, page
from plugin.settings import PluginSettings
from protos.v1 import csi_pb2 as pb


@pytest.mark.parametrize(
    "text,expected",
    [("1048576", MiB), ("2GiB", 2 * GiB), ("500M", 500 * MiB), ("1g", GiB), ("3KB", 3000), ("0", 0), (" 4 MiB ", 4 * MiB)],
)
def test_parse_size(text, expected):
    assert parse_size(text) == expected


def test_mesos_sizes_are_binary():
    assert parse_size("2GB", decimal_units=False) == 2 * GiB


@pytest.mark.parametrize("text", ["", "abc", "-1", "1.5G", "3 parsecs"])
def test_bad_sizes(text):
    with pytest.raises(storage.InvalidParameters):
        parse_size(text)


def test_format_size():
    assert format_size(2 * GiB) == "2GiB" and format_size(1000) == "1000B" and format_size(0) == "0B"


@given(st.text(min_size=1, max_size=128))
def test_lv_names_are_valid_deterministic_and_tags_round_trip(name):
    lv = lv_name_for(name)
    assert is_valid_lv_name(lv)
    assert lv == lv_name_for(name)
    assert name_from_tags(["other", name_tag(name)]) == name
    assert all(c.isascii() for c in name_tag(name))


@pytest.mark.parametrize("name", ["-rf", "snapshot1", "pvmove", "x_rimage_0", "a/b", "..", "ü"])
def test_unsafe_names_are_mapped(name):
    assert lv_name_for(name) != name and is_valid_lv_name(lv_name_for(name))


def test_distinct_names_map_to_distinct_lvs():
    assert lv_name_for("a/b") != lv_name_for("a b") != lv_name_for("a_b")


def test_profiles():
    assert parse_profile({}) == Profile()
    assert parse_profile({"type": "raid1"}) == Profile(Layout.RAID1, mirrors=1)
    assert parse_profile({"type": "raid0", "stripes": "3", "stripesize": "64KiB"}) == Profile(Layout.RAID0, 3, 64 * 1024)
    assert parse_profile({"type": "raid1", "mirrors": "2"}).min_devices == 3
    for bad in ({"type": "raid5"}, {"type": "linear", "mirrors": "1"}, {"type": "raid1", "mirrors": "0"},
                {"type": "raid0", "stripes": "x"}, {"type": "raid0", "stripesize": "3000"}):
        with pytest.raises(storage.InvalidParameters):
            parse_profile(bad)


def test_choose_size():
    assert choose_size(SizeRange(), MiB, GiB) == GiB
    assert choose_size(SizeRange(1, 0), MiB, GiB) == MiB
    assert choose_size(SizeRange(0, 3 * MiB + 1), MiB, GiB) == 3 * MiB
    assert choose_size(SizeRange(5 * MiB, 0), 2 * MiB, GiB) == 6 * MiB
    for impossible in (SizeRange(5 * MiB + 1, 5 * MiB + 2), SizeRange(2 * MiB, MiB), SizeRange(0, MiB - 1)):
        with pytest.raises(storage.OutOfRange):
            choose_size(impossible, MiB, GiB)


@given(st.integers(0, 1 << 40), st.integers(0, 1 << 40), st.sampled_from([MiB, 2 * MiB, 3 * MiB, 4 * MiB]))
def test_chosen_size_lies_in_the_range(required, limit, granularity):
    try:
        size = choose_size(SizeRange(required, limit), granularity, GiB)
    except storage.OutOfRange:
        low = max(required, granularity)
        assert limit and (-(-low // granularity) * granularity > limit or limit < required)
        return
    assert size % granularity == 0 and SizeRange(required, limit).admits(size)


def test_pagination_tokens():
    items = ["a", "b", "c", "d"]
    first, token = page(items, 2, "", key=str)
    assert first == ["a", "b"] and decode_token(token) == "b"
    rest, token2 = page(items, 2, token, key=str)
    assert rest == ["c", "d"] and token2 == ""
    assert page(items, 0, "", key=str) == (items, "")
    assert page(["c"], 5, encode_token("b"), key=str) == (["c"], "")
    for bad in ("garbage", "!!!", encode_token("x")[:-4] + "zzzz"):
        with pytest.raises(BadToken):
            page(items, 2, bad, key=str)


def test_validation_names_the_missing_field():
    with pytest.raises(RequestInvalid, match="name missing"):
        validation.create_volume(pb.CreateVolumeRequest())
    with pytest.raises(RequestInvalid, match="target_path must be an absolute path"):
        validation.node_unpublish_volume(pb.NodeUnpublishVolumeRequest(volume_id="v", target_path="rel"))
    validation.node_unpublish_volume(pb.NodeUnpublishVolumeRequest(volume_id="v", target_path="/abs"))
    assert "/csi.v1.Node/NodePublishVolume" in validation.VALIDATORS


def test_every_error_has_its_code():
    assert status_for(RequestInvalid("x")) == grpc.StatusCode.INVALID_ARGUMENT
    assert status_for(storage.VolumeNotFound("x")) == grpc.StatusCode.NOT_FOUND
    assert status_for(storage.VolumeExists("x")) == grpc.StatusCode.ALREADY_EXISTS
    assert status_for(storage.OutOfRange("x")) == grpc.StatusCode.OUT_OF_RANGE
    assert status_for(BadToken("x")) == grpc.StatusCode.ABORTED
    assert status_for(mounting.FilesystemMismatch("x")) == grpc.StatusCode.FAILED_PRECONDITION
    assert status_for(storage.BackendUnavailable("x")) == grpc.StatusCode.FAILED_PRECONDITION
    assert status_for(storage.CommandTimeout("x")) == grpc.StatusCode.DEADLINE_EXCEEDED
    assert status_for(ValueError("bug")) == grpc.StatusCode.INTERNAL


def test_redaction_masks_secrets_everywhere():
    request = pb.NodePublishVolumeRequest(volume_id="v", secrets={"token": "s3cr3t"}, volume_context={"k": "visible"})
    line = redacted(request)
    assert "s3cr3t" not in line and "visible" in line and "***" in line
    assert request.secrets["token"] == "s3cr3t", "the request itself is untouched"
    nested = pb.ValidateVolumeCapabilitiesResponse(
        confirmed=pb.ValidateVolumeCapabilitiesResponse.Confirmed(
            volume_capabilities=[pb.VolumeCapability(mount=pb.VolumeCapability.MountVolume(fs_type="xfs"))]
        )
    )
    assert 'fs_type: "xfs"' in redacted(nested)
    from protos.v0_1 import csi_pb2 as pb01

    old = pb01.CreateVolumeRequest(name="n", user_credentials={"pw": "hunter2"})
    assert "hunter2" not in redacted(old)


def test_plugin_name_must_be_a_domain_name():
    PluginSettings(name="lvm.csi.example.com", node_id="n")
    for bad in ("", "-x", "has space", "a" * 64, "x."):
        with pytest.raises(storage.InvalidParameters):
            PluginSettings(name=bad, node_id="n")


def test_keyed_locks_serialize_one_key_and_forget_it_when_free():
    import threading
    import time

    from plugin.core import KeyedLocks

    locks = KeyedLocks()
    inside: list[str] = []
    overlaps: list[str] = []

    def work(key: str) -> None:
        with locks(key):
            if key in inside:
                overlaps.append(key)
            inside.append(key)
            time.sleep(0.01)
            inside.remove(key)

    threads = [threading.Thread(target=work, args=(key,)) for key in ["a", "a", "a", "b", "b"]]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert overlaps == []
    assert len(locks) == 0  # no lock kept for keys nobody works on

    with pytest.raises(RuntimeError):
        with locks("c"):
            assert len(locks) == 1
            raise RuntimeError("released on error too")
    assert len(locks) == 0


def test_notify_ready_speaks_systemds_notify_protocol(monkeypatch):
    import socket
    import uuid

    from plugin.server import notify_ready

    name = f"csilvm-unit-{uuid.uuid4().hex}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as supervisor:
        supervisor.bind("\0" + name)
        monkeypatch.setenv("NOTIFY_SOCKET", "@" + name)
        notify_ready("serving on /run/csi.sock")
        assert supervisor.recv(4096) == b"READY=1\nSTATUS=serving on /run/csi.sock\n"
    monkeypatch.setenv("NOTIFY_SOCKET", "@" + name)
    notify_ready("nobody listens any more")  # no error
    monkeypatch.delenv("NOTIFY_SOCKET")
    notify_ready("no supervisor")  # nothing to do
