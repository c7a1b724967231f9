#!/usr/bin/env python3
"""Build the docs site and photograph it in headless Chromium, as a reader's browser shows it.

    .venv/bin/python scripts/screenshot_docs.py              # docs/img/home.png and docs/img/guide.png
    .venv/bin/python scripts/screenshot_docs.py --out DIR    # the pictures into DIR instead

The pictures are the README's; a change that breaks the site's rendering shows in them. Needs Debian's chromium
(`scripts/bootstrap.sh --dev`). The site is built with `mkdocs build --strict` into a temporary folder and opened as
files, so nothing listens on a port.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# page of the built site -> picture: the home page and one guide
SHOTS = {"index.html": "home.png", "healing/index.html": "guide.png"}
WINDOW = "1280,900"
TIMEOUT_S = 60


def build_site(site_dir: Path) -> None:
    mkdocs = Path(sys.executable).with_name("mkdocs")
    subprocess.run(
        [str(mkdocs), "build", "--strict", "--quiet", "--site-dir", str(site_dir)],
        cwd=REPO,
        check=True,
        timeout=TIMEOUT_S,
    )


def chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if path := shutil.which(name):
            return path
    raise SystemExit("error: chromium not found: install Debian's chromium (bash scripts/bootstrap.sh --dev)")


def screenshot(browser: str, page: Path, picture: Path, profile: Path) -> None:
    """One page at a fixed window size; the profile is a fresh folder so no user state changes the picture."""
    subprocess.run(
        [
            browser,
            "--headless",
            "--no-sandbox",  # root in a container has no user namespace for the sandbox; the pages are our own
            "--disable-gpu",
            "--hide-scrollbars",
            "--no-first-run",
            f"--user-data-dir={profile}",
            f"--window-size={WINDOW}",
            f"--screenshot={picture}",
            page.as_uri(),
        ],
        check=True,
        timeout=TIMEOUT_S,
        capture_output=True,
    )
    if not picture.is_file() or picture.stat().st_size == 0:
        raise SystemExit(f"error: chromium wrote no screenshot of {page.name} to {picture}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "img", help="folder for the pictures")
    args = parser.parse_args(argv)
    browser = chromium()
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="vidcluster-docs-") as tmp:
        site = Path(tmp) / "site"
        build_site(site)
        for page, name in SHOTS.items():
            screenshot(browser, site / page, args.out / name, Path(tmp) / "profile")
            print(f"wrote {args.out / name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
