"""Character-level tokenizer, small Qwen2 policies built locally, loading any local causal LM.

Nothing here touches the network: the tokenizer is assembled with the
``tokenizers`` library, the built models are ``Qwen2ForCausalLM`` instances
from a local ``Qwen2Config``, and :func:`load_policy` reads a local directory.
:data:`EMBEDDED_MODEL_DIR` is the cold-start checkpoint shipped inside the
package (see ``grpo/training/sft.py``).
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
EMBEDDED_MODEL_DIR = Path(__file__).resolve().parents[1] / "assets" / "arithmetic-sft"
#: The cold-start policy of the calculator (tool-use) task: `grpo demo --task calculator` (docs/agents.md).
CALCULATOR_MODEL_DIR = Path(__file__).resolve().parents[1] / "assets" / "calculator-sft"

PAD_TOKEN = "<|pad|>"
EOS_TOKEN = "<|endoftext|>"
UNK_TOKEN = "<|unk|>"
SPECIAL_TOKENS = (PAD_TOKEN, EOS_TOKEN, UNK_TOKEN)
TAG_TOKENS = ("<think>", "</think>", "<answer>", "</answer>")
#: Extra single tokens of the tool-use tokenizer (the calculator task, docs/agents.md).
TOOL_TAG_TOKENS = ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>")
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


def build_tokenizer(model_max_length: int = MAX_POSITIONS, extra_tags: tuple[str, ...] = ()) -> PreTrainedTokenizerFast:
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
    backend.add_tokens([AddedToken(t, special=False, normalized=False) for t in TAG_TOKENS + tuple(extra_tags)])
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


#: torch dtypes accepted by :func:`load_policy` (``model.dtype`` in the config).
DTYPES: dict[str, torch.dtype] = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
#: Files of which at least one marks a directory as holding a saved tokenizer.
TOKENIZER_FILES = ("tokenizer_config.json", "tokenizer.json", "tokenizer.model", "vocab.json", "vocab.txt")


def resolve_dtype(dtype: str | torch.dtype) -> torch.dtype:
    """``"float32" | "bfloat16" | "float16"`` (or the torch dtype itself) -> ``torch.dtype``."""
    if isinstance(dtype, torch.dtype) and dtype in DTYPES.values():
        return dtype
    if isinstance(dtype, str) and dtype in DTYPES:
        return DTYPES[dtype]
    raise ValueError(f"unsupported dtype {dtype!r}: use {' | '.join(DTYPES)}")


def check_model_dir(path, what: str = "model") -> Path:
    """The absolute path of a local Hugging Face model directory (one holding ``config.json``).

    Raises ``FileNotFoundError`` with a one-line message naming ``path`` otherwise.  The path is
    made absolute so that ``model.name_or_path`` (and hence a LoRA adapter's
    ``base_model_name_or_path``) stays valid from any working directory.
    """
    directory = Path(path).expanduser()
    if not directory.is_dir():
        raise FileNotFoundError(f"{what} directory not found: {directory}")
    if not (directory / "config.json").is_file():
        raise FileNotFoundError(f"not a Hugging Face model directory (no config.json): {directory}")
    return directory.resolve()


def load_tokenizer(path, trust_remote_code: bool = False):
    """Load a saved tokenizer, left-padded, with pad falling back to eos.

    ``AutoTokenizer`` in transformers 5 maps ``model_type="qwen2"`` to
    ``Qwen2Tokenizer``, which rebuilds a byte-level BPE pipeline and ignores our
    character-level ``tokenizer.json``.  When ``tokenizer_config.json`` names
    the generic backend we therefore load ``tokenizer.json`` verbatim.  A
    directory without tokenizer files is an error (``AutoTokenizer`` would
    silently return an empty tokenizer).
    """
    directory = Path(path)
    if not any((directory / name).is_file() for name in TOKENIZER_FILES):
        raise FileNotFoundError(f"no tokenizer files ({', '.join(TOKENIZER_FILES)}) in {directory}")
    config_file = directory / "tokenizer_config.json"
    declared = json.loads(config_file.read_text()).get("tokenizer_class") if config_file.is_file() else None
    if declared in GENERIC_TOKENIZER_CLASSES and (directory / "tokenizer.json").is_file():
        tokenizer = PreTrainedTokenizerFast.from_pretrained(str(directory))
    else:
        tokenizer = AutoTokenizer.from_pretrained(str(directory), trust_remote_code=trust_remote_code)
    return prepare_tokenizer(tokenizer, str(directory))


def prepare_tokenizer(tokenizer, where: str = "the tokenizer"):
    """Left padding, and a missing pad token falling back to eos (ValueError naming `where` without either)."""
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        if tokenizer.eos_token is None:
            raise ValueError(f"the tokenizer in {where} has neither a pad nor an eos token")
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def align_special_tokens(model, tokenizer) -> None:
    """Fill a missing pad/eos id of the model config and generation config from ``tokenizer``.

    With the pad -> eos fallback of :func:`load_tokenizer` this makes ``generate`` and
    sequence-classification heads see the same pad id as the tokenizer.
    """
    for config in (model.config, model.generation_config):
        if config is None:
            continue
        if getattr(config, "pad_token_id", None) is None:
            config.pad_token_id = tokenizer.pad_token_id
        if getattr(config, "eos_token_id", None) is None:
            config.eos_token_id = tokenizer.eos_token_id


def load_policy(path, dtype: str | torch.dtype = "float32", trust_remote_code: bool = False,
                attn_implementation: str | None = None):
    """Load ``(model, tokenizer)`` of any local ``AutoModelForCausalLM`` directory, in eval mode.

    ``dtype`` is float32 | bfloat16 | float16; ``attn_implementation`` (None = the library's default)
    is passed to ``from_pretrained``.  Custom modelling code runs only with
    ``trust_remote_code=True``.  The tokenizer pads on the left; a missing pad token falls back
    to eos (tokenizer, model config and generation config).  ``model.name_or_path`` is the
    absolute directory, which :func:`grpo.modeling.lora.apply_lora` records as the adapter's base model.
    Errors (missing directory, no ``config.json``, no tokenizer, no weights) are one line that
    names the path.
    """
    torch_dtype = resolve_dtype(dtype)
    directory = check_model_dir(path, "policy")
    tokenizer = load_tokenizer(directory, trust_remote_code=trust_remote_code)
    try:
        extra = {"attn_implementation": attn_implementation} if attn_implementation else {}
        model = AutoModelForCausalLM.from_pretrained(str(directory), dtype=torch_dtype,
                                                     trust_remote_code=trust_remote_code, **extra)
    except (OSError, ValueError, KeyError) as e:  # transformers' messages can span lines
        first_line = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        if "custom code" in first_line and not trust_remote_code:
            first_line = "it ships custom modelling code; set model.trust_remote_code: true to run it"
        raise ValueError(f"cannot load a causal LM from {directory}: {first_line}") from e
    align_special_tokens(model, tokenizer)
    model.eval()
    return model, tokenizer


def model_device(model: torch.nn.Module) -> torch.device:
    """The device of the model's first parameter (cpu for a model without parameters)."""
    param = next(model.parameters(), None)
    return param.device if param is not None else torch.device("cpu")


def disable_dropout(model: torch.nn.Module) -> int:
    """Every dropout of the model set to 0 (TRL's ``disable_dropout``, on by default there): nn.Dropout modules
    and the float ``attention_dropout`` of Hugging Face attention layers. LoRA's own dropout (peft's
    ``lora_dropout`` modules: ``lora.dropout``, set explicitly) is kept. Returns how many were non-zero."""
    changed = 0
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Dropout) and ".lora_dropout." not in f".{name}." and module.p > 0:
            module.p, changed = 0.0, changed + 1
        rate = getattr(module, "attention_dropout", None)
        if isinstance(rate, float) and rate > 0:
            module.attention_dropout, changed = 0.0, changed + 1
    return changed
