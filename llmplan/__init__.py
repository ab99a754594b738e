"""llmplan: a parallelism planner for large language models.

Layers (imports flow downwards): cli -> report -> search/export -> cost/topology -> specs (README.md, Layout).
"""

__version__ = "0.1.0"
