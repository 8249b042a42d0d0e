"""Fast decode steps: the model's layer run on packed weights (step.py), three ways.

    from minillm.decode import PackedDecoder, CompiledDecoder, GraphDecoder
    PackedDecoder(model).step(ids, cache)      # op by op, any batch (packed.py)
    CompiledDecoder(model).step(ids, cache)    # batch 1, torch.compile'd (compiled.py)
    GraphDecoder(model).generate(prompt, n)    # batch 1, one CUDA graph per step (graph.py)
"""
from .compiled import CompiledDecoder
from .graph import GraphDecoder
from .packed import PackedDecoder, generate_packed, onednn_available
from .step import Step

__all__ = ["Step", "PackedDecoder", "generate_packed", "onednn_available", "CompiledDecoder",
           "GraphDecoder"]
