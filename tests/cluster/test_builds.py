"""torch 2.14's builds as their one table has them (python_env_torch_builds in roles/python_env/defaults/main.yml, what
setup installs from): every build's torch, torchvision and torchcodec pins resolve, and a CPU node's decoders load
without CUDA.

Two sources, and which one checks what:
- live, against PyPI (its simple JSON index; the wheels' own files read with HTTP range requests, a few MB, torch never
  downloaded): every pin without a local version (+build) has a cp311 manylinux x86_64 wheel there, and that wheel
  says it is the build's: torch's version.py (and its CUDA dependency), torchvision's and torchcodec's version.py.
  torchcodec's metadata declares no torch dependency at all, so its version.py's build tag is what is compared.
- recorded, for PyTorch's own index (download.pytorch.org, out of reach from here): every pin with a local version
  names a file of INDEX, a listing of that index's cp311 x86_64 wheels for torch 2.14.1 written down from PyTorch's
  release matrix for 2.14 (RELEASE.md; RFC pytorch/pytorch#190355 and PR #194367: CUDA 12.6, 13.0 and 13.2, no 12.8)
  and the index's file naming. It was not fetched from the index: it pins the table's shape, not the index's truth.
"""

from __future__ import annotations

import io
import json
import re
import subprocess
import sys
import urllib.request
import zipfile
from functools import cache
from pathlib import Path

import pytest
import yaml

from tests.cluster.conftest import REPO, load_file

ROLE = REPO / "roles" / "python_env"
BUILDS = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())["python_env_torch_builds"]
filters = load_file(ROLE / "filter_plugins" / "python_env.py")
PINNED = ("torch", "torchvision", "torchcodec")
PYPI = "https://pypi.org/simple"
WHEEL = re.compile(r"-cp311-cp311-(manylinux[\w.]*_x86_64)\.whl$")
# What the CUDA libraries of a wheel's shared objects are called (a CPU build needs none of them).
CUDA_LIBRARY = re.compile(r"lib(cudart|cuda|nvrtc|torch_cuda|c10_cuda)\b")

# PyTorch's index for torch 2.14.1, the cp311 x86_64 wheels of the three packages (recorded: see the docstring).
INDEX = {
    build: [f"torch-2.14.1+{build}-cp311-cp311-manylinux_2_28_x86_64.whl",
            f"torchvision-0.29.1+{build}-cp311-cp311-manylinux_2_28_x86_64.whl",
            f"torchcodec-0.17.0+{build}-cp311-cp311-manylinux_2_27_x86_64.manylinux_2_28_x86_64.whl"]
    for build in ("cu126", "cu130", "cu132", "cpu")
}


def pins(build: str) -> dict[str, str]:
    """The torch, torchvision and torchcodec versions a node of ``build`` installs (the role's own filter applied to
    requirements-node.txt, as setup does)."""
    made = filters.torch_requirements((REPO / "requirements-node.txt").read_text(), build, BUILDS)
    assert made["ok"], made["message"]
    found = dict(re.findall(r"^(torch|torchvision|torchcodec)==(\S+)$", made["text"], re.M))
    assert sorted(found) == sorted(PINNED), made["text"]
    return found


@cache
def pypi_wheels(name: str) -> dict[str, str]:
    """PyPI's cp311 manylinux x86_64 wheels of ``name``: file name -> URL."""
    request = urllib.request.Request(f"{PYPI}/{name}/", headers={"Accept": "application/vnd.pypi.simple.v1+json"})
    with urllib.request.urlopen(request, timeout=60) as answer:
        files = json.load(answer)["files"]
    return {f["filename"]: f["url"] for f in files if WHEEL.search(f["filename"])}


class _RemoteFile(io.RawIOBase):
    """A file on an HTTP server read with Range requests: zipfile reads a wheel's directory and one member."""

    def __init__(self, url: str) -> None:
        self.url, self.pos = url, 0
        with urllib.request.urlopen(urllib.request.Request(url, method="HEAD"), timeout=60) as answer:
            self.size = int(answer.headers["Content-Length"])

    def seekable(self) -> bool:
        return True

    def readable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.pos

    def seek(self, offset: int, whence: int = 0) -> int:
        self.pos = (0, self.pos, self.size)[whence] + offset
        return self.pos

    def readinto(self, buffer: bytearray) -> int:  # type: ignore[override]
        size = min(len(buffer), self.size - self.pos)
        if size <= 0:
            return 0
        ranged = urllib.request.Request(self.url, headers={"Range": f"bytes={self.pos}-{self.pos + size - 1}"})
        with urllib.request.urlopen(ranged, timeout=60) as answer:
            data = answer.read()
        buffer[:len(data)] = data
        self.pos += len(data)
        return len(data)


def wheel_text(url: str, member: str) -> str:
    with zipfile.ZipFile(io.BufferedReader(_RemoteFile(url), buffer_size=1 << 20)) as wheel:
        return wheel.read(member).decode()


def pypi_wheel(name: str, version: str) -> str:
    """The URL of PyPI's cp311 manylinux x86_64 wheel of ``name`` ``version``; fails naming what is missing."""
    found = [url for file, url in pypi_wheels(name).items() if file.startswith(f"{name}-{version}-")]
    assert len(found) == 1, f"PyPI has {len(found)} cp311 manylinux x86_64 wheels of {name} {version}"
    return found[0]


def built_for(version_py: str) -> str:
    """The build in a version.py's __version__ ('2.14.1+cu130' -> 'cu130'; '' for none)."""
    found = re.search(r"__version__ = '[^'+]+\+?([^']*)'", version_py)
    assert found is not None, version_py
    return found[1]


def test_torch_2_14s_builds_are_the_table_and_no_other_build_is_named_anywhere() -> None:
    assert {build: spec["cuda"] for build, spec in BUILDS.items()} == {
        "cu126": "12.6", "cu130": "13.0", "cu132": "13.2", "cpu": ""}
    assert all(spec["index"] in ("", f"https://download.pytorch.org/whl/{build}") for build, spec in BUILDS.items())
    dropped = "cu1" + "28"  # torch 2.12 dropped its CUDA 12.8 build: no advice, default or doc may name it
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                            capture_output=True, check=True).stdout.decode().split("\0")
    naming = [name for name in listed if name and (REPO / name).is_file()
              and dropped.encode() in (REPO / name).read_bytes()]
    assert naming == []


def test_every_pin_is_a_wheel_of_its_build_on_pypi_or_in_pytorchs_index() -> None:
    """Live against PyPI for the pins without a local version; the recorded INDEX for the others."""
    checked_live = []
    for build, spec in BUILDS.items():
        for name, version in pins(build).items():
            if "+" in version:  # only PyTorch's index has local versions (PyPI refuses them)
                assert spec["index"], f"{build}: {name}=={version} has a local version but the build has no index"
                assert version.endswith(f"+{build}"), f"{build}: {name}=={version} is another build's"
                assert any(file.startswith(f"{name}-{version}-") for file in INDEX[build]), (build, name, version)
                continue
            url = pypi_wheel(name, version)
            assert built_for(wheel_text(url, f"{name}/version.py")) == build, f"PyPI's {name} {version}"
            checked_live.append(f"{build}:{name}")
    # PyPI serves the whole cu130 build, and the cpu build's torchcodec.
    assert {"cu130:torch", "cu130:torchvision", "cu130:torchcodec", "cpu:torchcodec"} <= set(checked_live)


def test_pypis_torch_is_the_cuda_13_0_build_and_depends_on_that_toolkit() -> None:
    """What a fresh `pip install torch==2.14.1` from PyPI gets (cu130), from the wheel's own metadata: the RFC for
    2.14 proposed 13.2 for PyPI; the published wheel is 13.0."""
    version = pins("cu130")["torch"]
    url = pypi_wheel("torch", version)
    assert "cuda = '13.0'" in wheel_text(url, "torch/version.py").replace(": Optional[str]", "")
    metadata = wheel_text(url, f"torch-{version}.dist-info/METADATA")
    toolkit = re.search(r"^Requires-Dist: cuda-toolkit\[[^]]*\]==(\S+);", metadata, re.M)
    assert toolkit is not None and toolkit[1].startswith(BUILDS["cu130"]["cuda"] + "."), metadata[:3000]


def needed_libraries(library: Path) -> list[str]:
    """The shared libraries an ELF file needs (its DT_NEEDED entries, as readelf prints them)."""
    shown = subprocess.run(["readelf", "-d", str(library)], capture_output=True, text=True, check=True).stdout
    return re.findall(r"\(NEEDED\)\s+Shared library: \[([^]]+)\]", shown)


def test_pypis_torchcodec_needs_the_cuda_13_runtime() -> None:
    """Why every build but cu130 pins a torchcodec of its own: the installed PyPI wheel loads libcudart.so.13."""
    import torchcodec

    libraries = sorted(Path(torchcodec.__file__).parent.glob("libtorchcodec_core*.so"))
    assert libraries and all("libcudart.so.13" in needed_libraries(lib) for lib in libraries)


@pytest.fixture(scope="module")
def cpu_torchcodec(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The cpu build's torchcodec pin, installed from PyPI (no dependencies) into a folder of its own."""
    target = tmp_path_factory.mktemp("cpu-torchcodec")
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(target),
                    f"torchcodec=={pins('cpu')['torchcodec']}"], check=True, capture_output=True, timeout=300)
    return target


def test_a_cpu_nodes_decoders_load_without_cuda_and_decode(cpu_torchcodec: Path, tmp_path: Path) -> None:
    """The cpu build's torchcodec needs no CUDA library, and with this torch 2.14.1 it and decord decode a video."""
    libraries = sorted((cpu_torchcodec / "torchcodec").glob("libtorchcodec_*.so"))
    assert libraries
    for library in libraries:
        assert not [name for name in needed_libraries(library) if CUDA_LIBRARY.match(name)], library
    video = tmp_path / "clip.mp4"
    subprocess.run(["ffmpeg", "-loglevel", "error", "-f", "lavfi", "-i", "testsrc=size=64x48:rate=10", "-t", "1",
                    "-pix_fmt", "yuv420p", str(video)], check=True, timeout=60)
    probe = ("import sys, decord, torchcodec; from torchcodec.decoders import VideoDecoder; "
             "d = VideoDecoder(sys.argv[1]); r = decord.VideoReader(sys.argv[1]); "
             "print(torchcodec.__version__, tuple(d[0].shape), len(d), len(r), r[0].shape)")
    proc = subprocess.run([sys.executable, "-c", probe, str(video)], env={"PYTHONPATH": str(cpu_torchcodec),
                          "PATH": "/usr/bin:/bin", "CUDA_VISIBLE_DEVICES": ""}, capture_output=True, text=True,
                          timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == [f"{pins('cpu')['torchcodec']}+cpu", "(3,", "48,", "64)", "10", "10", "(48,",
                                   "64,", "3)"]
