"""Character-level tokenizer, small Qwen2 policies built locally, and policy loading.

Nothing here touches the network: the tokenizer is assembled with the
``tokenizers`` library and the models are ``Qwen2ForCausalLM`` instances built
from a local ``Qwen2Config``.  :data:`EMBEDDED_MODEL_DIR` is the cold-start
checkpoint shipped inside the package (see ``grpo/sft.py``).
"""

from __future__ import annotations

import json
import string
from pathlib import Path

import torch
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    GenerationConfig,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen2ForCausalLM,
)

#: Directory of the embedded cold-start checkpoint (model + tokenizer).
EMBEDDED_MODEL_DIR = Path(__file__).resolve().parent / "assets" / "arithmetic-sft"

PAD_TOKEN = "<|pad|>"
EOS_TOKEN = "<|endoftext|>"
UNK_TOKEN = "<|unk|>"
SPECIAL_TOKENS = (PAD_TOKEN, EOS_TOKEN, UNK_TOKEN)
TAG_TOKENS = ("<think>", "</think>", "<answer>", "</answer>")
#: Single characters in the vocabulary (order fixes the token ids).
CHARACTERS = string.digits + "+-*/=,.:;!?()'\"" + " \n" + string.ascii_lowercase

#: Architecture presets for :func:`build_model`.
MODEL_SIZES: dict[str, dict] = {
    # The embedded policy: ~0.8M parameters, fast enough for RL on 2 CPU cores.
    "small": dict(hidden_size=128, intermediate_size=384, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2),
    # A toy model for tests (< 100k parameters).
    "micro": dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1),
}
MAX_POSITIONS = 128
GENERIC_TOKENIZER_CLASSES = ("TokenizersBackend", "PreTrainedTokenizerFast")


def build_tokenizer(model_max_length: int = MAX_POSITIONS) -> PreTrainedTokenizerFast:
    """Character-level fast tokenizer with single-token reasoning tags.

    Every character of :data:`CHARACTERS` is one token; ``<think>``,
    ``</think>``, ``<answer>``, ``</answer>`` are added (non-special) tokens, so
    they survive ``decode(..., skip_special_tokens=True)``.  Special tokens are
    ``<|pad|>`` (pad), ``<|endoftext|>`` (eos) and ``<|unk|>`` (unknown
    characters).  Decoding concatenates tokens, so ``decode(encode(s)) == s``
    for any string over the vocabulary.  Padding is on the left.
    """
    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
    for ch in CHARACTERS:
        vocab[ch] = len(vocab)
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK_TOKEN))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    backend.decoder = decoders.Fuse()
    backend.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    backend.add_tokens([AddedToken(t, special=False, normalized=False) for t in TAG_TOKENS])
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token=PAD_TOKEN,
        eos_token=EOS_TOKEN,
        unk_token=UNK_TOKEN,
        padding_side="left",
        model_max_length=model_max_length,
        clean_up_tokenization_spaces=False,
    )


def build_model(tokenizer, size: str = "small", seed: int = 0) -> Qwen2ForCausalLM:
    """A freshly initialised ``Qwen2ForCausalLM`` sized by ``size`` ("small" or "micro").

    Initialisation is deterministic given ``seed``.  Embeddings are tied to
    the output head; pad/eos ids come from ``tokenizer``.
    """
    if size not in MODEL_SIZES:
        raise ValueError(f"unknown model size {size!r}; choose from {sorted(MODEL_SIZES)}")
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        max_position_embeddings=MAX_POSITIONS,
        tie_word_embeddings=True,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
        **MODEL_SIZES[size],
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config)
    model.generation_config = GenerationConfig(
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
        do_sample=False,
    )
    return model


def count_parameters(model: torch.nn.Module) -> int:
    """Number of distinct parameters (tied weights counted once)."""
    return sum(p.numel() for p in model.parameters())


def load_tokenizer(path, trust_remote_code: bool = False):
    """Load a saved tokenizer, left-padded, with pad falling back to eos.

    ``AutoTokenizer`` in transformers 5 maps ``model_type="qwen2"`` to
    ``Qwen2Tokenizer``, which rebuilds a byte-level BPE pipeline and ignores our
    character-level ``tokenizer.json``.  When ``tokenizer_config.json`` names
    the generic backend we therefore load ``tokenizer.json`` verbatim.
    """
    directory = Path(path)
    config_file = directory / "tokenizer_config.json"
    declared = json.loads(config_file.read_text()).get("tokenizer_class") if config_file.is_file() else None
    if declared in GENERIC_TOKENIZER_CLASSES and (directory / "tokenizer.json").is_file():
        tokenizer = PreTrainedTokenizerFast.from_pretrained(str(directory))
    else:
        tokenizer = AutoTokenizer.from_pretrained(str(directory), trust_remote_code=trust_remote_code)
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_policy(path, dtype: str = "float32", trust_remote_code: bool = False):
    """Load ``(model, tokenizer)`` saved with ``save_pretrained`` from a local directory.

    The tokenizer pads on the left; a tokenizer without a pad token falls back
    to its eos token.  Raises ``FileNotFoundError`` if ``path`` is not a directory.
    """
    directory = Path(path)
    if not directory.is_dir():
        raise FileNotFoundError(f"policy directory not found: {directory}")
    torch_dtype = getattr(torch, dtype) if isinstance(dtype, str) else dtype
    tokenizer = load_tokenizer(directory, trust_remote_code=trust_remote_code)
    model = AutoModelForCausalLM.from_pretrained(str(directory), dtype=torch_dtype, trust_remote_code=trust_remote_code)
    if model.config.pad_token_id is None:
        model.config.pad_token_id = tokenizer.pad_token_id
    if model.generation_config.pad_token_id is None:
        model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.eval()
    return model, tokenizer
