import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM


def tiny_qwen2(vocab_size: int = 32, seed: int = 0) -> Qwen2ForCausalLM:
    """A ~20k-parameter Qwen2 built from a config (nothing downloaded)."""
    torch.manual_seed(seed)
    cfg = Qwen2Config(vocab_size=vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, intermediate_size=64, max_position_embeddings=128,
                      pad_token_id=0, eos_token_id=1, bos_token_id=None)
    return Qwen2ForCausalLM(cfg).eval()


@pytest.fixture
def tiny_model():
    return tiny_qwen2()
