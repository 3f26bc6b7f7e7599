#!/usr/bin/env python3
"""Builds the small test tokenizer and the prompt goldens in tests/data/tokenizer/.

The real Pi0.5 prompt tokenizer is PaliGemma's SentencePiece vocabulary (257k tokens) exported to
Hugging Face JSON by `transformers`' GemmaConverter. The test model has a 1024-row embedding, so the
tests use a tokenizer with the same structure and a tiny vocabulary:

  * model: BPE with byte_fallback (characters outside the vocabulary become <0xNN> byte tokens);
  * ids: <pad>=0, <eos>=1, <bos>=2, <unk>=3, then <0x00>..<0xFF> at 4..259, then learned tokens;
  * normalizer: Replace(" " -> "▁") with no dummy-prefix prepend (Gemma adds none);
  * pre-tokenizer: Split(" ", merged_with_previous), as GemmaConverter writes it; it runs after the
    normalizer, so it never matches and the whole text is one BPE word, like Gemma's file;
  * decoder: Replace("▁" -> " "), ByteFallback, Fuse;
  * post-processor: "<bos> $A", so encode(add_special_tokens=True) prepends BOS (id 2).

Merges are learned on Pi0.5 prompts ("Task: ..., State: 12 7 255;\\nAction: ") with words split
before each "▁", as SentencePiece's split_by_whitespace does, so learned tokens never hold an
interior "▁". Unlike Gemma (which splits digits) numbers get merges ("▁12", and bins fused with
the tail such as "▁128;\\nAction:"), which is what makes assembling the prompt piecewise
non-trivial.

Outputs tokenizer.json and expected.json: full prompts and the ids this library produces for them,
unpadded and padded/truncated to 200 like lerobot's tokenizer step. Usage (tokenizers==0.22.2):

    python3 tools/golden/make_tokenizer.py [out_dir]   # default: tests/data/tokenizer
"""

import json
import random
import sys
from pathlib import Path

from tokenizers import AddedToken, Tokenizer, decoders, normalizers, pre_tokenizers, processors
from tokenizers.models import BPE
from tokenizers.trainers import BpeTrainer

SPECIALS = ["<pad>", "<eos>", "<bos>", "<unk>"]
BYTES = [f"<0x{b:02X}>" for b in range(256)]
VOCAB_SIZE = 1024  # the tiny test model's embedding rows
PROMPT_LEN = 200  # Pi0.5's max_token_len

TASKS = [
    "pick up the red block", "put the cup in the sink", "fold the towel", "open the drawer",
    "close the drawer", "stack the blocks", "place the apple on the plate", "wipe the table",
    "push the button", "pour water into the bowl", "hang the mug on the rack", "sort the objects",
    "move the bottle to the left", "turn on the stove", "pick up the spoon", "put the lid on the pot",
    "insert the peg into the hole", "grasp the handle and pull", "place the book on the shelf",
    "clean up the table", "put the toy in the box", "open the fridge", "take out the tray",
    "fold the shirt", "put the fork next to the plate", "pick the green cube", "lift the basket",
]


def clean(task: str) -> str:
    return task.strip().replace("_", " ").replace("\n", " ")


def prompt(task: str, bins: list[int]) -> str:
    return f"Task: {clean(task)}, State: {' '.join(map(str, bins))};\nAction: "


def corpus(rng: random.Random) -> list[str]:
    lines = []
    for _ in range(3000):
        # Bins cluster around the middle (normalized states near 0) but cover -1..255.
        n = rng.randint(1, 14)
        bins = [min(255, max(-1, int(rng.gauss(128, 60)))) for _ in range(n)]
        lines.append(prompt(rng.choice(TASKS), bins))
    numbers = " ".join(str(b) for b in range(-1, 256))
    lines += [numbers] * 20
    return lines


def build() -> Tokenizer:
    trainer_tok = Tokenizer(BPE(unk_token="<unk>", byte_fallback=True))
    trainer_tok.normalizer = normalizers.Replace(" ", "▁")
    # Training only: words start at each "▁" (SentencePiece's split_by_whitespace).
    trainer_tok.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="never", split=True)
    trainer = BpeTrainer(
        vocab_size=VOCAB_SIZE - len(BYTES), special_tokens=SPECIALS, show_progress=False
    )
    trainer_tok.train_from_iterator(corpus(random.Random(5)), trainer=trainer)
    trained = json.loads(trainer_tok.to_str())["model"]

    # Re-number: specials, the 256 byte tokens, then the alphabet and learned tokens in order.
    learned = sorted((i, t) for t, i in trained["vocab"].items() if t not in SPECIALS)
    vocab = {t: i for i, t in enumerate(SPECIALS + BYTES + [t for _, t in learned])}
    merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in trained["merges"]]
    assert len(vocab) <= VOCAB_SIZE, len(vocab)

    tok = Tokenizer(BPE(vocab, merges, unk_token="<unk>", fuse_unk=True, byte_fallback=True))
    tok.normalizer = normalizers.Replace(" ", "▁")
    tok.pre_tokenizer = pre_tokenizers.Split(" ", "merged_with_previous")
    tok.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()]
    )
    tok.post_processor = processors.TemplateProcessing(
        single="<bos> $A", pair="<bos> $A <bos>:1 $B:1", special_tokens=[("<bos>", 2)]
    )
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIALS])
    return tok


# (task, state bins): unicode (byte fallback), strip/underscore/newline cleaning (Python's strip
# also removes \x1c..\x1f), the empty task, bins at both ends and around digit-count changes, and a
# task long enough to be truncated at 200 tokens.
CASES = [
    ("pick up the red block", [128, 127, 129, 130, 126, 128, 128]),
    ("pick the café cup", [-1, 0, 9, 10, 99, 100, 255, 128]),
    ("  Put_the_bowl\nin the sink \n", [0]),
    ("\tstack blocks 🤖\x1c", [255, 255]),
    ("", [10, 99, 100, 9, -1, 0, 1, 2, 3, 4, 5, 6, 7, 8]),
    ("fold the towel, then open the drawer", [5] * 32),
    ("wave at Zoë — 3 times", [100, 99, 10, 9, 0, -1]),
    (", then ".join(TASKS * 2), [17, 200, 33]),
]


def main() -> None:
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "tests/data/tokenizer")
    out.mkdir(parents=True, exist_ok=True)
    tok = build()
    tok.save(str(out / "tokenizer.json"))

    # Reload from disk so the goldens come from exactly the committed file.
    tok = Tokenizer.from_file(str(out / "tokenizer.json"))
    padded = Tokenizer.from_file(str(out / "tokenizer.json"))
    padded.enable_truncation(PROMPT_LEN)
    padded.enable_padding(length=PROMPT_LEN, pad_id=0, pad_token="<pad>")
    cases = []
    for task, bins in CASES:
        text = prompt(task, bins)
        enc = padded.encode(text, add_special_tokens=True)
        cases.append({
            "task": task,
            "state_bins": bins,
            "prompt": text,
            "ids": tok.encode(text, add_special_tokens=True).ids,
            "padded_ids": enc.ids,
            "padded_mask": enc.attention_mask,
        })
    doc = {
        "generator": "tools/golden/make_tokenizer.py",
        "prompt_len": PROMPT_LEN,
        "cases": cases,
    }
    (out / "expected.json").write_text(json.dumps(doc, ensure_ascii=False, indent=1) + "\n")
    print(f"vocab {tok.get_vocab_size()}, {len(cases)} cases -> {out}")


if __name__ == "__main__":
    main()
