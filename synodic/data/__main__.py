"""Prepare (and cache) a corpus without training, e.g. to carry it to another machine:

    SYNODIC_CACHE=outputs/cache python -m synodic.data [tokenizer=shipped|train|PATH] [vocab_size=4096] \
        [data='["my/texts"]']

Prints the prepared folder; pass it as `data=['<folder>']` (or pipeline.data) to train on exactly it.
"""
import json
import sys


def main(argv: list[str]) -> int:
    from synodic.config.argv import one_line_errors, parse_kv
    from synodic.config.errors import ConfigError
    from synodic.data.prepare import prepare
    with one_line_errors():
        kv = parse_kv(argv, __doc__)
        unknown = sorted(set(kv) - {"data", "tokenizer", "vocab_size"})
        if unknown:
            raise ConfigError([f"{k}={kv[k]!r}: unknown key; expected one of data, tokenizer, vocab_size"
                               for k in unknown])
        try:
            data = json.loads(kv.get("data", "[]"))
            vocab = int(kv.get("vocab_size", 4096))
        except ValueError as e:
            raise ConfigError([f"data / vocab_size: {e}; expected data='[\"dir\"]' and an integer"]) from None
        if not isinstance(data, list):
            raise ConfigError([f"data={data!r}: expected a JSON list of files or folders"])
        p = prepare(data, kv.get("tokenizer", "shipped"), vocab)
    print(json.dumps({"folder": str(p.tokenizer_path.parent), **p.info}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
