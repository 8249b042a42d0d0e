"""Attention variants that shrink the KV cache (lab 03), as drop-in layers for `Transformer`.

Each file teaches one idea and converts a trained multi-head model into that variant; the result
runs with the same model class, `KVCache`, generation loops and perplexity evaluation:

    gqa.py      grouped-query / multi-query attention: fewer K/V heads    (to_gqa)
    mla.py      multi-head latent attention: cache a low-rank latent       (to_mla, MLAAttention)
    cla.py      cross-layer attention: adjacent layers share K/V           (to_cla)
    sliding.py  local sliding-window layers with a few global ones        (to_sliding)
    survey.py   cache bytes per token vs held-out perplexity for all of them (survey)

Every conversion returns a new model and leaves its input untouched.
"""
from .cla import CrossLayerAttention, KVProducerAttention, SharedKV, to_cla
from .gqa import mean_pool_kv_heads, to_gqa
from .mla import MLAAttention, mla_weights_from_mha, rope_last_permutation, to_mla
from .sliding import cache_bytes_vs_length, to_sliding
from .survey import default_variants, survey

__all__ = ["to_gqa", "mean_pool_kv_heads", "MLAAttention", "to_mla", "mla_weights_from_mha",
           "rope_last_permutation", "to_cla", "CrossLayerAttention", "KVProducerAttention",
           "SharedKV", "to_sliding", "cache_bytes_vs_length", "survey", "default_variants"]
