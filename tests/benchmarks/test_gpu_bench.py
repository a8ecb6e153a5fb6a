"""gpu_bench's grammar host (the engine's matchers and batched pass at a 128K vocabulary) on the CPU:
its script drafts are all allowed and committed, and each row allows the script's next token."""
from __future__ import annotations


from interlock.benchmarks.gpu_bench import K, VOCAB, GrammarHost
from interlock.grammars.bitmask import allocate_bitmask


def test_the_grammar_host_follows_its_documents() -> None:
    host = GrammarHost(batch=3, threads=1)
    bitmask = allocate_bitmask(3 * (K + 1), VOCAB)
    for _ in range(40):                                  # past a document's end: it starts over
        at = list(host.pointers)
        host.step(bitmask)
        for b, p in enumerate(at):
            if host.pointers[b] != p + K + 1:
                p = host.pointers[b] - (K + 1)          # it started the document over this step
            for j in range(K + 1):
                token = host.scripts[b][p + 1 + j]
                word = int(bitmask[b * (K + 1) + j, token // 32])
                assert (word >> (token % 32)) & 1, (b, j)
    assert host.refused == 0 and len(host.fill_seconds) == 40
