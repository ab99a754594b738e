"""llmplan: a parallelism planner for large language models.

Layers (imports flow downwards): cli -> report -> cost -> specs. See DESIGN.md.
"""

__version__ = "0.1.0"
