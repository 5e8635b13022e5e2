"""``memory="flash"``: models whose weights need not fit in memory ("LLM in a flash"). What
stays resident within the budget (``plan``), where each FFN lies in the file (``layout``), the
parallel reads overlapped with compute (``reader``), the blocks that stream their FFN
(``loader``), the activation-sparsity predictor of ReLU models (``sparsity``), the cost model
(``cost``) and a page-cache-counting memory limit for its benchmarks and tests (``cgroup``)."""
