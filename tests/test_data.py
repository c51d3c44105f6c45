"""Corpus split and packing, tokenizer round trip, shipped assets within their limits."""
import torch

from synodic.data.corpus import (
    EOT,
    HELDOUT_MAX_BYTES,
    HELDOUT_PATH,
    PackedSampler,
    build_corpus,
    heldout_shard,
    is_heldout,
    load_heldout,
    pack,
    windows,
)
from synodic.data.tokenizer import SHIPPED_TOKENIZER, load_tokenizer, train_tokenizer

SAMPLES = ["def f(x):\n    return x ** 2  # square\n", "\t\tmixed   whitespace\r\n\n\n",
           "unicode: héllo wörld — ∑ 𝔘𝔫𝔦 🐍 日本語", "", " leading space", "a" * 1000, EOT + "x" + EOT]


def test_shipped_tokenizer_round_trips():
    tok = load_tokenizer()
    assert tok.vocab_size == 4096 and tok.eot_id == 0
    for s in SAMPLES:
        assert tok.decode(tok.encode(s)) == s
    text = load_heldout()[:50_000]
    ids = tok.encode(text)
    assert tok.decode(ids) == text
    assert len(text.encode()) / len(ids) > 3.0          # BPE compresses code ~3.3 bytes/token
    tb = tok.token_bytes()                              # exact bytes per id, even mid-character
    assert sum(tb[i] for i in ids) == len(text.encode())
    assert sum(tb[i] for i in tok.encode(SAMPLES[2])) == len(SAMPLES[2].encode())


def test_trained_tokenizer_deterministic_and_round_trips(tmp_path):
    texts = [load_heldout()[i * 3000:(i + 1) * 3000] for i in range(8)]
    a, b = train_tokenizer(texts, 400), train_tokenizer(texts, 400)
    assert a.raw.to_str() == b.raw.to_str() and a.vocab_size == 400
    for s in SAMPLES + texts[:2]:
        assert a.decode(a.encode(s)) == s
    a.save(tmp_path / "tokenizer.json")
    assert load_tokenizer(tmp_path).encode(texts[0]) == a.encode(texts[0])


def test_split_by_document_is_deterministic(tmp_path):
    for i in range(40):
        (tmp_path / f"m{i:02d}.py").write_text(f"# module {i}\nx = {i}\n")
    (tmp_path / "bin.dat").write_bytes(b"\0\1")  # not text: skipped
    c = build_corpus([tmp_path], fraction=0.2)
    names = [d.name for d in c.train + c.heldout]
    assert sorted(names) == [f"m{i:02d}.py" for i in range(40)]
    assert [d.name for d in c.train] == sorted(d.name for d in c.train)
    assert all(is_heldout(d.name, 0.2) for d in c.heldout) and 0 < len(c.heldout) < 20
    assert build_corpus([tmp_path], fraction=0.2).fingerprint() == c.fingerprint()
    shard = heldout_shard(c.heldout)
    assert shard.count(EOT) == len(c.heldout) and shard.endswith(EOT)


def test_shipped_shard_and_hash_split():
    text = load_heldout()
    assert len(text.encode()) <= HELDOUT_MAX_BYTES and HELDOUT_PATH.stat().st_size <= 2 * 2 ** 20
    assert text.count(EOT) == 93 and text.startswith('"""Shared AIX support functions.')
    # the same modules are held out on every machine: the split hashes the relative path only
    assert is_heldout("json/decoder.py") is False and is_heldout("difflib.py") is True
    assert SHIPPED_TOKENIZER.is_file()


def test_packing_and_sampler_resume():
    stream = pack([[5, 6, 7], [8, 9]], eot_id=0)
    assert stream.tolist() == [5, 6, 7, 0, 8, 9, 0]
    s = torch.arange(1000, dtype=torch.int32)
    w = windows(s, 10, torch.tensor([0, 3]))
    assert w.shape == (2, 11) and w[1, 0] == 30 and w[1, -1] == 40   # targets overlap the next window
    a = PackedSampler(s, 10, 8, seed=1)
    assert a.n == 99                                                  # (1000 - 1) // 10 windows
    seen = torch.cat([a.next()[:, 0] for _ in range(12)]).tolist()    # one epoch: 12 batches of 8
    assert len(set(seen)) == 96 and set(seen) <= set(range(0, 990, 10))
    b = PackedSampler(s, 10, 8, seed=1)
    for _ in range(5):
        b.next()
    c = PackedSampler(s, 10, 8, seed=1)
    c.load_state_dict(b.state_dict())
    for _ in range(20):                                               # across the epoch boundary
        assert torch.equal(b.next(), c.next())
