"""The peers benchmark's own parts: the repeated-schema workload and the HF grammar processor that
rolls back (the part that makes HF + xgrammar + prompt lookup possible at all)."""
from __future__ import annotations

import json
import random

import jsonschema
import pytest
import torch
from bench_data import JSONSCHEMABENCH as DATASETS

from interlock.benchmarks.prompts import build_messages
from interlock.benchmarks.workloads import REPEATED_ROW, extraction, repeated_schema, row_by_id


def test_repeated_schema_makes_distinct_valid_documents_deterministically():
    row = row_by_id(DATASETS / "JME.jsonl", REPEATED_ROW)
    rows = repeated_schema(row, 50)
    docs = [r.tests[0].data for r in rows]
    assert len({repr(d) for d in docs}) == 50
    assert docs[0] == row.valid_instances[0].data
    for r in rows:
        assert r.schema == row.schema
        jsonschema.validate(r.tests[0].data, r.schema)
    assert [r.tests[0].data for r in repeated_schema(row, 50)] == docs
    assert [r.tests[0].data for r in repeated_schema(row, 50, seed=1)] != docs
    assert build_messages(rows[1])[1]["content"] != build_messages(rows[2])[1]["content"]


def test_extraction_documents_hold_their_record_and_grow_from_500_to_2000_tokens():
    from interlock.benchmarks.prompts import describe
    from interlock.models.loader import load_tokenizer

    tok = load_tokenizer("smollm2-135m-instruct")
    row = row_by_id(DATASETS / "JME.jsonl", REPEATED_ROW)
    rows = extraction(row, 4)
    assert [r.tests for r in rows] == [r.tests for r in repeated_schema(row, 4)]      # the same records
    lengths = [len(tok.encode(build_messages(r)[1]["content"])) for r in rows]
    assert lengths == sorted(lengths) and 400 <= lengths[0] <= 650 and 1700 <= lengths[-1] <= 2300, lengths
    for r in rows:
        system, user = build_messages(r)
        assert system == build_messages(row)[0]                   # the shared head: the schema
        assert all(fact in user["content"] for fact in describe(r.valid_instances[0].data).splitlines())
    assert [r.document for r in extraction(row, 4)] == [r.document for r in rows]
    with pytest.raises(ValueError):
        extraction(row, 2, tokens=(600, 500))


def test_extraction_with_a_shared_head_differs_only_in_its_last_paragraph():
    from interlock.benchmarks.prompts import describe
    from interlock.models.loader import load_tokenizer

    tok = load_tokenizer("smollm2-135m-instruct")
    row = row_by_id(DATASETS / "JME.jsonl", REPEATED_ROW)
    rows = extraction(row, 3, shared_head=True)
    assert [r.tests for r in rows] == [r.tests for r in repeated_schema(row, 3)]
    users = [build_messages(r)[1]["content"] for r in rows]
    heads = {u.rsplit("\n\n", 1)[0] for u in users}
    assert len(heads) == 1 and len({u.rsplit("\n\n", 1)[1] for u in users}) == 3    # one body, three tails
    assert 1700 <= len(tok.encode(heads.pop())) <= 2300
    for r, user in zip(rows, users, strict=True):
        assert all(fact in user.rsplit("\n\n", 1)[1] for fact in describe(r.valid_instances[0].data).splitlines())


def test_repeated_schema_refuses_what_it_cannot_make():
    row = row_by_id(DATASETS / "JME.jsonl", REPEATED_ROW)
    with pytest.raises(ValueError):
        repeated_schema(row.__class__(row.id, row.schema, ()), 3)


def test_exact_means_the_stated_record_value_for_value():
    from interlock.benchmarks.peers import is_exact

    row = repeated_schema(row_by_id(DATASETS / "JME.jsonl", REPEATED_ROW), 2)[1]
    record = row.valid_instances[0].data
    assert is_exact(json.dumps(record), row)
    assert is_exact(json.dumps(record, indent=2), row)            # layout does not matter, values do
    key = next(iter(record))
    changed = {**record, key: [record[key]]}
    assert not is_exact(json.dumps(changed), row)
    assert not is_exact(json.dumps(record)[:-1], row)             # cut off at max_tokens
    assert not is_exact(json.dumps(record), row.__class__(row.id, row.schema, ()))


def test_rollback_processor_masks_like_a_fresh_matcher_after_any_prefixes():
    xgr = pytest.importorskip("xgrammar")
    from interlock.benchmarks.peers import RollbackGrammarProcessor
    from interlock.models.loader import load_tokenizer

    tok = load_tokenizer("smollm2-135m-instruct")
    vocab = tok.vocab_size
    info = xgr.TokenizerInfo.from_huggingface(tok.hf, vocab_size=vocab, stop_token_ids=list(tok.eos_token_ids))
    compiled = xgr.GrammarCompiler(info).compile_json_schema(
        '{"type":"object","properties":{"a":{"type":"string"},"b":{"type":"integer"}},"required":["a","b"]}',
        any_whitespace=False, separators=(",", ":"))
    text = tok.encode('{"a":"xyz","b":12}')
    prompt = [1, 2, 3]
    proc = RollbackGrammarProcessor(compiled, len(prompt), vocab)
    rng = random.Random(0)
    for _ in range(30):                  # prefixes that grow, shrink and diverge, as assisted decoding's do
        n = rng.randint(0, len(text) - 1)
        prefix = text[:n]
        scores = proc(torch.tensor([prompt + prefix]), torch.zeros(1, vocab))
        fresh = xgr.GrammarMatcher(compiled)
        for t in prefix:
            assert fresh.accept_token(t)
        mask = xgr.allocate_token_bitmask(1, vocab)
        fresh.fill_next_token_bitmask(mask)
        expected = torch.zeros(1, vocab)
        xgr.apply_token_bitmask_inplace(expected, mask)
        assert torch.equal(scores, expected)
    refused = tok.encode("]")[0]         # a rejected candidate: its row is left alone
    scores = proc(torch.tensor([prompt + [refused]]), torch.zeros(1, vocab))
    assert torch.equal(scores, torch.zeros(1, vocab))
