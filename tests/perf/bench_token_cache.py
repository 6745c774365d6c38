"""Benchmark: tokenizing an agent's prompts turn after turn, whole vs through the prefix token cache
(``dyn.core.frontend.token_cache``). Not a test.

An agent's conversation grows by a user message and an assistant reply of ``--turn-words`` words
each turn, for ``--turns`` turns, rendered with dyn-tiny's chat template; each turn's prompt is
tokenized whole (``Tokenizer.encode``) and through the cache (``Tokenizer.encode_chat``, a fresh
tokenizer), ``--conversations`` conversations interleaved. Prints the median time per prompt of
each and the ratio, per prompt-length band.

    python tests/perf/bench_token_cache.py --turns 40 --turn-words 150 --conversations 8
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

from dyn.core.frontend.chat_template import ChatTemplate
from dyn.core.frontend.tokenizer import Tokenizer
from dyn.core.model.info import load_model_info


def prompts(turns: int, words: int, conversations: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    vocab = [f"w{i}" for i in range(5000)]
    tokenizer = Tokenizer.from_model(load_model_info(None, None))
    template = ChatTemplate(tokenizer.chat_template or "")
    histories = [
        [{"role": "system", "content": " ".join(rng.choices(vocab, k=300))}] for _ in range(conversations)
    ]
    out = []
    for _ in range(turns):
        for history in histories:
            history.append({"role": "user", "content": " ".join(rng.choices(vocab, k=words))})
            out.append(template.render(history, special_tokens=tokenizer.special_tokens_map))
            history.append({"role": "assistant", "content": " ".join(rng.choices(vocab, k=words))})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--turns", type=int, default=40)
    ap.add_argument("--turn-words", type=int, default=150)
    ap.add_argument("--conversations", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    texts = prompts(args.turns, args.turn_words, args.conversations, args.seed)
    whole_tok = Tokenizer.from_model(load_model_info(None, None))
    cached_tok = Tokenizer.from_model(load_model_info(None, None))
    rows: dict[str, tuple[list[float], list[float]]] = {}
    for text in texts:
        t0 = time.perf_counter()
        whole = whole_tok.encode(text, add_special_tokens=False)
        t1 = time.perf_counter()
        cached = cached_tok.encode_chat(text)
        t2 = time.perf_counter()
        assert cached == whole
        band = f"{len(whole) // 2000 * 2}k-{len(whole) // 2000 * 2 + 2}k tokens"
        rows.setdefault(band, ([], []))
        rows[band][0].append(t1 - t0)
        rows[band][1].append(t2 - t1)
    print("| prompt length | prompts | whole (µs, median) | cached (µs, median) | ratio |")
    print("|---|---|---|---|---|")
    for band, (whole_s, cached_s) in sorted(rows.items(), key=lambda kv: int(kv[0].split("k")[0])):
        w, c = statistics.median(whole_s) * 1e6, statistics.median(cached_s) * 1e6
        print(f"| {band} | {len(whole_s)} | {w:.0f} | {c:.0f} | {w / c:.1f}x |")
    cache = cached_tok.prefix_cache
    print(f"cache: {cache.hits} hits, {cache.misses} misses, {len(cache)} entries")


if __name__ == "__main__":
    main()
