"""Running the official CSI conformance suite (kubernetes-csi csi-test's csi-sanity) against a plugin's socket.

The binary is ``../shared/bin/csi-sanity`` beside the repository (v5.4.0, static), or ``$CSI_SANITY``;
tests skip with that reason where it is absent.
"""

from __future__ import annotations

import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BINARY = Path(os.environ.get("CSI_SANITY", REPO.parent / "shared" / "bin" / "csi-sanity"))
MISSING = f"the conformance suite is not installed at {BINARY} (set CSI_SANITY to its path)"

# Why a spec may be skipped: a capability csilvm does not advertise. Any other skip is a spec that did not run.
NOT_ADVERTISED = (
    "ControllerPublishVolume not supported",
    "ControllerUnpublishVolume not supported",
    "Controller Publish, UnpublishVolume not supported",
    "CreateSnapshot not supported",
    "DeleteSnapshot not supported",
    "ListSnapshots not supported",
    "Snapshot not supported",
    "Volume Cloning not supported",
    "GroupControllerService not supported",
)
# csi-sanity v5.4.0 predates CSI 1.12: its ControllerGetCapabilities spec fails at the first capability it does
# not know ("Unknown capability: GET_SNAPSHOT"). csilvm lists GET_SNAPSHOT last, so by then the spec has checked
# every other capability; that failure, with that message and no other, is the suite's gap, not the plugin's.
SUITE_GAPS = {
    "Controller Service [Controller Server] ControllerGetCapabilities [It] should return appropriate capabilities":
        "[FAILED] Unknown capability: GET_SNAPSHOT",
}
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_SUMMARY = re.compile(r"(\d+) Passed \| (\d+) Failed \| (\d+) Pending \| (\d+) Skipped")


@dataclass(frozen=True)
class SanityRun:
    output: str
    returncode: int

    @property
    def ran(self) -> int:
        found = re.search(r"Ran (\d+) of (\d+) Specs", self.output)
        return int(found.group(1)) if found else 0

    @property
    def counts(self) -> tuple[int, int, int, int]:
        """(passed, failed, pending, skipped)"""
        found = _SUMMARY.search(self.output)
        return tuple(int(n) for n in found.groups()) if found else (0, 0, 0, 0)  # type: ignore[return-value]

    @property
    def summary(self) -> str:
        lines = [line for line in self.output.splitlines() if "Ran " in line or "Passed |" in line]
        return " ".join(line.strip() for line in lines)

    @property
    def failures(self) -> list[str]:
        return sorted({line.strip() for line in self.output.splitlines() if line.strip().startswith("[FAIL]")})

    @property
    def real_failures(self) -> list[str]:
        """Failed specs, less the suite's own gaps (SUITE_GAPS) when they failed for exactly their known reason."""
        unknown = re.findall(r"\[FAILED\] Unknown capability: (\S+)", self.output)
        return [
            f for f in self.failures
            if not (
                f.removeprefix("[FAIL] ") in SUITE_GAPS
                and SUITE_GAPS[f.removeprefix("[FAIL] ")] in self.output
                and set(unknown) == {"GET_SNAPSHOT"}
            )
        ]

    @property
    def unexpected_skips(self) -> list[str]:
        """Skip reasons other than a capability csilvm does not advertise."""
        reasons = re.findall(r"^\s+\[SKIPPED\] (?!in \[|\[\d)(.+)$", self.output, re.MULTILINE)
        return sorted({r.strip() for r in reasons if not r.strip().startswith(NOT_ADVERTISED)})


def run(
    socket: Path,
    work: Path,
    access_type: str,
    *,
    volume_size: int,
    expand_size: int,
    mutable_parameters: dict[str, str],
    timeout: float,
) -> SanityRun:
    work.mkdir(parents=True, exist_ok=True)
    mutable = work / "mutable-parameters.yaml"
    mutable.write_text("".join(f"{k}: {v}\n" for k, v in mutable_parameters.items()))
    argv = [
        str(BINARY), "--ginkgo.v", "--ginkgo.no-color",
        "--csi.endpoint", str(socket),
        "--csi.mountdir", str(work / "mount"),
        "--csi.stagingdir", str(work / "staging"),
        "--csi.testvolumeaccesstype", access_type,
        "--csi.testvolumesize", str(volume_size),
        "--csi.testvolumeexpandsize", str(expand_size),
        "--csi.testvolumemutableparameters", str(mutable),
    ]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    return SanityRun(_ANSI.sub("", result.stdout + result.stderr), result.returncode)


def check(result: SanityRun) -> None:
    """Fail with the failing specs' names unless every spec that ran passed and only unadvertised ones skipped."""
    passed, failed, _, _ = result.counts
    tail = "\n".join(result.output.splitlines()[-60:])
    assert result.ran > 0 and passed > 0, f"csi-sanity ran no spec:\n{tail}"
    tolerated = len(result.failures) - len(result.real_failures)
    assert failed == tolerated and not result.real_failures and (result.returncode == 0 or tolerated), (
        f"csi-sanity: {result.summary}\n" + "\n".join(result.failures) + f"\n{tail}"
    )
    assert not result.unexpected_skips, f"specs skipped for another reason than an unadvertised capability: {result.unexpected_skips}"
    print(f"csi-sanity: {result.summary}")
