"""Micro-benchmarks that check llmplan's predictions on real hardware. The only package that imports torch."""
