"""Parsing /proc/self/mountinfo and looking mounts up in the snapshot."""

import os

import pytest

from mount.table import MountinfoParseError, MountTable, parse_mountinfo, parse_mountinfo_line, read_mount_table

# A host with: an LV staged with a space and a backslash in its path, published
# twice (a bind with propagation fields, and a read-only bind of a subtree),
# a raw block volume bound onto a file, a btrfs (anonymous 0:N) mount, and a
# path with two stacked mounts (tmpfs over the staged LV).
SAMPLE = r"""22 27 0:21 / /proc rw,relatime - proc proc rw
27 1 254:0 / / rw,relatime shared:1 - ext4 /dev/vda rw,discard
24 27 0:6 / /dev rw,relatime shared:2 - devtmpfs devtmpfs rw,size=12334524k,mode=755
101 27 253:3 / /var/lib/kubelet/plugins/csilvm/staging/pv\0401\134x rw,relatime shared:50 - xfs /dev/mapper/vg-pv1 rw,attr2,inode64
102 27 253:3 / /var/lib/kubelet/pods/a/volumes/pv1/mount rw,relatime shared:50 master:7 - xfs /dev/mapper/vg-pv1 rw,attr2,inode64
103 27 253:3 /sub/dir /var/lib/kubelet/pods/b/volumes/pv1/mount ro,nosuid,relatime shared:50 - xfs /dev/mapper/vg-pv1 rw,attr2,inode64
104 24 0:6 /dm-4 /var/lib/kubelet/pods/c/volumeDevices/pv2 ro,relatime - devtmpfs devtmpfs rw,size=12334524k,mode=755
105 27 0:45 / /mnt/btrfs rw,relatime - btrfs /dev/loop7 rw,space_cache=v2,subvolid=5,subvol=/
110 27 7:3 / /mnt/stack rw,relatime - ext4 /dev/loop3 rw
111 110 0:50 / /mnt/stack rw,relatime - tmpfs tmpfs rw,size=1024k
"""


@pytest.fixture
def table() -> MountTable:
    return MountTable(parse_mountinfo(SAMPLE))


def test_parses_every_field_of_a_line():
    entry = parse_mountinfo_line(
        "36 35 98:0 /mnt1 /mnt2 rw,noatime master:1 - ext3 /dev/root rw,errors=continue"
    )
    assert entry.mount_id == 36
    assert entry.parent_id == 35
    assert (entry.major, entry.minor) == (98, 0)
    assert entry.root == "/mnt1"
    assert entry.mount_point == "/mnt2"
    assert entry.options == ("rw", "noatime")
    assert entry.optional_fields == ("master:1",)
    assert entry.fs_type == "ext3"
    assert entry.source == "/dev/root"
    assert entry.super_options == ("rw", "errors=continue")
    assert entry.device_number == os.makedev(98, 0)
    assert not entry.read_only


def test_no_optional_fields_and_several_optional_fields(table):
    assert table.at("/proc").optional_fields == ()
    assert table.at("/var/lib/kubelet/pods/a/volumes/pv1/mount").optional_fields == ("shared:50", "master:7")


def test_octal_escapes_in_paths_are_decoded(table):
    entry = table.entries[3]
    assert entry.mount_point == "/var/lib/kubelet/plugins/csilvm/staging/pv 1\\x"
    assert table.at("/var/lib/kubelet/plugins/csilvm/staging/pv 1\\x") is entry
    assert table.is_mount_point("/var/lib/kubelet/plugins/csilvm/staging/pv 1\\x")


def test_escaped_tab_and_newline_in_source_and_root():
    entry = parse_mountinfo_line(r"5 1 0:9 /a\011b /m\012n rw - tmpfs my\040src rw")
    assert entry.root == "/a\tb"
    assert entry.mount_point == "/m\nn"
    assert entry.source == "my src"


def test_bind_mount_of_subtree_keeps_root_and_device(table):
    bind = table.at("/var/lib/kubelet/pods/b/volumes/pv1/mount")
    staged = table.at("/var/lib/kubelet/plugins/csilvm/staging/pv 1\\x")
    assert bind.root == "/sub/dir"
    assert bind.device_number == staged.device_number
    assert bind.read_only
    assert bind.options == ("ro", "nosuid", "relatime")
    assert bind.super_options == ("rw", "attr2", "inode64")  # the superblock stays rw


def test_device_node_bound_onto_a_file(table):
    block = table.at("/var/lib/kubelet/pods/c/volumeDevices/pv2")
    assert block.fs_type == "devtmpfs"
    assert block.root == "/dm-4"
    assert block.read_only


def test_topmost_of_stacked_mounts(table):
    stacked = table.all_at("/mnt/stack")
    assert [e.mount_id for e in stacked] == [110, 111]
    assert table.at("/mnt/stack").fs_type == "tmpfs"


def test_topmost_does_not_rely_on_file_order():
    lines = SAMPLE.strip().splitlines()
    reordered = MountTable(parse_mountinfo("\n".join([lines[-1], *lines[:-1]])))
    assert reordered.at("/mnt/stack").mount_id == 111


def test_paths_are_normalized_for_lookup(table):
    assert table.at("/mnt/stack/") is not None
    assert table.at("/mnt//btrfs") is not None
    assert table.at("/mnt/stack/../btrfs").fs_type == "btrfs"


def test_not_a_mount_point(table):
    assert table.at("/mnt") is None
    assert not table.is_mount_point("/mnt")
    assert not table.is_mount_point("/mnt/stac")  # a prefix of a mount point is not one


def test_containing_finds_the_deepest_mount_above(table):
    assert table.containing("/mnt/stack/a/b").mount_id == 111
    assert table.containing("/mnt/other").mount_point == "/"
    assert table.containing("/proc/self").fs_type == "proc"


def test_under_lists_mounts_at_and_below_a_path(table):
    assert [e.mount_id for e in table.under("/mnt")] == [105, 110, 111]
    assert [e.mount_id for e in table.under("/mnt/stack")] == [110, 111]
    assert table.under("/mnt/sta") == ()


def test_blank_lines_are_skipped():
    assert len(parse_mountinfo("\n" + SAMPLE + "\n\n")) == 10


@pytest.mark.parametrize(
    "line",
    [
        "36 35 98:0 /mnt1 /mnt2 rw,noatime master:1 ext3 /dev/root rw",  # no separator
        "36 35 98:0 /mnt1 /mnt2 rw - ext3",  # missing source and super options
        "36 35 980 /mnt1 /mnt2 rw - ext3 /dev/root rw",  # bad major:minor
        "x 35 98:0 /mnt1 /mnt2 rw - ext3 /dev/root rw",  # non-numeric id
    ],
)
def test_malformed_lines_raise(line):
    with pytest.raises(MountinfoParseError):
        parse_mountinfo_line(line)


def test_read_mount_table_from_a_file(tmp_path):
    path = tmp_path / "mountinfo"
    path.write_text(SAMPLE)
    assert read_mount_table(str(path)).at("/mnt/btrfs").source == "/dev/loop7"


def test_read_the_real_table():
    table = read_mount_table()
    root = table.at("/")
    assert root is not None
    assert root.device_number == os.stat("/").st_dev or root.fs_type in ("btrfs", "overlay", "zfs")
