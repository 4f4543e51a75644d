"""A copy of the tiny golden Llama (vocab 256) with a byte-level tokenizer: token id i is byte i.

The golden checkpoint has no tokenizer; giving it one whose vocabulary is exactly the 256 bytes lets
the server produce text (including invalid UTF-8 runs that the streaming detokenizer must hold back)
from a model that runs a step in well under a millisecond, which the load tests need.
"""
import json
import os
import shutil


def bytes_to_unicode():
    """GPT-2's reversible byte -> printable character map (the ByteLevel alphabet)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, (chr(c) for c in cs)))


def make_byte_model(src_dir, dst_dir, chat_template=None, special_tokens=None, tokenizer_config=None):
    """Copies a checkpoint and gives it a byte-level tokenizer.

    special_tokens: {id: text} of added special tokens that take those ids (their bytes leave the
    vocabulary, so no id has two meanings, and no text encodes them); chat_template and tokenizer_config (extra keys such as
    bos_token) go into tokenizer_config.json. Without a template, a minimal one is written.
    """
    os.makedirs(dst_dir, exist_ok=True)
    for name in ("config.json", "model.safetensors"):
        shutil.copyfile(os.path.join(src_dir, name), os.path.join(dst_dir, name))
    special_tokens = special_tokens or {}
    vocab = {ch: b for b, ch in bytes_to_unicode().items() if b not in special_tokens}
    # The special tokens are in the BPE vocabulary as well, at their ids: HF tokenizers gives an
    # added token the model's id for the same text, else the next id past the vocabulary.
    vocab.update({text: i for i, text in special_tokens.items()})
    added = [{"id": i, "content": text, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": True} for i, text in sorted(special_tokens.items())]
    tok = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
                  "ignore_merges": False, "vocab": vocab, "merges": []},
    }
    with open(os.path.join(dst_dir, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(tok, f, ensure_ascii=False)
    if chat_template is None:
        # A minimal chat template, so chat requests run on this model too.
        chat_template = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] or '' }}\n{% endfor %}"
                         "{% if add_generation_prompt %}assistant: {% endif %}")
    config = dict(tokenizer_config or {}, chat_template=chat_template)
    with open(os.path.join(dst_dir, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f, ensure_ascii=False)
    return dst_dir
