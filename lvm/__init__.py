"""Storage backends: an LVM volume group driven through lvm2, and a loop-device sandbox.

Both implement :class:`lvm.backend.Backend`; the CSI layer in ``plugin/`` only
speaks to that interface and never spells an lvm2 flag.
"""
