import json
import sys

from interlock.benchmarks import detok_cost
from interlock.models.loader import EMBEDDED, load_tokenizer


def test_json_ids_are_jme_instances_cut_to_length() -> None:
    tok = load_tokenizer(EMBEDDED)
    ids = detok_cost.json_ids(tok, 300)
    assert len(ids) == 300 and tok.decode(ids).lstrip().startswith(("{", "["))


def test_saves_both_ways_side_by_side(tmp_path, monkeypatch, capsys) -> None:
    out = tmp_path / "detok.json"
    monkeypatch.setattr(sys, "argv", ["detok_cost", "--lengths", "40,90", "--repeats", "1", "--out", str(out)])
    detok_cost.main()
    saved = json.loads(out.read_text())
    assert [r["output_tokens"] for r in saved["rows"]] == [40, 90]
    assert all(r["streamed_us_per_push"] > 0 and r["whole_decode_us_per_push"] > 0 for r in saved["rows"])
    assert [len(r["token_ids"]) for r in saved["ids"]] == [40, 90]
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["saved"] == str(out)
