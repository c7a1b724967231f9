"""The docs cannot rot: generated pages match the code, every command shown is real, the site builds strictly."""

import importlib.util
import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parent.parent
MKDOCS = Path(sys.executable).with_name("mkdocs")


def _script(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, REPO / "scripts" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def commands() -> ModuleType:
    return _script("check_docs_commands")


def _build(config: Path, site: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}  # Material's notice about its successor, on every build
    return subprocess.run(
        [str(MKDOCS), "build", "--strict", "--config-file", str(config), "--site-dir", str(site)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )


def _copy_of_the_site(tmp_path: Path) -> Path:
    """mkdocs.yml and docs/ in a temporary folder: the place to break things."""
    shutil.copy(REPO / "mkdocs.yml", tmp_path / "mkdocs.yml")
    shutil.copytree(REPO / "docs", tmp_path / "docs")
    return tmp_path / "mkdocs.yml"


def test_generated_reference_pages_are_what_the_code_renders() -> None:
    renderer = _script("render_config_docs")
    assert renderer.stale() == [], "stale generated pages: run .venv/bin/python scripts/render_config_docs.py"
    # byte for byte, and they hold what they are generated from
    config_page = (REPO / "docs" / "CONFIG.md").read_text()
    assert config_page == renderer.config_page()
    assert "`CONFIG.TRAIN.BATCH_SIZE`" in config_page
    roles_page = (REPO / "docs" / "reference" / "roles.md").read_text()
    assert roles_page == renderer.roles_page()
    for role in sorted(path.name for path in (REPO / "roles").iterdir() if (path / "meta").is_dir()):
        assert f"## Role `{role}`" in roles_page


def test_every_command_in_the_readme_and_the_docs_is_real(commands: ModuleType) -> None:
    count, problems = commands.check_pages(commands.default_pages())
    assert problems == []
    # the README's quick starts and the guides' commands are all found (a broken extractor finds none)
    assert count > 100
    readme = [command.words for command in commands.commands_in(REPO / "README.md")]
    assert ["bash", "scripts/test.sh"] in readme
    assert ["ansible-playbook", "-i", "inventory/myslurm", "setup-cluster.yml"] in readme


def test_every_repository_path_the_docs_name_exists(commands: ModuleType, tmp_path: Path) -> None:
    assert commands.missing_paths(commands.default_pages()) == []
    page = tmp_path / "page.md"
    page.write_text("The schema: `trainer/config/`, `trainer/configuration.py`; the demo's `inventory/hosts.yml`.\n")
    assert [problem.split(": ", 1)[1] for problem in commands.missing_paths([page])] == [
        "no trainer/configuration.py in the repository"
    ]


def test_the_command_check_finds_a_made_up_option_and_a_renamed_playbook(commands: ModuleType, tmp_path: Path) -> None:
    page = tmp_path / "data.md"
    text = (REPO / "docs" / "data.md").read_text()
    line = "ansible-playbook playbooks/check-data.yml -e dest=/scratch/kinetics400"
    assert line in text
    planted = text.replace(line, line.replace("check-data.yml", "verify-data.yml"), 1)
    planted = planted.replace("-e src=/data/k400 -e dest=/scratch/kinetics400", "-e src=/data/k400 -e dest_dir=/x", 1)
    planted = planted.replace("-e delete=true", "-e delete=true --tag data", 1)
    page.write_text(planted)
    assert commands.check_pages([REPO / "docs" / "data.md"])[1] == []
    problems = commands.check_pages([page])[1]
    assert len(problems) == 3, problems
    assert [problem.split(": ", 1)[1] for problem in problems] == [
        "-e dest_dir: no role or playbook of playbooks/stage-data.yml knows this variable",
        "no playbook playbooks/verify-data.yml (in .)",
        "ansible-playbook has no option --tag",
    ]


def test_the_command_check_finds_a_made_up_python_option(commands: ModuleType, tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "```bash\npython -m trainer.train --config-file configs/slowfast.yaml --epochs 3\n"
        "python -m trainer.nowhere\nbash scripts/test.sh --fast\n```\n"
        "Also `python -m trainer predict V.mp4 --checkpoint best.pth` (real) and `python -m bench --only-one x`.\n"
    )
    problems = commands.check_pages([page])[1]
    assert [problem.split(": ", 1)[1] for problem in problems] == [
        "python -m trainer.train has no option --epochs",
        "no module trainer.nowhere (python -m trainer.nowhere)",
        "scripts/test.sh has no option --fast",
        "python -m bench has no option --only-one",
    ]


def test_the_site_builds_strictly(tmp_path: Path) -> None:
    proc = _build(REPO / "mkdocs.yml", tmp_path / "site")
    assert proc.returncode == 0, proc.stderr[-2000:]
    for page in ("index.html", "healing/index.html", "CONFIG/index.html", "reference/roles/index.html"):
        assert (tmp_path / "site" / page).is_file(), page
    assert "Restart in place" in (tmp_path / "site" / "healing" / "index.html").read_text()


def test_a_broken_link_or_anchor_fails_the_build(tmp_path: Path) -> None:
    config = _copy_of_the_site(tmp_path)
    page = tmp_path / "docs" / "training.md"
    page.write_text(page.read_text() + "\nSee [the setup](setup-guide.md).\n")
    proc = _build(config, tmp_path / "site")
    assert proc.returncode != 0
    assert "setup-guide.md" in proc.stderr

    page.write_text(page.read_text().replace("[the setup](setup-guide.md)", "[the setup](cluster.md#no-such-part)"))
    proc = _build(config, tmp_path / "site")
    assert proc.returncode != 0
    assert "no-such-part" in proc.stderr


def _png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    width, height = struct.unpack(">II", data[16:24])
    return width, height


def test_the_screenshot_script_photographs_the_site(tmp_path: Path) -> None:
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    proc = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "screenshot_docs.py"), "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=180,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    for name in ("home.png", "guide.png"):
        assert _png_size(tmp_path / name) == (1280, 900)
        assert (tmp_path / name).stat().st_size > 20_000  # a blank page compresses to a few kB
    # the committed pictures are the script's, at its size
    assert _png_size(REPO / "docs" / "img" / "home.png") == (1280, 900)
