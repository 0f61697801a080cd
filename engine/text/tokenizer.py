"""Tokenizers: a `tokenizers` backend built from an artifact's `tokenizer.json`, a GGUF vocabulary,
or a tiktoken rank file, behind one small interface (`encode`, `decode`, `detokenizer`).

Special tokens written in the text (`<|im_start|>`) are matched whole, as chat templates need.
"""
from __future__ import annotations

import json
from pathlib import Path

from engine.errors import NinferError

# `tokenizer.ggml.pre` -> split regex, for GGUF vocabularies that are not plain GPT-2 byte-level.
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
QWEN35_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_SPLITS = {"qwen2": _QWEN2_SPLIT, "qwen35": QWEN35_SPLIT, "llama-bpe": _LLAMA3_SPLIT, "llama3": _LLAMA3_SPLIT}
# llama.cpp gives these pre-tokenizer types the GPT-2 regex after splitting every digit on its own.
_DIGIT_SPLIT_PRE = {"smollm", "starcoder", "refact", "codeshell", "exaone", "minerva"}

_STOP_NAMES = ("<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|end_of_text|>")


class Tokenizer:
    """A BPE tokenizer with its special tokens, stop ids and (optional) chat template."""

    def __init__(self, backend, *, bos_token: str | None = None, eos_token: str | None = None,
                 add_bos: bool = False, chat_template: str | None = None):
        self.backend = backend
        self.bos_token = bos_token
        self.eos_token = eos_token
        self.add_bos = add_bos
        self.chat_template = chat_template
        self.bos_token_id = self.token_to_id(bos_token) if bos_token else None
        self.eos_token_id = self.token_to_id(eos_token) if eos_token else None
        stops = [self.eos_token_id] + [self.token_to_id(n) for n in _STOP_NAMES]
        self.eos_token_ids: tuple[int, ...] = tuple(dict.fromkeys(i for i in stops if i is not None))
        self.special_ids = frozenset(i for i, t in backend.get_added_tokens_decoder().items() if t.special)

    @property
    def vocab_size(self) -> int:
        """Number of ids, added tokens included."""
        return self.backend.get_vocab_size(with_added_tokens=True)

    def token_to_id(self, token: str) -> int | None:
        """The id of one token string, or None."""
        return self.backend.token_to_id(token)

    def id_to_token(self, token_id: int) -> str | None:
        """The raw token string (byte-level spelling) of an id."""
        return self.backend.id_to_token(token_id)

    def encode(self, text: str, add_special: bool = False) -> list[int]:
        """Token ids of `text`; a BOS is prepended only when `add_special` and the model wants one."""
        ids = self.backend.encode(text, add_special_tokens=False).ids
        if add_special and self.add_bos and self.bos_token_id is not None:
            ids = [self.bos_token_id, *ids]
        return ids

    def decode(self, ids, skip_special: bool = False) -> str:
        """Text of `ids` (invalid UTF-8 becomes U+FFFD)."""
        return self.backend.decode(list(ids), skip_special_tokens=skip_special)

    def token_bytes(self, token_id: int) -> bytes:
        """The exact bytes one token stands for (special tokens: their UTF-8 text)."""
        piece = self.backend.id_to_token(token_id)
        if piece is None:
            return b""
        if token_id in self.special_ids or not _is_byte_level(piece):
            return piece.encode("utf-8")
        table = _unicode_to_byte()
        return bytes(table[c] for c in piece)

    def detokenizer(self):
        """A fresh byte-safe streaming detokenizer (`.add(id) -> str`, `.flush() -> str`)."""
        from engine.text.detokenize import Detokenizer

        return Detokenizer(self)

    # ---- constructors -------------------------------------------------------------------------

    @classmethod
    def from_json(cls, tokenizer_json: str, config: dict | None = None,
                  chat_template: str | None = None) -> "Tokenizer":
        """From the text of a `tokenizer.json` and an optional HF `tokenizer_config.json` dict."""
        from tokenizers import Tokenizer as Backend

        config = config or {}
        backend = Backend.from_str(tokenizer_json)
        return cls(backend, bos_token=_token_name(config.get("bos_token")),
                   eos_token=_token_name(config.get("eos_token")),
                   add_bos=bool(config.get("add_bos_token", False)),
                   chat_template=chat_template or config.get("chat_template"))

    @classmethod
    def from_file(cls, path: str | Path, config_path: str | Path | None = None) -> "Tokenizer":
        """From a `tokenizer.json` on disk (and its `tokenizer_config.json` when given or beside it)."""
        path = Path(path)
        if config_path is None and (path.parent / "tokenizer_config.json").exists():
            config_path = path.parent / "tokenizer_config.json"
        config = json.loads(Path(config_path).read_text("utf-8")) if config_path else {}
        return cls.from_json(path.read_text("utf-8"), config)

    @classmethod
    def from_artifact(cls, artifact) -> "Tokenizer":
        """From an opened `.ninfer` artifact's text resources."""
        try:
            tj = artifact.resource("tokenizer.json").decode("utf-8")
        except Exception as exc:  # noqa: BLE001 - any lookup failure means the same thing here
            raise NinferError(f"{artifact.path} has no tokenizer.json resource",
                              "re-convert the model with `ninfer convert`") from exc
        config = _optional_json(artifact, "tokenizer_config.json")
        template = _optional_text(artifact, "chat_template.jinja")
        return cls.from_json(tj, config, chat_template=template)

    @classmethod
    def from_gguf(cls, path_or_reader) -> "Tokenizer":
        """From the vocabulary and merges stored in a GGUF file."""
        import gguf

        reader = gguf.GGUFReader(str(path_or_reader)) if isinstance(path_or_reader, (str, Path)) else path_or_reader
        config = tokenizer_config_from_gguf(reader)
        return cls.from_json(tokenizer_json_from_gguf(reader), config)


def _token_name(value) -> str | None:
    if isinstance(value, dict):
        return value.get("content")
    return value


def _optional_json(artifact, role):
    text = _optional_text(artifact, role)
    return json.loads(text) if text else {}


def _optional_text(artifact, role):
    try:
        return artifact.resource(role).decode("utf-8")
    except Exception:  # noqa: BLE001 - an absent optional resource
        return None


_BYTE_TABLE: dict[str, int] | None = None


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character table used by byte-level BPE."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    chars = list(keep)
    extra = 0
    for b in range(256):
        if b not in keep:
            keep.append(b)
            chars.append(256 + extra)
            extra += 1
    return {b: chr(c) for b, c in zip(keep, chars)}


def _unicode_to_byte() -> dict[str, int]:
    global _BYTE_TABLE
    if _BYTE_TABLE is None:
        _BYTE_TABLE = {c: b for b, c in bytes_to_unicode().items()}
    return _BYTE_TABLE


def _is_byte_level(piece: str) -> bool:
    table = _unicode_to_byte()
    return all(c in table for c in piece)


def _field(reader, key, default=None):
    field = reader.fields.get(key)
    return default if field is None else field.contents()


def tokenizer_config_from_gguf(reader) -> dict:
    """HF-style `tokenizer_config.json` fields (bos/eos/pad names, add_bos_token, chat_template)."""
    tokens = _field(reader, "tokenizer.ggml.tokens")
    config: dict = {"add_bos_token": bool(_field(reader, "tokenizer.ggml.add_bos_token", False))}
    for name, key in (("bos_token", "bos_token_id"), ("eos_token", "eos_token_id"),
                      ("pad_token", "padding_token_id"), ("unk_token", "unknown_token_id")):
        token_id = _field(reader, f"tokenizer.ggml.{key}")
        config[name] = tokens[int(token_id)] if token_id is not None else None
    template = _field(reader, "tokenizer.chat_template")
    if template:
        config["chat_template"] = template
    return config


def tokenizer_json_from_gguf(reader) -> str:
    """A `tokenizer.json` (text) for a GGUF byte-level BPE vocabulary (`tokenizer.ggml.model == gpt2`)."""
    model = _field(reader, "tokenizer.ggml.model")
    if model != "gpt2":
        raise NinferError(f"GGUF tokenizer type {model!r} is not supported (only byte-level BPE)",
                          "use a model with a gpt2-style vocabulary")
    tokens = _field(reader, "tokenizer.ggml.tokens")
    types = _field(reader, "tokenizer.ggml.token_type") or [1] * len(tokens)
    merges = [tuple(m.split(" ", 1)) for m in _field(reader, "tokenizer.ggml.merges")]
    pre = _field(reader, "tokenizer.ggml.pre", "default")
    specials = [(i, t, ty == 3) for i, (t, ty) in enumerate(zip(tokens, types)) if ty in (3, 4)]
    return build_bpe_json({t: i for i, t in enumerate(tokens)}, merges, specials, pre)


def build_bpe_json(vocab: dict[str, int], merges: list[tuple[str, str]],
                   specials: list[tuple[int, str, bool]], pre: str, *, nfc: bool = False,
                   ignore_merges: bool = False) -> str:
    """Serialize a byte-level BPE tokenizer. `specials`: (id, text, is_special) added tokens."""
    from tokenizers import AddedToken, Regex, decoders, normalizers, pre_tokenizers
    from tokenizers import Tokenizer as Backend
    from tokenizers.models import BPE

    backend = Backend(BPE(vocab=vocab, merges=merges, ignore_merges=ignore_merges))
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    if pre in _SPLITS:
        backend.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Split(Regex(_SPLITS[pre]), behavior="isolated"), byte_level])
    elif pre in _DIGIT_SPLIT_PRE:
        backend.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Digits(individual_digits=True),
             pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    else:
        backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if nfc:
        backend.normalizer = normalizers.NFC()
    backend.decoder = decoders.ByteLevel()
    ordered = sorted(specials)
    for _, text, special in ordered:  # one at a time: ids are handed out in call order
        token = AddedToken(text, special=special, normalized=False)
        (backend.add_special_tokens if special else backend.add_tokens)([token])
    for token_id, text, _ in ordered:
        if backend.token_to_id(text) != token_id:
            raise NinferError(f"added token {text!r} did not keep id {token_id}", "report this model file")
    return backend.to_str()


def tiktoken_to_tokenizer_json(ranks: dict[bytes, int], special_tokens,
                               split_regex: str = QWEN35_SPLIT) -> str:
    """A `tokenizer.json` equivalent to a tiktoken encoding (Qwen's `.tiktoken` rank files).

    tiktoken repeatedly merges the adjacent pair whose concatenation has the lowest rank. A BPE whose merge
    for token t is the last pair tiktoken itself would join when encoding t's bytes, with t's rank as the
    merge priority, makes the same choices; `ignore_merges` adds tiktoken's whole-piece lookup, which also
    covers the few tokens no merge sequence reaches. `special_tokens`: {text: id} (all special) or
    [(id, text, is_special)].
    """
    spell = bytes_to_unicode()
    by_rank = sorted(ranks.items(), key=lambda kv: kv[1])
    merges: list[tuple[str, str]] = []
    for token, _rank in by_rank:
        if len(token) < 2:
            continue
        pair = _last_merge(token, ranks)
        if pair is not None:
            merges.append(("".join(spell[b] for b in pair[0]), "".join(spell[b] for b in pair[1])))
    vocab = {"".join(spell[b] for b in token): rank for token, rank in by_rank}
    if isinstance(special_tokens, dict):
        specials = [(i, t, True) for t, i in special_tokens.items()]
    else:
        specials = [(int(i), t, bool(s)) for i, t, s in special_tokens]
    _SPLITS["_tiktoken"] = split_regex
    try:
        return build_bpe_json(vocab, merges, specials, "_tiktoken", nfc=True, ignore_merges=True)
    finally:
        del _SPLITS["_tiktoken"]


def _last_merge(token: bytes, ranks: dict[bytes, int]) -> tuple[bytes, bytes] | None:
    """tiktoken's merge loop on `token`'s bytes, stopped before the final join: that pair, or None."""
    parts = [token[i:i + 1] for i in range(len(token))]
    while len(parts) > 2:
        best, best_rank = -1, None
        for i in range(len(parts) - 1):
            r = ranks.get(parts[i] + parts[i + 1])
            if r is not None and (best_rank is None or r < best_rank):
                best, best_rank = i, r
        if best < 0:
            return None
        parts[best:best + 2] = [parts[best] + parts[best + 1]]
    return (parts[0], parts[1]) if len(parts) == 2 and parts[0] + parts[1] == token else None
