#!/usr/bin/env python3
"""Builds the tokenizer conformance fixtures with Hugging Face `tokenizers` / `transformers`.

For each family it writes tests/data/tokenizer/<family>/tokenizer.json (a small BPE trained here) and
expected.jsonl: for every line of corpus.jsonl, HF's ids with and without special tokens and the decoded
text with and without skipping special tokens; then "decode-only" lines with pseudo-random id sequences
(invalid byte runs included) and HF's decoded text for them.

The "gguf" family is the default model's GGUF tokenizer as transformers derives it from the same file
(pass --gguf PATH); its expected file holds ids and text only (the tokenizer comes from the GGUF).

    .venv/bin/python tests/tokenizer/make_expected.py --gguf "$PAGELLM_CACHE/models/SmolLM2-135M-Instruct.Q4_1.gguf"
"""
import argparse
import json
import os
import random
import sys

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, "..", "data", "tokenizer")

LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|"
          r"\s+(?!\S)|\s+")
QWEN2 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|"
         r"\s+(?!\S)|\s+")
DSV3 = [r"\p{N}{1,3}", "[一-龥぀-ゟ゠-ヿ]+",
        "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*|"
        "\\s*[\r\n]+|\\s+(?!\\S)|\\s+"]
DSLLM = ["[\r\n]", r"\s?[A-Za-zµÀ-ÖØ-öø-ƺƼ-ƿǄ-ʓʕ-ʯͰ-ͳͶͷͻ-ͽͿΆΈ-ΊΌΎ-ΡΣ-ϵϷ-ҁҊ-ԯԱ-Ֆ]+", r"\s?[!-/:-~！-／：-～‘-‟　-。]+",
         r"\s+$", "[一-龥ࠀ-一가-퟿]+", r"\p{N}+"]


def corpus():
    with open(os.path.join(DATA, "corpus.jsonl"), encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def training_text(lines):
    rng = random.Random(7)
    extra = []
    base = " ".join(lines[:40])
    for _ in range(30):
        words = base.split()
        rng.shuffle(words)
        extra.append(" ".join(words))
    return lines + extra


def byte_level_bpe(pre, specials, vocab_size=1200, ignore_merges=False, normalizer=None):
    tok = Tokenizer(models.BPE(ignore_merges=ignore_merges))
    if normalizer is not None:
        tok.normalizer = normalizer
    tok.pre_tokenizer = pre
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(training_text(corpus()), trainer)
    return tok


def split_then_bytes(patterns):
    return pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(p), "isolated") for p in patterns] +
                                   [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])


def spm_bpe(legacy):
    """Llama-2 / Mistral style: SentencePiece BPE as tokenizers runs it, with <0xNN> byte fallback."""
    base = Tokenizer(models.BPE())
    base.normalizer = normalizers.Replace(" ", "\u2581")
    base.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="first", split=False)
    trainer = trainers.BpeTrainer(vocab_size=900, show_progress=False, max_token_length=16)
    base.train_from_iterator(training_text(corpus()), trainer)
    trained = json.loads(base.to_str())["model"]
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for b in range(256):
        vocab[f"<0x{b:02X}>"] = len(vocab)
    for t, _ in sorted(trained["vocab"].items(), key=lambda kv: kv[1]):
        if t not in vocab:
            vocab[t] = len(vocab)
    merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in trained["merges"]]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token="<unk>", fuse_unk=True, byte_fallback=True))
    if legacy:
        tok.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"), normalizers.Replace(" ", "\u2581")])
    else:
        tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first", split=False)
    tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    tok.add_special_tokens([AddedToken(t, normalized=False, special=True) for t in ("<unk>", "<s>", "</s>")])
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    return tok


def families():
    out = {}
    t = byte_level_bpe(pre_tokenizers.ByteLevel(add_prefix_space=False), ["<|endoftext|>"])
    t.post_processor = processors.ByteLevel(trim_offsets=False)
    out["gpt2"] = t

    t = byte_level_bpe(split_then_bytes([LLAMA3]), ["<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>",
                                                    "<|start_header_id|>", "<|end_header_id|>"], ignore_merges=True)
    t.post_processor = processors.TemplateProcessing(single="<|begin_of_text|> $A",
                                                     special_tokens=[("<|begin_of_text|>", 0)])
    out["llama3"] = t

    t = byte_level_bpe(split_then_bytes([QWEN2]), ["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
                       normalizer=normalizers.NFC())
    t.add_tokens([AddedToken("<think>", special=False, normalized=False),
                  AddedToken("</think>", special=False, normalized=False)])
    out["qwen2"] = t

    t = byte_level_bpe(split_then_bytes(DSV3), ["<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>",
                                               "<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"])
    t.post_processor = processors.TemplateProcessing(single="<｜begin▁of▁sentence｜> $A",
                                                     special_tokens=[("<｜begin▁of▁sentence｜>", 0)])
    out["deepseek_v3"] = t

    t = byte_level_bpe(split_then_bytes(DSLLM), ["<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"])
    out["deepseek_llm"] = t

    out["spm_bpe"] = spm_bpe(legacy=False)
    out["spm_bpe_legacy"] = spm_bpe(legacy=True)

    t = Tokenizer(models.BPE(unk_token="[UNK]", end_of_word_suffix="</w>"))
    t.normalizer = normalizers.Sequence([normalizers.NFKC(), normalizers.Lowercase(), normalizers.Strip()])
    t.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Punctuation(),
                                               pre_tokenizers.Digits(individual_digits=True)])
    t.decoder = decoders.Sequence([decoders.Replace("</w>", " "), decoders.Strip(" ", 0, 1)])
    t.train_from_iterator(training_text(corpus()), trainers.BpeTrainer(
        vocab_size=900, special_tokens=["[UNK]", "[CLS]", "[SEP]"], end_of_word_suffix="</w>", show_progress=False))
    t.post_processor = processors.BertProcessing(("[SEP]", t.token_to_id("[SEP]")), ("[CLS]", t.token_to_id("[CLS]")))
    out["nfkc_lower_digits"] = t

    t = byte_level_bpe(pre_tokenizers.ByteLevel(add_prefix_space=True), ["<s>", "</s>"],
                       normalizer=normalizers.Lowercase())
    t.add_special_tokens([AddedToken("[MASK]", lstrip=True, rstrip=False, normalized=False, special=True),
                          AddedToken("<|im_end|>", lstrip=False, rstrip=True, normalized=False, special=True)])
    t.add_tokens([AddedToken("word", single_word=True, normalized=True),
                  AddedToken("GLUED", single_word=False, normalized=True, lstrip=True, rstrip=True),
                  AddedToken("<|im_start|>", normalized=False, special=False)])
    t.post_processor = processors.RobertaProcessing(("</s>", t.token_to_id("</s>")), ("<s>", t.token_to_id("<s>")),
                                                    trim_offsets=False, add_prefix_space=True)
    t.decoder = decoders.ByteLevel()
    out["added_flags"] = t
    return out


def random_id_lists(n_vocab, rng, count=40):
    lists = []
    for i in range(count):
        length = rng.randint(0, 24)
        lists.append([rng.randrange(n_vocab) for _ in range(length)])
    return lists


def write_expected(path, encode, decode, n_vocab, byte_ids=()):
    lines = corpus()
    rng = random.Random(99)
    with open(path, "w", encoding="utf-8") as f:
        for i, text in enumerate(lines):
            ids = encode(text, True)
            ids_plain = encode(text, False)
            rec = {"line": i, "ids": ids, "ids_no_special": ids_plain,
                   "text": decode(ids, False), "text_skip_special": decode(ids, True)}
            f.write(json.dumps(rec, ensure_ascii=False) + "\n")
        lists = random_id_lists(n_vocab, rng)
        if byte_ids:  # runs of byte-fallback tokens, valid and invalid UTF-8
            for _ in range(20):
                lists.append([rng.choice(byte_ids) if rng.random() < 0.7 else rng.randrange(n_vocab)
                              for _ in range(rng.randint(1, 12))])
        for ids in lists:
            rec = {"decode_ids": ids, "text": decode(ids, False), "text_skip_special": decode(ids, True)}
            f.write(json.dumps(rec, ensure_ascii=False) + "\n")


def hf_family(name, tok):
    d = os.path.join(DATA, name)
    os.makedirs(d, exist_ok=True)
    tok.save(os.path.join(d, "tokenizer.json"))
    tok = Tokenizer.from_file(os.path.join(d, "tokenizer.json"))
    byte_ids = [tok.token_to_id(f"<0x{b:02X}>") for b in range(256) if tok.token_to_id(f"<0x{b:02X}>") is not None]
    write_expected(os.path.join(d, "expected.jsonl"),
                   lambda s, sp: tok.encode(s, add_special_tokens=sp).ids,
                   lambda ids, skip: tok.decode(ids, skip_special_tokens=skip),
                   tok.get_vocab_size(with_added_tokens=True), byte_ids)


def transformers_from_gguf(gguf_path):
    """transformers' own GGUF tokenizer conversion. Its GGUF package imports torch for tensor loading,
    which the tokenizer path never uses; torch is absent here, so the torch-only modules are given a
    stand-in while the pure-Python tokenizer code runs unchanged."""
    import types
    import transformers
    import transformers.integrations
    from transformers import AutoTokenizer

    class _Dummy:
        def __init__(self, *a, **k):
            pass

        def __call__(self, *a, **k):
            return a[0] if len(a) == 1 and callable(a[0]) and not k else _Dummy()

        def __getattr__(self, n):
            return _Dummy()

    class _TorchStub(types.ModuleType):
        def __getattr__(self, n):
            if n.startswith("__"):
                raise AttributeError(n)
            return _Dummy()

    pkgdir = os.path.join(os.path.dirname(transformers.integrations.__file__), "gguf")
    pkg = types.ModuleType("transformers.integrations.gguf")
    pkg.__path__ = [pkgdir]
    sys.modules["transformers.integrations.gguf"] = pkg
    sys.modules["torch"] = _TorchStub("torch")
    try:
        from transformers.integrations.gguf import gguf_config_mapping, gguf_tokenizer_mapping, reader
    finally:
        del sys.modules["torch"]
    for m in (reader, gguf_config_mapping, gguf_tokenizer_mapping):
        for k in dir(m):
            if not k.startswith("_"):
                setattr(pkg, k, getattr(m, k))
    import transformers.modeling_gguf_pytorch_utils as mg
    mg.is_torch_available = lambda: True
    return AutoTokenizer.from_pretrained(os.path.dirname(os.path.abspath(gguf_path)),
                                         gguf_file=os.path.basename(gguf_path))


def gguf_family(gguf_path):
    tok = transformers_from_gguf(gguf_path)
    d = os.path.join(DATA, "gguf")
    os.makedirs(d, exist_ok=True)
    write_expected(os.path.join(d, "expected.jsonl"),
                   lambda s, sp: tok(s, add_special_tokens=sp)["input_ids"],
                   lambda ids, skip: tok.decode(ids, skip_special_tokens=skip),
                   len(tok))


def gguf_llama_family():
    """A SentencePiece-style GGUF vocabulary (tokenizer.ggml.model = "llama", no merges: transformers
    derives them from the scores) built from the spm_bpe fixture, converted by transformers'
    GGUF converter. gguf_data.json holds the metadata the C++ test feeds to its own GGUF builder."""
    from transformers.integrations.ggml import convert_gguf_tokenizer
    src = json.load(open(os.path.join(DATA, "spm_bpe", "tokenizer.json"), encoding="utf-8"))
    by_id = sorted(src["model"]["vocab"].items(), key=lambda kv: kv[1])
    tokens = [t for t, _ in by_id]
    types = []
    for i, t in enumerate(tokens):
        types.append(2 if t == "<unk>" else 3 if t in ("<s>", "</s>") else
                     6 if (len(t) == 6 and t.startswith("<0x")) else 1)
    data = {"model": "llama", "tokens": tokens, "scores": [-float(i) for i in range(len(tokens))],
            "token_type": types, "unk_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}
    d = os.path.join(DATA, "gguf_llama")
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "gguf_data.json"), "w", encoding="utf-8") as f:
        json.dump(data, f, ensure_ascii=False)
    tokenizer_dict = {"tokenizer_type": "llama", "tokens": tokens, "scores": data["scores"], "token_type": types,
                      "bos_token_id": 1, "eos_token_id": 2, "unk_token_id": 0}
    tok, _ = convert_gguf_tokenizer("llama", tokenizer_dict)
    write_expected(os.path.join(d, "expected.jsonl"),
                   lambda s, sp: tok.encode(s, add_special_tokens=sp).ids,
                   lambda ids, skip: tok.decode(ids, skip_special_tokens=skip),
                   tok.get_vocab_size(with_added_tokens=True),
                   [i for i, t in enumerate(types) if t == 6])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gguf", help="the default model's .gguf file (family 'gguf')")
    ap.add_argument("--only", help="comma-separated families to rebuild")
    args = ap.parse_args()
    only = set(args.only.split(",")) if args.only else None
    for name, tok in families().items():
        if only and name not in only:
            continue
        hf_family(name, tok)
        print("wrote", name)
    if not only or "gguf_llama" in only:
        gguf_llama_family()
        print("wrote gguf_llama")
    if args.gguf and (not only or "gguf" in only):
        gguf_family(args.gguf)
        print("wrote gguf")


if __name__ == "__main__":
    main()
