"""Running a model, whatever file it came from: the Model (embedding -> blocks -> final norm ->
last-token lm head), the decoder blocks and their KV caches (``layers``, ``kv_cache``; ``step.decode_step``
is the compiled step's Python side), hybrids' recurrent layers (``delta_net``, ``short_conv``),
routed experts (``moe``), the embedding in memory or on
disk, the tokenizer with its chat template, and the next token's choice (``generation``)."""
