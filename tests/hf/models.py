"""Tiny random-initialised models of every family kvdepot.hf supports,
built from their configs (no downloads) with a fixed seed, so two
processes build byte-identical models."""

import torch

FAMILIES = ("llama", "qwen2", "qwen3", "mistral", "gemma", "gemma2")

_COMMON = dict(vocab_size=256, hidden_size=64, intermediate_size=128,
               num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2, head_dim=16,
               max_position_embeddings=1024, initializer_range=0.2)


def build(family, seed=0, **over):
    import transformers as tf
    kw = dict(_COMMON, **over)
    if family == "llama":
        cfg, cls = tf.LlamaConfig(**kw), tf.LlamaForCausalLM
    elif family == "qwen2":
        cfg, cls = tf.Qwen2Config(**kw), tf.Qwen2ForCausalLM
    elif family == "qwen3":
        cfg, cls = tf.Qwen3Config(**kw), tf.Qwen3ForCausalLM
    elif family == "mistral":
        kw.setdefault("sliding_window", None)
        cfg, cls = tf.MistralConfig(**kw), tf.MistralForCausalLM
    elif family == "gemma":
        cfg, cls = tf.GemmaConfig(**kw), tf.GemmaForCausalLM
    elif family == "gemma2":
        kw.setdefault("sliding_window", 512)
        cfg, cls = tf.Gemma2Config(**kw), tf.Gemma2ForCausalLM
    elif family == "gpt2":
        cfg = tf.GPT2Config(vocab_size=256, n_embd=64, n_layer=2, n_head=4)
        cls = tf.GPT2LMHeadModel
    else:
        raise ValueError(family)
    torch.manual_seed(seed)
    return cls(cfg).to(torch.bfloat16).eval()


def prompt(n, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (1, n), generator=g)
