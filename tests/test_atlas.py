"""Appendix A2's atlas: the record reads, every family gets a row, and
what the last column says agrees with attention_from_hf."""

import json
from pathlib import Path

import numpy as np
import pytest

from attn_np.hf.families import NAMES
from attn_np.instruments import atlas

FIXTURES = Path(__file__).parent / "fixtures"


def test_every_recorded_family_has_one_row_of_a_known_kind():
    data = atlas.load()
    rows = atlas.table_rows(data)
    assert [r["family"] for r in rows] == [
        f["model_type"] for f in data["families"]
    ]
    assert len(rows) > 100  # every causal-LM class of a transformers 5
    assert {r["kind"] for r in rows} <= set(atlas.KINDS)
    assert all(r["status"] in ("built", "refused") for r in rows)


def test_built_rows_are_families_attention_from_hf_names():
    rows = atlas.table_rows(atlas.load())
    aliases = {"gemma3": "gemma3_text", "llama4": "llama4_text"}
    for r in rows:
        if r["status"] == "built":
            assert aliases.get(r["text"], r["text"]) in NAMES, r["family"]
        else:
            assert r["detail"], r["family"]  # a refusal says why


def test_a_family_with_a_fixture_is_built_from_its_default_config():
    rows = {r["text"]: r for r in atlas.table_rows(atlas.load())}
    for path in sorted(FIXTURES.glob("*.npz")):
        f = np.load(path)
        if "config" not in f.files:  # chapter 14's and 16's own records
            continue
        model_type = json.loads(str(f["config"])).get("model_type")
        if model_type in rows:
            assert rows[model_type]["status"] == "built", path.name


def test_the_table_escapes_what_it_shows_and_carries_its_filter():
    row = dict.fromkeys(atlas.COLUMNS, "<b>")
    row.update(family="x<y", text="x<y", status="refused", detail="a & b")
    page = atlas.html_table([row], {})
    assert "x&lt;y" in page and "a &amp; b" in page and "<b>" not in page
    assert "atlas-find" in page and "addEventListener" in page


def test_a_refused_family_names_the_part_it_needs():
    """A family examined and refused shows the part its attention needs,
    never only that it is refused."""
    rows = {r["family"]: r for r in atlas.table_rows(atlas.load())}
    doge = rows.get("doge")
    if doge is None or doge["status"] == "built":
        pytest.skip("doge is not a refused row of this record")
    assert doge["detail"].startswith("needs a dynamic mask")
    details = {
        r["detail"] for r in rows.values() if r["status"] == "refused"
    }
    assert "family not admitted" not in details


def test_a_hybrid_is_built_by_its_attention_layers():
    """Jamba's layer 0 is a Mamba layer; its attention layers are built,
    and the row says which is the first."""
    rows = {r["family"]: r for r in atlas.table_rows(atlas.load())}
    jamba = rows.get("jamba")
    if jamba is None:
        pytest.skip("no jamba row in this record")
    assert jamba["status"] == "built"
    assert jamba["detail"].startswith("its attention layers (the first: ")
