#!/usr/bin/env python3
"""Writes tests/data/tokenizer/corpus.jsonl: one JSON string per line, chosen to exercise every
tokenizer stage (whitespace runs, digits, scripts, emoji, marks, special-token text, long inputs).
Deterministic; re-run after editing the lists below."""
import json
import os
import random

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "..", "data", "tokenizer", "corpus.jsonl")

PROSE = [
    "The quick brown fox jumps over the lazy dog.",
    "It's a truth universally acknowledged, that a single man in possession of a good fortune, must be in want of a wife.",
    "She said: \"I'll be there at 5 o'clock, won't you?\" He'd already left; they're gone, we've lost, I'm sad, you'd know.",
    "HELLO World! ThIs Is MiXeD CaSe... and ellipses\u2026 and \u201cquotes\u201d and \u2018single\u2019 ones.",
    "Tokenization is the process of splitting text into pieces, called tokens, that a model can map to integer ids.",
    "In 1969, Apollo 11 landed on the Moon; 3.14159 is pi, 2,718 is not e, and 1e-9 is a nanosecond.",
    "e-mail: someone@example.com, URL: https://example.org/path?q=1&r=two#frag",
]
CODE = [
    "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n",
    "#include <stdio.h>\nint main(void) {\n\tprintf(\"%d\\n\", 42);\n\treturn 0;\n}\n",
    "fn main() {\n    let v: Vec<i32> = (0..10).map(|x| x * x).collect();\n    println!(\"{:?}\", v);\n}",
    "const add = (a, b) => a + b; // arrow\nconsole.log(`sum=${add(1, 2)}`);",
    "SELECT id, name FROM users WHERE age >= 18 ORDER BY name DESC LIMIT 10;",
    "<html><body class=\"main\"><p>Hello &amp; welcome</p></body></html>",
    "    indented with spaces\n\t\tand tabs\n\n\n\nand blank lines\r\nand CRLF\r\n",
]
SPACES = [
    "", " ", "  ", "\t", "\n", "\n\n", " \n ", "\r\n", "   leading and trailing   ", "a  b   c    d     e",
    "tab\tseparated\tvalues\t", "line1\nline2\n\nline4", "\u00a0non-breaking\u00a0space", "ideographic\u3000space",
    "next\u0085line", "zero\u200bwidth", "em\u2003space", "  \n\t  \n", " x", "x ",
]
NUMBERS = [
    "0", "7", "42", "123", "1234", "12345678901234567890", "3.14159265358979", "-273.15", "1,000,000",
    "0x1F", "2024-05-17", "+1 (555) 123-4567", "\u0661\u0662\u0663 arabic-indic digits", "\uff11\uff12\uff13 fullwidth",
    "\u00bd \u2155 \u2460 \u2161", "version 1.2.3-rc.4",
]
SCRIPTS = [
    "\u4eca\u5929\u5929\u6c14\u5f88\u597d\uff0c\u6211\u4eec\u53bb\u516c\u56ed\u5427\u3002",
    "\u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8\u3068\u30ab\u30bf\u30ab\u30ca\u3001\u3072\u3089\u304c\u306a\u3002",
    "\ud55c\uad6d\uc5b4 \ubb38\uc7a5\uc785\ub2c8\ub2e4.",
    "\u041f\u0440\u0438\u0432\u0435\u0442, \u043c\u0438\u0440! \u042d\u0442\u043e \u0442\u0435\u0441\u0442.",
    "\u0395\u03bb\u03bb\u03b7\u03bd\u03b9\u03ba\u03ac \u039a\u0395\u0399\u039c\u0395\u039d\u039f \u03c3\u03bf\u03c6\u03af\u03b1\u03c2",
    "\u0645\u0631\u062d\u0628\u0627 \u0628\u0627\u0644\u0639\u0627\u0644\u0645! \u0647\u0630\u0627 \u0646\u0635 \u0639\u0631\u0628\u064a.",
    "\u05e9\u05dc\u05d5\u05dd \u05e2\u05d5\u05dc\u05dd, \u05d6\u05d4 \u05d8\u05e7\u05e1\u05d8.",
    "mixed \u0627\u0644\u0639\u0631\u0628\u064a\u0629 and English \u05e2\u05d1\u05e8\u05d9\u05ea in one line",
    "\u0939\u093f\u0928\u094d\u0926\u0940 \u092e\u0947\u0902 \u0932\u093f\u0916\u093e \u0917\u092f\u093e",
    "\u0e20\u0e32\u0e29\u0e32\u0e44\u0e17\u0e22\u0e44\u0e21\u0e48\u0e21\u0e35\u0e0a\u0e48\u0e2d\u0e07\u0e27\u0e48\u0e32\u0e07",
    "Stra\u00dfe, na\u00efve caf\u00e9, \u0130stanbul, \u03a3\u039f\u03a6\u039f\u03a3, \u0132sselmeer",
]
EMOJI_MARKS = [
    "emoji: \U0001F600\U0001F680\U0001F389 done",
    "family: \U0001F468\u200d\U0001F469\u200d\U0001F467\u200d\U0001F466 and flags \U0001F1FA\U0001F1F8\U0001F1EF\U0001F1F5",
    "skin tones: \U0001F44D\U0001F3FB \U0001F44D\U0001F3FF \U0001F9D1\U0001F3FD\u200d\U0001F4BB",
    "hearts \u2764\ufe0f \u2764 \U0001FAF6\U0001F3FC",
    "combining: e\u0301 a\u0308 o\u0302\u0323 n\u0303 Z\u0351\u036b\u0343\u036a\u0302\u036b\u033d\u034f\u0334\u0319\u0324\u031e\u0349\u035a\u032f\u031e\u0320\u034d",
    "precomposed \u00e9 vs decomposed e\u0301; \ufb01 ligature; \u2126 ohm; \u212b angstrom",
    "math \U0001D400\U0001D401\U0001D402 and \u2200x\u2208\u211d: x\u00b2 \u2265 0",
    "private use \ue000 and replacement \ufffd and bom \ufeff",
]
SPECIAL_TEXT = [
    "<|im_start|>user\nHello!<|im_end|>\n<|im_start|>assistant\n",
    "text before </s> text after <s> and <unk>",
    "<|endoftext|>",
    "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nYou are helpful.<|eot_id|>",
    "not quite special: <|im_start |> < s > </s <|im_end",
    "glued<|im_end|>glued and [MASK] in a sentence, [MASK]word, word[MASK] and  [MASK]  spaced",
    "<|fim_prefix|>def f():<|fim_suffix|>\n<|fim_middle|>",
    "<think>reasoning</think> answer",
]

def long_inputs(rng):
    words = ("alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho sigma tau "
             "upsilon phi chi psi omega the of and to in is that it for on with as was at by").split()
    out = []
    text = " ".join(rng.choice(words) for _ in range(1200))
    out.append(text)  # ~7 KB of prose-like text
    out.append(("\n".join(CODE) + "\n") * 6)
    out.append("".join(rng.choice(SCRIPTS[:3]) for _ in range(40)))
    out.append(" " * 300 + "x" + "\n" * 100 + "y" + "\t" * 50)
    out.append("9" * 2000)
    return out

def main():
    rng = random.Random(1234)
    lines = PROSE + CODE + SPACES + NUMBERS + SCRIPTS + EMOJI_MARKS + SPECIAL_TEXT + long_inputs(rng)
    with open(OUT, "w", encoding="utf-8") as f:
        for s in lines:
            f.write(json.dumps(s, ensure_ascii=False) + "\n")
    print(f"wrote {len(lines)} lines to {os.path.relpath(OUT)}")

if __name__ == "__main__":
    main()
