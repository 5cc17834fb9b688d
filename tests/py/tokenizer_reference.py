#!/usr/bin/env python3
"""Reference token ids for specd's tokenizer, from an independent implementation.

Prints (or writes with --out) JSON of {text: [ids]} for a list of strings,
encoded without added special tokens (special tokens written in the text, such
as <|im_start|>, still encode as their single ids).

Backends (--backend):
  transformers  transformers' own GGUF tokenizer construction (the code behind
                AutoTokenizer.from_pretrained(dir, gguf_file=name)): vocab,
                merges and control/user-defined tokens read from the GGUF by the
                `gguf` package, turned into a tokenizer by transformers'
                converter. When torch is installed it goes through AutoTokenizer
                itself; without torch (transformers' GGUF reader imports torch)
                it calls the same converter on metadata read with `gguf`.
                transformers (5.x) applies no pre-tokenizer split for the
                `smollm`-family `tokenizer.ggml.pre` names, i.e. it does not split
                digits; llama.cpp (pre type SMOLLM: "\\p{N}" split first) and
                SmolLM2's own tokenizer.json (Digits(individual_digits=true)) do.
                This backend adds that Digits step for those names
                (--no-digits-fix to see transformers' raw output).
  llama_cpp     llama-cpp-python's tokenizer (llama.cpp's own BPE and regex
                code: fully independent of the `tokenizers` library).
  python        a plain-Python byte-level BPE written here from llama.cpp's
                description (split out control/user-defined tokens, then the
                pre-tokenizer regexes of `tokenizer.ggml.pre`, GPT-2 byte
                mapping, merges applied by rank): independent of the
                `tokenizers` library. Needs `gguf` and `regex`.
  auto          llama_cpp if importable, else transformers.

Requirements: pip install gguf transformers (torch optional), or
pip install llama-cpp-python.

Usage: tokenizer_reference.py [--gguf FILE] [--backend B] [--strings FILE.json] [--out FILE]
The GGUF defaults to the default model in specd's store (specd_paths.model_path).
"""
import argparse
import json
import os
import sys

# Pre-tokenizer names llama.cpp treats as "\p{N}" split + GPT-2 regex.
DIGIT_SPLIT_PRES = {"smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva-7b"}

STRINGS = [
    "",
    " ",
    "Hello world",
    "Hello, world! How are you today?",
    "What is the capital of France?",
    "The capital of France is Paris.",
    "I'm sure they're right, we'll see; don't you THINK it's fine? I'd've",
    "  leading spaces",
    "trailing spaces   ",
    "a  b   c    d     e",
    "tabs\tand\t\tnewlines\n\nmixed \n \t end",
    "\n\n\n",
    "line1\r\nline2\rline3",
    "12345 678 9",
    "3.14159 1,000,000 -42 +7 0x1F 1e-10",
    "2024-11-29T19:57:00Z",
    "Version 1.2.3-beta.4",
    "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n",
    "fn main() {\n    let v: Vec<u32> = (0..10).map(|x| x * x).collect();\n    println!(\"{:?}\", v);\n}",
    "<div class=\"x\">&nbsp;</div><!-- comment -->",
    "SELECT * FROM users WHERE id = 1;",
    "Café naïve résumé façade Ångström",
    "Ελληνικά и русский язык",
    "日本語のテキストと中文文本",
    "한국어 텍스트",
    "مرحبا بالعالم",
    "हिन्दी पाठ",
    "emoji: 😀 🎉 👍🏽 👨‍👩‍👧‍👦 🇫🇷",
    "math: ∀x∈ℝ, x² ≥ 0 → √x ∞ ≠ ≈",
    "zero\u200bwidth and nbsp\u00a0here",
    "<|im_start|>",
    "<|im_end|>",
    "<|endoftext|>",
    "<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n",
    "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n",
    "text<|im_end|>more<|endoftext|>",
    "<|im_start <|im_end| |im_end|> <im_end>",
    "<repo_name>specd<file_sep>src/main.rs",
    "!!!???...,,,;;;:::",
    "\"quoted\" 'single' `back`",
    "ALLCAPS lowercase MiXeD",
    "a" * 50,
    "supercalifragilisticexpialidocious antidisestablishmentarianism",
]


def gguf_tokenizer_dict(path):
    """What transformers' get_gguf_tokenizer builds, read with the gguf package."""
    from gguf import GGUFReader

    r = GGUFReader(path)

    def val(key):
        f = r.fields.get(key)
        return None if f is None else f.contents()

    from transformers.integrations.gguf.gguf_tokenizer_mapping import GGUF_TOKENIZER_MAPPING

    tok = {}
    for key, name in GGUF_TOKENIZER_MAPPING["tokenizer"].items():
        v = val("tokenizer." + key)
        if v is not None:
            tok[name] = v
    return val("general.architecture"), tok


def transformers_encoder(path, digits_fix=True):
    name = os.path.basename(path)
    pre = None
    try:
        import torch  # noqa: F401  (transformers' GGUF reader needs it)
        from transformers import AutoTokenizer

        t = AutoTokenizer.from_pretrained(os.path.dirname(os.path.abspath(path)), gguf_file=name)
        backend = t.backend_tokenizer
        _, tok = gguf_tokenizer_dict(path)
        pre = tok.get("pre_tokenizer_type")
        how = "transformers AutoTokenizer.from_pretrained(gguf_file=...)"
    except ImportError:
        from transformers.integrations.gguf.gguf_tokenizer_mapping import convert_gguf_tokenizer

        arch, tok = gguf_tokenizer_dict(path)
        pre = tok.get("pre_tokenizer_type")
        backend, _ = convert_gguf_tokenizer(arch, tok)
        how = "transformers convert_gguf_tokenizer (no torch) on gguf-py metadata"
    if digits_fix and pre in DIGIT_SPLIT_PRES:
        from tokenizers import pre_tokenizers

        backend.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Digits(individual_digits=True), backend.pre_tokenizer]
        )
        how += f" + Digits(individual_digits=True) for pre '{pre}'"
    return (lambda s: backend.encode(s, add_special_tokens=False).ids), how


def python_encoder(path):
    """Byte-level BPE from scratch (llama.cpp's algorithm, in plain Python)."""
    import regex
    from gguf import GGUFReader

    r = GGUFReader(path)

    def val(key, default=None):
        f = r.fields.get(key)
        return default if f is None else f.contents()

    assert val("tokenizer.ggml.model") == "gpt2", "python backend: byte-level BPE only"
    pre = val("tokenizer.ggml.pre", "default")
    tokens = val("tokenizer.ggml.tokens")
    types = val("tokenizer.ggml.token_type") or [1] * len(tokens)
    merges = val("tokenizer.ggml.merges")
    gpt2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
    if pre in DIGIT_SPLIT_PRES:
        splits = [r"\p{N}", gpt2]
    elif pre in ("default", "gpt2", "gpt-2", "mpt", "olmo"):
        splits = [gpt2]
    else:
        raise SystemExit(f"python backend: pre-tokenizer {pre!r} not implemented")
    vocab = {t: i for i, t in enumerate(tokens)}
    ranks = {tuple(m.split(" ", 1)): i for i, m in enumerate(merges)}
    # GPT-2 bytes_to_unicode
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    byte_char = {b: chr(c) for b, c in zip(bs, cs)}
    specials = sorted((t for t, ty in zip(tokens, types) if ty in (3, 4)), key=len, reverse=True)
    special_re = regex.compile("|".join(regex.escape(t) for t in specials)) if specials else None

    def split(text, pattern):
        out = []
        for piece in text:
            pos = 0
            for m in regex.finditer(pattern, piece):
                if m.start() > pos:
                    out.append(piece[pos : m.start()])
                out.append(m.group(0))
                pos = m.end()
            if pos < len(piece):
                out.append(piece[pos:])
        return out

    def bpe(word):
        parts = [byte_char[b] for b in word.encode("utf-8")]
        while len(parts) > 1:
            best = min(range(len(parts) - 1), key=lambda i: ranks.get((parts[i], parts[i + 1]), float("inf")))
            if (parts[best], parts[best + 1]) not in ranks:
                break
            parts[best : best + 2] = [parts[best] + parts[best + 1]]
        return [vocab[p] for p in parts]

    def enc(text):
        ids = []
        frags = []
        pos = 0
        if special_re is not None:
            for m in special_re.finditer(text):
                frags.append((text[pos : m.start()], False))
                frags.append((m.group(0), True))
                pos = m.end()
        frags.append((text[pos:], False))
        for frag, is_special in frags:
            if is_special:
                ids.append(vocab[frag])
                continue
            if not frag:
                continue
            words = [frag]
            for pattern in splits:
                words = split(words, pattern)
            for w in words:
                ids.extend(bpe(w))
        return ids

    return enc, f"plain-Python byte-level BPE (pre '{pre}': {len(splits)} regex splits, {len(merges)} merges)"


def llama_cpp_encoder(path):
    import llama_cpp

    llm = llama_cpp.Llama(model_path=path, vocab_only=True, verbose=False)

    def enc(s):
        return llm.tokenize(s.encode("utf-8"), add_bos=False, special=True)

    return enc, f"llama-cpp-python {llama_cpp.__version__} Llama.tokenize(special=True, add_bos=False)"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gguf", help="GGUF file (default: the default model in specd's store)")
    ap.add_argument("--backend", choices=["auto", "transformers", "llama_cpp", "python"], default="auto")
    ap.add_argument("--strings", help="JSON file with a list of strings (default: built-in list)")
    ap.add_argument("--out", help="write the JSON here instead of stdout")
    ap.add_argument("--no-digits-fix", action="store_true")
    a = ap.parse_args()
    if a.gguf is None:
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        from specd_paths import model_path

        a.gguf = str(model_path())
    if not os.path.exists(a.gguf):
        sys.exit(f"tokenizer_reference: GGUF file not found: {a.gguf}")
    strings = STRINGS
    if a.strings:
        with open(a.strings, encoding="utf-8") as f:
            strings = json.load(f)
    backend = a.backend
    if backend == "auto":
        try:
            import llama_cpp  # noqa: F401

            backend = "llama_cpp"
        except ImportError:
            backend = "transformers"
    if backend == "llama_cpp":
        enc, how = llama_cpp_encoder(a.gguf)
    elif backend == "python":
        enc, how = python_encoder(a.gguf)
    else:
        enc, how = transformers_encoder(a.gguf, digits_fix=not a.no_digits_fix)
    out = {s: [int(i) for i in enc(s)] for s in strings}
    text = "{\n" + ",\n".join(json.dumps(k, ensure_ascii=False) + ": " + json.dumps(v) for k, v in out.items()) + "\n}"
    print(f"tokenizer_reference: {len(out)} strings via {how}", file=sys.stderr)
    if a.out:
        with open(a.out, "w", encoding="utf-8") as f:
            f.write(text + "\n")
    else:
        print(text)


if __name__ == "__main__":
    main()
