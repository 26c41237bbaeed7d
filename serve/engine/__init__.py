"""Embedded DSpark serving engine (PyTorch + transformers), for where vLLM or a GPU is absent.

Same algorithm as vLLM's `dspark` speculator: prefill captures the target layers, each round
runs one batched draft backbone pass, the sequential Markov loop, and one target verify forward.
"""

from serve.engine.engine import Engine
from serve.engine.options import EngineOptions, OptionsError
from serve.engine.request import RequestOutput, SamplingParams
from serve.engine.stats import EngineStats, SpecDecodeStats

__all__ = [
    "Engine",
    "EngineOptions",
    "EngineStats",
    "OptionsError",
    "RequestOutput",
    "SamplingParams",
    "SpecDecodeStats",
]
