"""The texts of the tokenizer_cases.json fixture: code, unicode, emoji, whitespace runs, digits,
contractions, punctuation, special tokens written as literal text, ChatML, and mixes."""

# ruff: noqa: RUF001  (the tokenizer corpus is full of look-alike characters on purpose)
from __future__ import annotations

PY_CODE = '''def fib(n: int) -> int:
    """Return the n-th Fibonacci number."""
    if n < 2:
        return n
    a, b = 0, 1
    for _ in range(n - 1):
        a, b = b, a + b
    return b


class Stack:
\tdef __init__(self):
\t\tself.items = []  # tabs, not spaces
'''

JS_CODE = """const fetchAll = async (urls) => {
  const res = await Promise.all(urls.map((u) => fetch(u)));
  return res.filter((r) => r.ok && r.status !== 204);
};
export default { fetchAll };  // ES module
"""

C_CODE = """#include <stdio.h>

int main(int argc, char **argv) {
    for (int i = 0; i < argc; ++i) {
        printf("%d: %s\\n", i, argv[i]);
    }
    return 0;
}
"""

LONG_PARAGRAPH = (
    "The history of computing is a story of layers. Early machines were programmed by rewiring "
    "panels; then came stored programs, assemblers, and compilers. Each layer hid the details "
    "below it, so that people could think about larger problems. In the 1970s, operating systems "
    "such as Unix made it possible to share a computer between many users, and the C language "
    "made programs portable across hardware. By the 1990s, the web connected millions of "
    "machines, and by 2020 the cloud rented out computation by the second. Today, large language "
    "models are yet another layer: they turn natural language into actions, code, and answers. "
    "Whether this layer will be as durable as the others remains to be seen, but it's clear that "
    "we'll keep building on top of what came before - as we always have."
)

CHATML = (
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n"
    "<|im_start|>assistant\n2+2 equals 4.<|im_end|>\n"
    "<|im_start|>user\nAnd 3*3?<|im_end|>\n"
    "<|im_start|>assistant\n"
)

# the corpus up to the model's own control tokens (which tokenizer_corpus puts next)
FIXED_TEXTS = (
    # empty and tiny
    "",
    " ",
    "a",
    "Hello",
    "Hello, world!",
    "hello world",
    " Hello world",
    # code
    PY_CODE,
    JS_CODE,
    C_CODE,
    "    return x  # four-space indent",
    "if (x) {\n\tdo_it();\n}\n",
    "SELECT id, name FROM users WHERE age >= 18 ORDER BY name;",
    '{"key": [1, 2.5, null, true], "nested": {"a": "b"}}',
    # unicode
    "café naïve résumé façade Ångström",
    "Straße größer Übung ÄÖÜ",
    "日本語のテキストです。東京は大きい。",
    "中文分词测试：你好，世界！",
    "한국어 문장입니다.",
    "مرحبا بالعالم، كيف حالك؟",
    "नमस्ते दुनिया, आप कैसे हैं?",
    "Привет, мир! Ёжик в тумане.",
    "e\u0301 a\u0300 n\u0303 o\u0308 (combining marks) vs é à ñ ö",
    "Ελληνικά: αβγδε ΑΒΓΔΕ",
    "math: ∑ ∫ √ ∞ ≤ ≥ ≠ ± × ÷ → ⇒ ∀x ∈ ℝ",
    # emoji
    "I love pizza 🍕🍕 and cats 🐱!",
    "family: 👨\u200d👩\u200d👧\u200d👦 and 👩🏽\u200d💻 technologist",
    "flags: 🇫🇷 🇯🇵 🇺🇸 🏳️\u200d🌈",
    "thumbs 👍🏻👍🏿 ❤️ ✨",
    # whitespace runs
    "a  b   c    d",
    "tab\tseparated\t\tvalues",
    "line1\nline2\n\nline4\n\n\n\nline8",
    "   leading spaces",
    "trailing spaces   ",
    "\n\nleading newlines",
    "trailing newline\n",
    " \t \n mixed \r\n whitespace \t\t\n",
    "        ",
    "\n",
    "\t\t\t",
    # digits
    "1234567890",
    "The year 2024 had 366 days.",
    "pi = 3.14159265358979, e = 2.71828",
    "Date: 2024-01-15T10:30:00Z",
    "123abc abc123 a1b2c3",
    "$1,234,567.89 and -42 and +7 and 1e-10",
    "Call 555-0123 or +1 (800) 555-0199.",
    # where the pre-tokenizers differ (see DIGITS_FIRST_NOTE): a whitespace run before digits,
    # a space before a non-ASCII number character
    "   42",
    "x =    1000",
    "col1\t  2\n    3",
    " ² x²³ E=mc² ½ ¼ ⅓ ①",
    " ٣٤٥ ४५६ ３４５",
    # contractions
    "it's don't they're we've I'm you'll he'd",
    "IT'S DON'T THEY'RE WE'VE I'M YOU'LL HE'D",
    "It's John's book; it'd be nice if you'd've known.",
    "rock 'n' roll, 'quoted' and ’curly’ apostrophes",
    # punctuation
    "Wait... what?!?! No way!!!",
    "----====****####",
    "((a + b) * [c - d]) / {e % f}",
    "a->b; c=>d; x::y; p != q; r <= s; t >>= 2;",
    "\"double\" 'single' `backtick` «guillemets» „low“",
    # URLs and paths
    "https://example.com/path/to/page?query=1&lang=en#section",
    "email: someone.name+tag@example.org",
    "C:\\Users\\name\\Documents\\file.txt and /usr/local/bin/python3",
    # special tokens as literal text
    "<|im_start|>",
    "<|im_end|>",
    "<|endoftext|>",
    "text<|endoftext|>more text",
    "<|im_start|>user\nhi<|im_end|>",
    " <|im_start|> spaced <|im_end|> ",
    "<|im_start|><|im_end|><|endoftext|>",
    "<|im_start",
    "im_end|>",
)

# the corpus after the control tokens
LONG_TEXTS = (
    CHATML,
    # long paragraph
    LONG_PARAGRAPH,
    # mixes
    "Mixed: café 123 🍕 <|im_end|> 日本 don't\n\tend",
    "CamelCaseIdentifier snake_case_name kebab-case-name SCREAMING_CASE",
    "zzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzz",
    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
)


def tokenizer_corpus(control_tokens: list[str]) -> list[str]:
    """The corpus, with the model's `control_tokens` written as text: joined by spaces, joined
    without, and each one alone between two words."""
    return [
        *FIXED_TEXTS,
        " ".join(control_tokens),
        "".join(control_tokens),
        *LONG_TEXTS,
        *(f"before {t} after" for t in control_tokens),
    ]
