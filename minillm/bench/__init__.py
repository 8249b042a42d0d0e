"""Measuring the library: every `minillm bench` harness, the timers they use, and the labs'
measurements. The algorithms live elsewhere in minillm and hold no benchmark code.

    timing.py        time_interleaved / cpu_time_interleaved, medians, ratios, WorkCounter
    gpu_timer.py     CUDA-event timing with the L2 flushed; the device copy's bandwidth
    bandwidth.py     bytes a decode step reads, the measured read bandwidth, the limit
    decode.py        `minillm bench decode`: naive, cached, packed and compiled decode
    quant.py         `minillm bench quant`: decode in fp32, bf16, int8 and int4
    speculative.py   `minillm bench speculative`: speculative decoding and prompt lookup
    batching.py      `minillm bench batching`: a trace replayed through static and continuous
    load_gen.py      `minillm bench serve`: open-loop Poisson load over HTTP
    phase_costs.py   prefill and decode cost against prompt, context and batch (lab 02)
    decode_memory.py decode memory and time against the context (lab 09)
    chunk_model.py   the chunked form's time against its chunk length, a fitted model (lab 09)
    tp.py            `minillm bench tp`: the all-reduce, the split step and the crossover (lab 11);
                     tp_report.py puts its figures in words
    commands.py      the `minillm bench ...` commands: run a harness above, print its figures
"""
