"""Tests that need a real kernel with device-mapper: they run inside a QEMU guest.

``python -m tests.vm.runner -- tests/vm`` boots the guest and runs them there.
"""
