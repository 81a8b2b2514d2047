"""xdna compiled for real: amdxdna.ko built by recipes/xdna.yaml (drivers/accel/CMakeLists.txt's steps) inside the
pinned root against Debian's linux-headers 7.2.13, from the pinned commit of the team mirror; the module checked
with the root's modinfo against what the source says (vermagic, the PCI ids of amdxdna_pci_drv.c), and the gate's
xrt-smi (Debian's libxrt-utils 2.25 in the root) run without an NPU."""
from __future__ import annotations

import re

import pytest
from strix_root import build_strix, strix_root

pytestmark = pytest.mark.e2e
KO = "libexec/onebit/xdna/lib/modules/amdxdna.ko"


@pytest.fixture(scope="module")
def xdna(tmp_path_factory, request):
    base = tmp_path_factory.mktemp("xdna")
    plan, layout = build_strix(base, {"xdna"}, request)
    staged = layout.staged_prefix("xdna")
    source = plan.step("build:xdna").data.source_dir
    return strix_root(), staged, source


def _modinfo(root, staged, field):
    proc, _ = root.run(["/usr/sbin/modinfo", "-F", field, str(staged / KO)], cwd=staged)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.splitlines()


def test_vermagic_names_the_pinned_headers(xdna):
    root, staged, _ = xdna
    (vermagic,) = _modinfo(root, staged, "vermagic")
    release = (root.path / "usr/src/linux-headers-7.2.13+deb14-amd64/include/config/kernel.release").read_text().strip()
    assert vermagic.split()[0] == release == "7.2.13+deb14-amd64", vermagic


def test_pci_aliases_are_the_sources_device_table(xdna):
    root, staged, source = xdna
    from pathlib import Path

    text = (Path(source) / "drivers/accel/amdxdna/amdxdna_pci_drv.c").read_text()
    ids = {m.upper() for m in re.findall(r"PCI_DEVICE\(PCI_VENDOR_ID_AMD, 0x([0-9a-fA-F]{4})\)", text)}
    assert ids, "no PCI_DEVICE entries in amdxdna_pci_drv.c"
    aliases = {re.fullmatch(r"pci:v00001022d0000([0-9A-F]{4})sv\*sd\*bc\*sc\*i\*", a).group(1)
               for a in _modinfo(root, staged, "alias")}
    assert aliases == ids, (aliases, ids)
    assert "17F0" in aliases  # Strix Halo's NPU


def test_license_and_description(xdna):
    root, staged, _ = xdna
    info = "\n".join(_modinfo(root, staged, "license") + _modinfo(root, staged, "description"))
    assert "GPL" in info and "amdxdna" in info, info


def test_xrt_smi_from_the_root_runs_without_an_npu(xdna, tmp_path):
    root, _, _ = xdna
    proc, _ = root.run(["xrt-smi", "examine"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert re.search(r"^\s*Version\s*:\s*2\.25\.", proc.stdout, re.MULTILINE), proc.stdout
    assert "0 devices found" in proc.stdout, proc.stdout
