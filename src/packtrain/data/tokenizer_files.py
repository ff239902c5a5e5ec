"""Which files make a tokenizer, its identity hash, and copying it verbatim.

A model can only read ids made by its own tokenizer, so the token store records which tokenizer produced it
(meta.json `tokenizer_hash`) and the train stage compares that with the hash of the tokenizer shipped in the
model's directory (`model.init_from`). The hash is over what decides the ids, so the same tokenizer hashes the
same after a round trip through MLflow (whose transformers flavor rewrites tokenizer_config.json, adding
`is_local` / `local_files_only`):

    tokenizer_hash(dir) = "sha256:" + sha256 over, for each file below that exists, in this order,
        name + "\\0" + content + "\\0"
      content of the vocabulary files (the bytes as they are):
        tokenizer.json, tokenizer.model, spiece.model, vocab.json, merges.txt, vocab.txt, added_tokens.json
      content of tokenizer_config.json and special_tokens_map.json: canonical JSON (sorted keys, no spaces)
        of only the keys that change ids — bos/eos/pad/unk tokens, add_bos_token, add_eos_token,
        added_tokens_decoder, additional_special_tokens, tokenizer_class

    >>> # a trained BPE saved twice, or a tokenizer before and after MLflow logging: the same hash
    >>> # one merge more, another special token, add_bos_token flipped: a different hash

Chat templates, model_max_length and cleanup flags do not change ids and are left out.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

VOCAB_FILES = ("tokenizer.json", "tokenizer.model", "spiece.model", "vocab.json", "merges.txt", "vocab.txt",
               "added_tokens.json")
CONFIG_FILES = ("tokenizer_config.json", "special_tokens_map.json")
EXTRA_FILES = ("chat_template.jinja", "chat_template.json")
TOKENIZER_FILES = VOCAB_FILES + CONFIG_FILES + EXTRA_FILES
"""Every file a tokenizer directory may need (what `copy_tokenizer` copies)."""
ID_KEYS = ("bos_token", "eos_token", "pad_token", "unk_token", "add_bos_token", "add_eos_token",
           "added_tokens_decoder", "additional_special_tokens", "tokenizer_class")


def has_tokenizer(path: str | Path) -> bool:
    """The directory ships a tokenizer AutoTokenizer can load (a vocabulary file, not only a config)."""
    p = Path(path)
    return p.is_dir() and any((p / f).is_file() for f in VOCAB_FILES)


def _canonical_config(path: Path) -> bytes:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return path.read_bytes()   # unreadable JSON: its bytes (the loader will complain by name)
    if not isinstance(data, dict):
        return path.read_bytes()
    keep = {k: data[k] for k in ID_KEYS if k in data}
    return json.dumps(keep, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def tokenizer_hash(path: str | Path) -> str | None:
    """'sha256:<hex>' of the tokenizer in `path` (module doc), None when there is none."""
    p = Path(path)
    if not has_tokenizer(p):
        return None
    h = hashlib.sha256()
    for name in VOCAB_FILES + CONFIG_FILES:
        f = p / name
        if not f.is_file():
            continue
        h.update(name.encode() + b"\0")
        if name in CONFIG_FILES:
            h.update(_canonical_config(f))
        else:
            with open(f, "rb") as fh:
                while chunk := fh.read(1 << 20):
                    h.update(chunk)
        h.update(b"\0")
    return "sha256:" + h.hexdigest()


def copy_tokenizer(src: str | Path, dst: str | Path) -> list[str]:
    """Copy the tokenizer files of `src` into `dst` byte for byte (so the copy hashes like the source);
    returns the names copied."""
    src, dst = Path(src), Path(dst)
    dst.mkdir(parents=True, exist_ok=True)
    copied = []
    for name in TOKENIZER_FILES:
        if (src / name).is_file():
            shutil.copyfile(src / name, dst / name)
            copied.append(name)
    return copied
