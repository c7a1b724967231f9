"""Documentation generated from code stays in step with it."""

from pathlib import Path

from trainer.config import describe_schema

REPO = Path(__file__).resolve().parents[2]


def test_config_reference_matches_the_schema() -> None:
    text = (REPO / "docs" / "CONFIG.md").read_text()
    assert describe_schema() in text, "regenerate: .venv/bin/python scripts/render_config_docs.py"
    assert "`DDP_CONFIG.WOLRD_URLS`" in text and "`CONFIG.TRAIN.ACCUM_STEPS`" in text
