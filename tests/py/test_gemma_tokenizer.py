"""Gemma 3's tokenizer (SentencePiece BPE read from the GGUF) against an
independent one: llama.cpp's own tokenizer through llama-cpp-python, on the
same GGUF file.

mlx-lm reads the tokenizer.json that `specd convert` writes, i.e. specd's own
construction, so it cannot catch a tokenizer bug; llama.cpp's SPM code shares
nothing with specd (which builds on the `tokenizers` crate).

Both sides encode a prompt: BOS where the model adds it (Gemma: add_bos_token
is true), control tokens written in the text (`<start_of_turn>`) parsed as
their single ids (specd's prompts are rendered templates), user-defined
tokens (whitespace runs, HTML tags) matched whole.

llama-cpp-python is pinned in tests/py/requirements.txt; the Makefile builds
it (pip compiles llama.cpp) with CMAKE_ARGS that leave out llama.cpp's tools.

Environment: SPECD_BIN and SPECD_HOME, as in specd_paths.py.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from specd_paths import run as run_specd  # noqa: E402

# 40 strings: ASCII, whitespace runs, newlines, digits, unicode (accents,
# CJK, scripts without spaces, emoji, combining marks), byte fallback
# (control characters, characters outside the vocabulary), code, and the
# turn markers Gemma's chat format uses.
STRINGS = [
    "",
    " ",
    "Hello world",
    "The capital of France is",
    "I'm sure they're right, we'll see; don't you THINK it's fine? I'd've",
    "  two leading spaces",
    "trailing spaces   ",
    "tabs\tand\t\tdouble tabs",
    "many          spaces          between",
    "line one\nline two\n\nafter a blank line\n\n\n\nfour newlines",
    "\r\nWindows line ends\r\n",
    "   \n   \n\t\n",
    "1234567890 and 3.14159 and 1,000,000",
    "version 2.0.1-rc3, call 555-0199 at 08:30",
    "0x1F 0b1010 1e-9 -42",
    "Café, naïve, façade, jalapeño, Zürich",
    "Straße und Übermaß sind größer",
    "日本語のテキストです。東京は首都です。",
    "中文测试：你好，世界！",
    "한국어 문장입니다.",
    "Привет, как дела?",
    "Γειά σου Κόσμε",
    "مرحبا بالعالم",
    "ภาษาไทยไม่มีช่องว่าง",
    "हिन्दी में लिखा गया वाक्य",
    "Emoji: 😀🎉🚀 and 👨‍👩‍👧‍👦 family, flags 🇫🇷🇯🇵",
    "e\u0301 vs \u00e9 (combining acute)",
    "zero\u200bwidth\u200bspace and \ufeffBOM",
    "control \x01\x02\x1f bytes and \x7f",
    "rare: \U0001d54f\U0001d558\U0001d55c \u2f08 \U000e0041",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n    return n if n < 2 else fibonacci(n - 1) + fibonacci(n - 2)\n",
    "for (int i = 0; i < n; ++i) { sum += a[i] * b[i]; }",
    "<html><body><h1>Title</h1><p>Para &amp; more</p></body></html>",
    "SELECT id, name FROM users WHERE age >= 18 ORDER BY name;",
    '{"key": [1, 2.5, null, true], "nested": {"a": "b"}}',
    "https://example.com/path?query=1&other=two#frag",
    "<start_of_turn>user\nWhat is 2+2?<end_of_turn>\n<start_of_turn>model\n",
    "<bos>already has a BOS",
    "a" * 64 + " " + "ab" * 20,
    "The quick brown fox jumps over the lazy dog. THE QUICK BROWN FOX!",
]


def specd_ids(gguf: Path, texts: list[str], tmp: Path) -> list[list[int]]:
    inp, out = tmp / "texts.json", tmp / "ids.json"
    inp.write_text(json.dumps(texts))
    p = run_specd("debug", "tokenize", "--model", gguf, "--input", inp, "--json", out, timeout=300)
    assert p.returncode == 0, p.stderr
    return json.loads(out.read_text())


def llama_cpp_ids(gguf: Path, texts: list[str]) -> list[list[int]]:
    import llama_cpp

    llm = llama_cpp.Llama(model_path=str(gguf), vocab_only=True, verbose=False)
    bos = llm.token_bos()
    out = []
    for t in texts:
        # add_bos=True, as a prompt; a text that starts with <bos> gets no
        # second one (specd's encode_prompt rule; llama.cpp would double it).
        ids = llm.tokenize(t.encode("utf-8"), add_bos=True, special=True)
        if len(ids) > 1 and ids[0] == ids[1] == bos:
            ids = ids[1:]
        out.append(list(ids))
    return out


def test_strings_cover_the_kinds():
    assert len(STRINGS) == 40 and len(set(STRINGS)) == 40


def test_gemma_token_ids_equal_llama_cpp(gemma_path, tmp_path):
    got = specd_ids(gemma_path, STRINGS, tmp_path)
    want = llama_cpp_ids(gemma_path, STRINGS)
    assert len(got) == len(want) == len(STRINGS)
    bad = [(s, g, w) for s, g, w in zip(STRINGS, got, want) if g != w]
    for s, g, w in bad:
        print(f"{s!r}\n  specd     {g}\n  llama.cpp {w}")
    assert not bad, f"{len(bad)} of {len(STRINGS)} strings encode differently (see above)"
    # The comparison means something: BOS first, byte fallback and control
    # tokens exercised.
    assert all(ids[0] == 2 for ids in got), "every prompt starts with <bos> (id 2)"
    byte_tokens = range(238, 494)  # <0x00> .. <0xFF>
    assert any(i in byte_tokens for ids in got for i in ids), "no string fell back to byte tokens"
    turn = got[STRINGS.index("<start_of_turn>user\nWhat is 2+2?<end_of_turn>\n<start_of_turn>model\n")]
    assert turn.count(105) == 2 and turn.count(106) == 1, turn  # <start_of_turn>, <end_of_turn>
    print(f"{len(STRINGS)} strings, {sum(map(len, got))} tokens: identical")
