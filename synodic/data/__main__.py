"""Prepare (and cache) a corpus without training, e.g. to carry it to another machine:

    SYNODIC_CACHE=outputs/cache python -m synodic.data [tokenizer=shipped|train|PATH] [vocab_size=4096] \
        [data='["my/texts"]']

Prints the prepared folder; pass it as `data=['<folder>']` (or pipeline.data) to train on exactly it.
"""
import json
import sys


def main(argv: list[str]) -> int:
    from synodic.data.prepare import prepare
    kv = dict(a.split("=", 1) for a in argv)
    data = json.loads(kv.get("data", "[]"))
    p = prepare(data, kv.get("tokenizer", "shipped"), int(kv.get("vocab_size", 4096)))
    print(json.dumps({"folder": str(p.tokenizer_path.parent), **p.info}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
