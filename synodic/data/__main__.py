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
        except ValueError as e:
            raise ConfigError([f"data={kv['data']!r}: not JSON ({e}); expected a JSON list, data='[\"dir\"]'"]) \
                from None
        try:
            vocab = int(kv.get("vocab_size", 4096))
        except ValueError:
            raise ConfigError([f"vocab_size={kv['vocab_size']!r}: expected an integer"]) from None
        if not isinstance(data, list):
            raise ConfigError([f"data={data!r}: expected a JSON list of files or folders"])
        bad = [f"data[{i}]={d!r}: expected a file or folder path (a string)" for i, d in enumerate(data)
               if not isinstance(d, str)]
        if bad:
            raise ConfigError(bad)
        # the checks pipeline=train makes of the same three keys (paths, tokenizer file, vocabulary bound)
        from synodic.train.config import TrainPipeline
        s = TrainPipeline.model_validate({"data": data, "tokenizer": kv.get("tokenizer", "shipped"),
                                          "vocab_size": vocab})
        p = prepare(s.data, s.tokenizer, s.vocab_size)
    print(json.dumps({"folder": str(p.tokenizer_path.parent), **p.info}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
